/* ft_proc.c - rank processes and commands. */
#include "ft_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mep/mep.h>

#include "ft_util.h"

static void set_num(const char *name, int v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%d", v);
  setenv(name, buf, 1);
}

pid_t ft_spawn_rank(const ft_spawn_t *sp) {
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid != 0) {
    if (pid < 0) perror("ft: fork");
    return pid;
  }
  /* The child: the driver has no threads, so setenv here is safe. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(126);
  set_num("FT_RANK", sp->rank);
  set_num("FT_INC", sp->inc);
  set_num("FT_CYCLE", sp->cycle);
  set_num("FT_JOIN", sp->join);
  if (sp->netns) {
    char ns[64], ifname[64];
    snprintf(ns, sizeof ns, "%sn%d", sp->netns, sp->rank);
    snprintf(ifname, sizeof ifname, "%si%d", sp->netns, sp->rank);
    setenv("MEP_TCP_IFNAME", ifname, 1);
    char *argv[] = {"ip", "netns", "exec", ns, (char *)sp->self, "rank", NULL};
    execvp("ip", argv);
  } else {
    char *argv[] = {(char *)sp->self, "rank", NULL};
    execv(sp->self, argv);
  }
  fprintf(stderr, "ft: exec for rank %d: %s\n", sp->rank, strerror(errno));
  _exit(127);
}

int ft_run_cmd(char *const argv[], int timeout_ms) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execvp(argv[0], argv);
    _exit(127);
  }
  if (pid < 0) return -1;
  long long deadline = ft_now_ms() + timeout_ms;
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) return -1;
    if (ft_now_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fprintf(stderr, "ft: '%s %s ...' did not finish in %d ms\n", argv[0],
              argv[1] ? argv[1] : "", timeout_ms);
      return -1;
    }
    ft_sleep_ms(1);
  }
  if (!WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int ft_link_set(const char *netns, int rank, int up) {
  char dev[64];
  snprintf(dev, sizeof dev, "%so%d", netns, rank);
  char *argv[] = {"ip", "link", "set", "dev", dev, up ? "up" : "down", NULL};
  int rc = ft_run_cmd(argv, 5000);
  if (rc != 0)
    fprintf(stderr, "ft: 'ip link set dev %s %s' failed (%d)\n", dev,
            up ? "up" : "down", rc);
  return rc == 0 ? 0 : -1;
}
