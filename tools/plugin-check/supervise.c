/* supervise.c - a check's rank processes: fork, watch, reap, judge. */
#include "supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long the other rank may go on after one reported a failure or a
 * skip before it is killed: it usually notices by itself at once. */
#define PC_GRACE_MS 500
/* The supervisor's own deadline comes after the ranks' alarms. */
#define PC_SUPERVISOR_SLACK_MS 3000

typedef struct rank_proc {
  pid_t pid;
  int fd; /* the read end of its result pipe; -1 after EOF */
  char buf[4096];
  size_t len;
  int kind; /* its terminal record: 0, 'P'ASS, 'F'AIL, 'S'KIP, p'E'er */
  char msg[2048];
  int64_t when;
  int status;
  int reaped;
  int killed_by_us;
} rank_proc_t;

/* ------------------------------------------------------------ the child */

static _Noreturn void run_child(const pc_suite_t *su, const pc_job_t *job,
                                int rank, int result_fd, int link_fd,
                                pc_shared_rank_t *shared, pid_t parent) {
  /* A worker must not outlive the tool, even if the tool is killed. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  pc_worker_t w = {
      .rank = rank,
      .nranks = job->nranks,
      .link_fd = link_fd,
      .result_fd = result_fd,
      .opts = su->opts,
      .tp = su->tp,
      .plugin = su->plugin,
      .plugin_path = su->plugin_path,
      .cfg = su->cfg,
      .secret = su->secret,
      .secret_len = sizeof su->secret,
      .seed = job->seed,
      .check = job->name,
      .registers = job->registers,
      .shared = shared,
  };
  pc_worker_start(&w, job->budget_ms);
  job->run(&w);
  pc_worker_stop();
  pc_pass();
  exit(0); /* not _exit: LeakSanitizer, when built in, checks at exit */
}

/* ------------------------------------------------------------- records */

static void take_line(rank_proc_t *p, const char *line, int verbose) {
  const char *sp = strchr(line, ' ');
  const char *text = sp ? sp + 1 : "";
  size_t klen = sp ? (size_t)(sp - line) : strlen(line);
  int64_t when = pc_now_ns(); /* records without a stamp: when read */
  if (text[0] == '@') {
    char *end;
    long long ns = strtoll(text + 1, &end, 10);
    if (end != text + 1 && *end == ' ') {
      when = ns;
      text = end + 1;
    } else if (end != text + 1 && *end == '\0') {
      when = ns;
      text = end;
    }
  }
  int kind = 0;
  if (klen == 4 && strncmp(line, "PASS", 4) == 0) kind = 'P';
  else if (klen == 4 && strncmp(line, "FAIL", 4) == 0) kind = 'F';
  else if (klen == 4 && strncmp(line, "SKIP", 4) == 0) kind = 'S';
  else if (klen == 4 && strncmp(line, "PEER", 4) == 0) kind = 'E';
  else if (klen == 5 && strncmp(line, "BENCH", 5) == 0) {
    printf("%s\n", text);
    fflush(stdout);
    return;
  } else if (klen == 4 && strncmp(line, "INFO", 4) == 0) {
    if (verbose) printf("  info: %s\n", text);
    fflush(stdout);
    return;
  }
  if (!kind || p->kind) return; /* the first terminal record counts */
  p->kind = kind;
  p->when = when;
  snprintf(p->msg, sizeof p->msg, "%s", text);
}

