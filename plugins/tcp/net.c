/* net.c - the interface, the listening socket, waits (which serve
 * incoming connections through accept.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp.h"

/* The configured interface's IPv4 address; without one, the first
 * non-loopback interface that is up, else 127.0.0.1. */
static int pick_ip(tcp_ctx_t *ctx, struct in_addr *out) {
  const char *want = ctx->cfg.ifname[0] ? ctx->cfg.ifname : NULL;
  struct ifaddrs *all = NULL;
  if (getifaddrs(&all))
    return TCP_ERR(ctx, MEP_ERR_SYSTEM,
                   "tcp: listing network interfaces failed: %s",
                   strerror(errno));
  int found = 0;
  for (struct ifaddrs *i = all; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (want ? strcmp(i->ifa_name, want) != 0
             : !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    *out = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
    found = 1;
  }
  freeifaddrs(all);
  if (found) return 0;
  if (!want) {
    out->s_addr = htonl(INADDR_LOOPBACK);
    return 0;
  }
  if (if_nametoindex(want))
    return TCP_ERR(ctx, MEP_ERR_CONFIG,
                   "tcp: [tcp] ifname=%s: the interface has no IPv4 address",
                   want);
  return TCP_ERR(ctx, MEP_ERR_CONFIG,
                 "tcp: [tcp] ifname=%s: no such network interface", want);
}

static int bind_in_range(tcp_ctx_t *ctx, int fd, struct sockaddr_in *a) {
  if (!ctx->cfg.port_lo) {
    a->sin_port = 0;
    return bind(fd, (struct sockaddr *)a, sizeof *a);
  }
  for (int port = ctx->cfg.port_lo; port <= ctx->cfg.port_hi; port++) {
    a->sin_port = htons((uint16_t)port);
    if (!bind(fd, (struct sockaddr *)a, sizeof *a)) return 0;
    if (errno != EADDRINUSE) return -1;
  }
  errno = EADDRINUSE;
  return -1;
}

int mep__tcp_listen(tcp_ctx_t *ctx) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  int rc = pick_ip(ctx, &a.sin_addr);
  if (rc) return rc;
  char where[64];
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: socket() failed: %s",
                   strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind_in_range(ctx, fd, &a)) {
    int e = errno;
    a.sin_port = 0;
    mep__tcp_fmt_addr(&a, where, sizeof where);
    close(fd);
    if (ctx->cfg.port_lo)
      return TCP_ERR(ctx, MEP_ERR_SYSTEM,
                     "tcp: no port of port_range %d-%d is free on %s: %s",
                     ctx->cfg.port_lo, ctx->cfg.port_hi, where, strerror(e));
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: bind to %s failed: %s", where,
                   strerror(e));
  }
  socklen_t alen = sizeof a;
  if (listen(fd, SOMAXCONN) || getsockname(fd, (struct sockaddr *)&a, &alen)) {
    int e = errno;
    mep__tcp_fmt_addr(&a, where, sizeof where);
    close(fd);
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: listen on %s failed: %s", where,
                   strerror(e));
  }
  ctx->lfd = fd;
  ctx->addr = a;
  return 0;
}

int mep__tcp_wait(tcp_ctx_t *ctx, int fd, short events, int64_t deadline) {
  mep__tcp_accept_pump(ctx);
  int64_t left = deadline - mep__tcp_now_ms();
  if (left <= 0) return -1;
  struct pollfd p[2] = {{.fd = fd, .events = events},
                        {.fd = ctx->lfd, .events = POLLIN}};
  int rc = poll(p, 2, left < 5 ? (int)left : 5);
  if (rc > 0 && fd >= 0 && p[0].revents) return 1;
  return 0;
}
