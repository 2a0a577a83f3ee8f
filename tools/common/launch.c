/* launch.c - forked local ranks around a built-in store. */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The rank's store, counting its requests (mep_launch_store_requests). */
typedef struct counted {
  mep_store_t *inner;
  _Atomic uint64_t n;
} counted_t;

static int c_set(void *ctx, const char *key, const void *val, size_t len) {
  counted_t *c = ctx;
  c->n++;
  return c->inner->set(c->inner->ctx, key, val, len);
}

static int c_get(void *ctx, const char *key, void **val, size_t *len,
                 int timeout_ms) {
  counted_t *c = ctx;
  c->n++;
  return c->inner->get(c->inner->ctx, key, val, len, timeout_ms);
}

static int c_add(void *ctx, const char *key, int64_t delta, int64_t *res) {
  counted_t *c = ctx;
  c->n++;
  return c->inner->add(c->inner->ctx, key, delta, res);
}

static int c_check(void *ctx, const char *key, int *exists) {
  counted_t *c = ctx;
  c->n++;
  return c->inner->check(c->inner->ctx, key, exists);
}

uint64_t mep_launch_store_requests(const mep_store_t *store) {
  return store && store->set == c_set ? ((counted_t *)store->ctx)->n : 0;
}

static int child(const mep_launch_opts_t *o, int rank, int port,
                 mep_launch_fn fn, void *arg) {
  /* MEP_LAUNCH_HOSTS=1: each rank a host of its own (its MEP_HOST_ID), so
   * that ranks of one machine reach each other as across hosts;
   * MEP_LAUNCH_RANKS_PER_HOST=M: M consecutive ranks to a host (0..M-1
   * the first), so a group has peers in its host and across hosts at once */
  const char *hosts = getenv("MEP_LAUNCH_HOSTS");
  const char *per = getenv("MEP_LAUNCH_RANKS_PER_HOST");
  int m = hosts && !strcmp(hosts, "1") ? 1 : per ? atoi(per) : 0;
  if (m > 0) {
    char id[64];
    snprintf(id, sizeof id, "mep-launch-host-%d", rank / m);
    setenv("MEP_HOST_ID", id, 1);
  }
  if (o->before_comm) o->before_comm(rank, arg);
  mep_store_t *tcp = NULL;
  int rc = mep_store_tcp_connect("127.0.0.1", port, o->timeout_ms, &tcp);
  if (rc) {
    fprintf(stderr, "rank %d: store: %s\n", rank, mep_last_error());
    return 2;
  }
  counted_t counted = {.inner = tcp};
  mep_store_t own = {.ctx = &counted, .set = c_set, .get = c_get,
                     .add = tcp->add ? c_add : NULL,
                     .check = tcp->check ? c_check : NULL};
  mep_store_t *store = &own;
  mep_comm_opts_t copts = {.struct_size = sizeof copts, .name = o->name};
  mep_comm_t *comm = NULL;
  rc = mep_comm_create(store, rank, o->size, &copts, &comm);
  if (rc) {
    int result = 3;
    if (o->on_create_error)
      result = o->on_create_error(rank, rc, arg) ? 3 : 0;
    else
      fprintf(stderr, "rank %d: mep_comm_create: %s: %s\n", rank,
              mep_strerror(rc), mep_last_error());
    mep_store_destroy(tcp);
    return result;
  }
  rc = fn(comm, store, arg);
  mep_comm_destroy(comm);
  mep_store_destroy(tcp);
  return rc ? 1 : 0;
}

/* Reaps children until all are gone or the deadline; returns failures. */
static int reap(pid_t *pids, int n, long long deadline) {
  int failed = 0, left = n;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == 0) {
      if (now_ms() >= deadline) break;
      struct timespec ts = {0, 2000000};
      nanosleep(&ts, NULL);
      continue;
    }
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    for (int r = 0; r < n; r++) {
      if (pids[r] != pid) continue;
      pids[r] = 0;
      left--;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
      failed++;
      if (WIFEXITED(status))
        fprintf(stderr, "rank %d: exited with %d\n", r, WEXITSTATUS(status));
      else
        fprintf(stderr, "rank %d: killed by signal %d\n", r, WTERMSIG(status));
    }
  }
  for (int r = 0; r < n; r++) {
    if (!pids[r]) continue;
    kill(pids[r], SIGKILL);
    waitpid(pids[r], NULL, 0);
    fprintf(stderr, "rank %d: killed at the %s deadline\n", r, "run's");
    failed++;
  }
  return failed;
}

/* The server process: serves until the parent closes the control pipe
 * (or dies). */
static void serve_store(const char *host, int port_fd, int ctl_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  mep_store_server_t *srv = NULL;
  int port = -1;
  if (mep_store_server_start(host, 0, &srv))
    fprintf(stderr, "launch: store server on %s: %s\n", host,
            mep_last_error());
  else
    port = mep_store_server_port(srv);
  ssize_t w = write(port_fd, &port, sizeof port);
  close(port_fd);
  char c;
  if (w == sizeof port && port > 0)
    while (read(ctl_fd, &c, 1) < 0 && errno == EINTR) {
    }
  mep_store_server_stop(srv);
  _exit(port > 0 ? 0 : 1);
}

int mep_launch_store_start(mep_launch_store_t *st) {
  int port_pipe[2], ctl_pipe[2];
  const char *host = st->host ? st->host : "127.0.0.1";
  st->pid = st->ctl_fd = st->port = -1;
  if (pipe2(port_pipe, O_CLOEXEC)) return -1;
  if (pipe2(ctl_pipe, O_CLOEXEC)) {
    close(port_pipe[0]), close(port_pipe[1]);
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(port_pipe[0]);
    close(ctl_pipe[1]);
    serve_store(host, port_pipe[1], ctl_pipe[0]);
  }
  close(port_pipe[1]);
  close(ctl_pipe[0]);
  st->pid = pid;
  st->ctl_fd = ctl_pipe[1];
  st->port = -1;
  if (pid < 0 || read(port_pipe[0], &st->port, sizeof st->port) !=
                     (ssize_t)sizeof st->port || st->port <= 0) {
    close(port_pipe[0]);
    mep_launch_store_stop(st);
    return -1;
  }
  close(port_pipe[0]);
  return 0;
}

void mep_launch_store_stop(mep_launch_store_t *st) {
  if (st->ctl_fd >= 0) close(st->ctl_fd);
  st->ctl_fd = -1;
  if (st->pid > 0) waitpid(st->pid, NULL, 0);
  st->pid = 0;
}

int mep_launch(const mep_launch_opts_t *o, mep_launch_fn fn, void *arg) {
  mep_launch_store_t st = {0};
  if (mep_launch_store_start(&st)) {
    fprintf(stderr, "launch: could not start the store server\n");
    return o->size > 0 ? o->size : 1;
  }
  int port = st.port;
  pid_t *pids = calloc((size_t)o->size, sizeof *pids);
  if (!pids) {
    mep_launch_store_stop(&st);
    return o->size;
  }
  fflush(NULL);
  int failed = 0;
  for (int r = 0; r < o->size; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      free(pids); /* the parent's; a child that exit()s must not leak it */
      int rc = child(o, r, port, fn, arg);
      fflush(NULL); /* _exit does not flush: a piped stdout would be lost */
      _exit(rc);
    }
    if (pids[r] < 0) {
      perror("launch: fork");
      pids[r] = 0;
      failed++;
    }
  }
  failed += reap(pids, o->size, now_ms() + o->timeout_ms);
  free(pids);
  mep_launch_store_stop(&st);
  return failed;
}