/* Reads what is there; returns 1 at EOF. */
static int drain(rank_proc_t *p, int verbose) {
  for (;;) {
    if (p->len == sizeof p->buf - 1) p->len = 0; /* a runaway line */
    ssize_t n = read(p->fd, p->buf + p->len, sizeof p->buf - 1 - p->len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 0;
    if (n <= 0) return 1;
    p->len += (size_t)n;
    p->buf[p->len] = '\0';
    char *start = p->buf, *nl;
    while ((nl = strchr(start, '\n')) != NULL) {
      *nl = '\0';
      take_line(p, start, verbose);
      start = nl + 1;
    }
    p->len = strlen(start);
    memmove(p->buf, start, p->len + 1);
    return 0;
  }
}

/* ------------------------------------------------------------- watching */

static void kill_rank(rank_proc_t *p) {
  if (p->reaped) return;
  kill(p->pid, SIGKILL);
  p->killed_by_us = 1;
}

/* Reaps every rank: those still running after 2 s are killed. */
static void reap_all(rank_proc_t *procs, int n) {
  int64_t until = pc_now_ms() + 2000;
  for (int r = 0; r < n; r++) {
    rank_proc_t *p = &procs[r];
    while (!p->reaped) {
      pid_t got = waitpid(p->pid, &p->status, WNOHANG);
      if (got == p->pid || (got < 0 && errno != EINTR)) {
        p->reaped = 1;
        break;
      }
      if (pc_now_ms() > until) {
        kill_rank(p);
        while (waitpid(p->pid, &p->status, 0) < 0 && errno == EINTR) {
        }
        p->reaped = 1;
        break;
      }
      struct timespec ts = {0, 5 * 1000000};
      nanosleep(&ts, NULL);
    }
  }
}

/* Collects records until every pipe is closed; returns 1 on the deadline. */
static int watch(rank_proc_t *procs, int n, const pc_job_t *job,
                 int verbose) {
  int64_t deadline = pc_now_ms() + job->budget_ms + PC_SUPERVISOR_SLACK_MS;
  int64_t grace_end = 0;
  for (;;) {
    struct pollfd pfd[2];
    int map[2], k = 0;
    for (int r = 0; r < n; r++)
      if (procs[r].fd >= 0) {
        pfd[k] = (struct pollfd){procs[r].fd, POLLIN, 0};
        map[k++] = r;
      }
    if (k == 0) return 0;
    int64_t now = pc_now_ms();
    if (now > deadline) {
      for (int r = 0; r < n; r++) kill_rank(&procs[r]);
      return 1;
    }
    if (grace_end && now > grace_end) {
      for (int r = 0; r < n; r++)
        if (procs[r].fd >= 0 && !procs[r].kind) kill_rank(&procs[r]);
    }
    if (poll(pfd, (nfds_t)k, 50) < 0 && errno != EINTR) return 0;
    for (int i = 0; i < k; i++) {
      if (!pfd[i].revents) continue;
      rank_proc_t *p = &procs[map[i]];
      if (drain(p, verbose)) {
        close(p->fd);
        p->fd = -1;
      }
      if (p->kind && p->kind != 'P' && !grace_end)
        grace_end = pc_now_ms() + PC_GRACE_MS;
    }
  }
}

/* ------------------------------------------------------------- judgment */

static int crashed(const rank_proc_t *p, int r, const pc_job_t *job) {
  if (!WIFSIGNALED(p->status) || p->killed_by_us) return 0;
  if (job->kills_peer && r == 1 && WTERMSIG(p->status) == SIGKILL &&
      !p->kind)
    return 0;
  return 1;
}

/* The earliest record of `kind`, or -1. */
static int first_of(const rank_proc_t *procs, int n, int kind) {
  int best = -1;
  for (int r = 0; r < n; r++)
    if (procs[r].kind == kind &&
        (best < 0 || procs[r].when < procs[best].when))
      best = r;
  return best;
}

static pc_status_t judge(const rank_proc_t *procs, int n,
                         const pc_job_t *job, const pc_shared_rank_t *shared,
                         int timed_out, char *msg, size_t len) {
  const char *pre[2] = {"", ""};
  if (n == 2) {
    pre[0] = "rank 0: ";
    pre[1] = "rank 1: ";
  }
  for (int r = 0; r < n; r++) {
    if (!crashed(&procs[r], r, job)) continue;
    int sig = WTERMSIG(procs[r].status);
    snprintf(msg, len, "rank %d died of signal %d (%s)%s%s%s", r, sig,
             strsignal(sig), shared[r].call[0] ? " in " : "",
             shared[r].call[0] ? shared[r].call : "",
             shared[r].call[0] ? "()" : "");
    return PC_FAIL;
  }
  int r = first_of(procs, n, 'F');
  if (r >= 0) {
    snprintf(msg, len, "%s%s", pre[r], procs[r].msg);
    return PC_FAIL;
  }
  if (timed_out) {
    snprintf(msg, len,
             "timed out after %d ms (the check's processes did not finish "
             "and were killed)",
             job->budget_ms + PC_SUPERVISOR_SLACK_MS);
    return PC_FAIL;
  }
  r = first_of(procs, n, 'S');
  if (r >= 0) {
    snprintf(msg, len, "%s", procs[r].msg);
    return PC_SKIP;
  }
  r = first_of(procs, n, 'E');
  if (r >= 0) {
    snprintf(msg, len, "%s%s", pre[r], procs[r].msg);
    return PC_FAIL;
  }
  for (r = 0; r < n; r++) {
    const rank_proc_t *p = &procs[r];
    if (job->kills_peer && r == 1) continue;
    int code = WIFEXITED(p->status) ? WEXITSTATUS(p->status) : -1;
    if (p->kind == 'P' && code == 0) continue;
    if (p->kind == 'P')
      snprintf(msg, len,
               "rank %d passed but then exited with status %d (a sanitizer "
               "report on stderr?)",
               r, code);
    else
      snprintf(msg, len, "rank %d exited with status %d without a result", r,
               code);
    return PC_FAIL;
  }
  return PC_PASS;
}

/* -------------------------------------------------------------- running */

pc_status_t pc_supervise(const pc_suite_t *su, const pc_job_t *job,
                         char *msg, size_t msg_len) {
  msg[0] = '\0';
  rank_proc_t procs[2];
  memset(procs, 0, sizeof procs);
  pc_shared_rank_t *shared =
      mmap(NULL, 2 * sizeof *shared, PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    snprintf(msg, msg_len, "mmap of the shared page: %s", strerror(errno));
    return PC_FAIL;
  }
  memset(shared, 0, 2 * sizeof *shared);
  int sp[2] = {-1, -1};
  if (job->nranks == 2 &&
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) {
    snprintf(msg, msg_len, "socketpair: %s", strerror(errno));
    munmap(shared, 2 * sizeof *shared);
    return PC_FAIL;
  }
  pid_t self = getpid();
  int started = 0;
  for (int r = 0; r < job->nranks; r++) {
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
      snprintf(msg, msg_len, "pipe: %s", strerror(errno));
      break;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      snprintf(msg, msg_len, "fork: %s", strerror(errno));
      close(pfd[0]);
      close(pfd[1]);
      break;
    }
    if (pid == 0) {
      close(pfd[0]);
      for (int q = 0; q < r; q++) close(procs[q].fd);
      if (sp[0] >= 0) close(sp[1 - r]);
      run_child(su, job, r, pfd[1], sp[0] >= 0 ? sp[r] : -1, &shared[r],
                self);
    }
    close(pfd[1]);
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    procs[r].pid = pid;
    procs[r].fd = pfd[0];
    started++;
  }
  if (sp[0] >= 0) {
    close(sp[0]);
    close(sp[1]);
  }
  int timed_out = 0;
  if (started == job->nranks)
    timed_out = watch(procs, started, job, su->opts->verbose);
  else
    for (int r = 0; r < started; r++) kill_rank(&procs[r]);
  /* After a deadline, what the ranks managed to report still counts. */
  for (int r = 0; r < started; r++)
    if (procs[r].fd >= 0) {
      drain(&procs[r], su->opts->verbose);
      close(procs[r].fd);
    }
  reap_all(procs, started);
  pc_status_t st = PC_FAIL;
  if (started == job->nranks)
    st = judge(procs, started, job, shared, timed_out, msg, msg_len);
  munmap(shared, 2 * sizeof *shared);
  return st;
}
