/* proc.c - watching a peer process so that its death is noticed within a
 * poll interval, without trusting a bare pid (pids are reused).
 *
 * A pidfd (pidfd_open, Linux 5.3) names one process for good and turns
 * readable when it exits. Without it, kill(pid, 0) plus the process start
 * time from /proc/<pid>/stat tell a live peer from a new process that got
 * the same pid. */
#include "shm.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Reads the state letter and start time (field 22) of /proc/<pid>/stat.
 * The command name (field 2) may hold spaces and parentheses, so fields
 * are counted from its last ')'. */
static int read_stat(pid_t pid, char *state, uint64_t *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (!p || p[1] != ' ') return -1;
  p += 2;
  *state = *p;
  for (int field = 3; field < 22; field++) {
    p = strchr(p, ' ');
    if (!p) return -1;
    p++;
  }
  char *end;
  errno = 0;
  unsigned long long v = strtoull(p, &end, 10);
  if (errno || end == p) return -1;
  *start = v;
  return 0;
}

uint64_t shm_proc_start_time(pid_t pid) {
  char state;
  uint64_t start;
  return read_stat(pid, &state, &start) == 0 ? start : 0;
}

/* 1 if /proc shows `pid` as the process started at start_time (or cannot
 * tell: no /proc), 0 if it is gone, a zombie or another process. */
static int stat_matches(pid_t pid, uint64_t start_time) {
  char state;
  uint64_t start;
  if (read_stat(pid, &state, &start) != 0)
    return read_stat(getpid(), &state, &start) != 0;
  if (state == 'Z' || state == 'X') return 0;
  return start_time == 0 || start == start_time;
}

int shm_proc_watch(pid_t pid, uint64_t start_time, int *pidfd) {
  *pidfd = -1;
#ifdef SYS_pidfd_open
  long fd = syscall(SYS_pidfd_open, (int)pid, 0);
  if (fd < 0 && errno == ESRCH) return MEP_ERR_PEER_FAILED;
  if (fd >= 0) *pidfd = (int)fd;
#endif
  if (*pidfd < 0 && kill(pid, 0) != 0 && errno == ESRCH)
    return MEP_ERR_PEER_FAILED;
  /* Checked after the pidfd exists, so the fd cannot name a newer process
   * than the one whose start time matched. */
  if (!stat_matches(pid, start_time)) {
    if (*pidfd >= 0) close(*pidfd);
    *pidfd = -1;
    return MEP_ERR_PEER_FAILED;
  }
  return 0;
}

int shm_proc_alive(pid_t pid, uint64_t start_time, int pidfd) {
  if (pidfd >= 0) {
    struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
    int rc = poll(&pfd, 1, 0);
    return rc == 0 || (rc < 0 && errno == EINTR);
  }
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  return stat_matches(pid, start_time);
}
