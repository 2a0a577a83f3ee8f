/*
 * bind_source.h - the local address of a socket about to connect, for the
 * plugins that dial their peers from a chosen interface (tcp, and the
 * bootstrap of verbs and ibgda), each with its own copy.
 *
 * Why: bind() with port 0 picks a local port at once, and a port picked
 * that way is never shared, whatever the destination. A rank connects to
 * every other, so one host's ranks use (N - 1) ports each: at 256 ranks on
 * one host the 28 000 ports of the usual ephemeral range run out and
 * connect() fails with EADDRINUSE. With IP_BIND_ADDRESS_NO_PORT the port
 * is picked by connect(), which reuses a port towards other destinations.
 */
#ifndef MEP_PLUGINS_BIND_SOURCE_H
#define MEP_PLUGINS_BIND_SOURCE_H

#include <netinet/in.h>

/* Binds fd to addr's IP address; the port is chosen when fd connects.
 * 0, or -1 with errno as bind() sets it. */
int mep__bind_source(int fd, const struct sockaddr_in *addr);

#endif
