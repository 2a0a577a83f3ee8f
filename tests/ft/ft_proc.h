/* ft_proc.h - the driver's processes (the store runs in one of its own,
 * tools/common/launch.h, so it outlives any rank, rank 0 included, and
 * the driver keeps no thread and may fork): the ranks (fork + exec, optionally inside a
 * network namespace), and short commands such as `ip link`. */
#ifndef MEP_TESTS_FT_PROC_H
#define MEP_TESTS_FT_PROC_H

#include <sys/types.h>


typedef struct ft_spawn {
  const char *self;   /* this program */
  const char *netns;  /* namespace prefix, or NULL: this namespace */
  int rank, inc, cycle, join;
} ft_spawn_t;

/* Forks and execs `self rank` with FT_RANK/FT_INC/FT_CYCLE/FT_JOIN set (the
 * rest of FT_* comes from the driver's environment); inside namespace
 * <netns>n<rank> with MEP_TCP_IFNAME=<netns>i<rank> when netns is set. The
 * child dies with the driver. Returns the pid or -1. */
pid_t ft_spawn_rank(const ft_spawn_t *sp);

/* Runs argv[0] (searched in PATH) and waits for it up to timeout_ms;
 * returns its exit code, or -1 (printed) when it failed or was killed. */
int ft_run_cmd(char *const argv[], int timeout_ms);

/* `ip link set <netns>o<rank> up|down`: the rank's link on the bridge. */
int ft_link_set(const char *netns, int rank, int up);

#endif
