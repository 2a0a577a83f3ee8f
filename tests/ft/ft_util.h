/* ft_util.h - small helpers shared by the driver and the rank body of the
 * fault-tolerance tests. */
#ifndef MEP_TESTS_FT_UTIL_H
#define MEP_TESTS_FT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"

/* CLOCK_MONOTONIC in ms: one clock for every process of the machine, so
 * the driver can subtract a rank's timestamps from its own. */
long long ft_now_ms(void);
void ft_sleep_ms(int ms);

/* Never NULL (exits); a size of 0 still gives an address. */
void *ft_xmalloc(size_t len);
void *ft_xcalloc(size_t n, size_t size);

/* Entries of a /proc directory other than "." and "..", or -1. */
int ft_count_dir(const char *path);

/* The open file descriptors of this process: sockets connected to the
 * TCP port `port` in *to_port (the store's connection pool, which grows
 * with the threads that use it at once), all others in *fds. */
void ft_count_fds(int port, int *fds, int *to_port);

/* $name as a number, or dflt when unset; exits on garbage. */
long long ft_env_num(const char *name, long long dflt);
/* $name, exits naming it when unset. */
const char *ft_env_str(const char *name);

/* Random numbers of a named stream: every process derives the same value
 * from the same (seed, a, b). */
uint64_t ft_rand3(uint64_t seed, uint64_t a, uint64_t b);

#endif
