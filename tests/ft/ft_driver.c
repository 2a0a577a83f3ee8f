/* ft_driver.c - the fault-tolerance test driver: forks the ranks of one
 * scenario around a store process, acts on their events (continues a
 * frozen rank, cuts a link, starts replacements once the survivors wait
 * for them), reaps every process, kills what is left at its deadline, and
 * cross-checks the reports. The driver never has a thread, so forking is
 * safe. `ft_test rank` is the rank body (ft_rank.c).
 *
 *   ft_test SCENARIO NRANKS [seed=N] [netns=PREFIX store_host=ADDR]
 *           [KEY=VALUE ...]   (other KEY=VALUE go to the environment)
 */
#include "ft_driver.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ft_rank.h"
#include "ft_util.h"

static void usage(void) {
  fprintf(stderr, "usage: ft_test SCENARIO NRANKS [seed=N] [netns=PREFIX "
          "store_host=ADDR] [KEY=VALUE...]\nscenarios:\n");
  ft_scen_list();
  exit(2);
}

static void spawn(ft_drv_t *d, int rank, int cycle, int join) {
  if (d->nprocs == d->cap) {
    d->cap = d->cap ? 2 * d->cap : 16;
    d->procs = realloc(d->procs, d->cap * sizeof *d->procs);
    CHECK(d->procs != NULL, "out of memory");
  }
  ft_proc_t *p = &d->procs[d->nprocs];
  memset(p, 0, sizeof *p);
  p->rank = rank;
  p->inc = d->next_inc[rank]++;
  p->cycle0 = cycle;
  p->join = join;
  ft_spawn_t sp = {d->self, d->netns, rank, p->inc, cycle, join};
  p->pid = ft_spawn_rank(&sp);
  if (p->pid < 0) {
    d->failed++;
    return;
  }
  p->running = 1;
  d->cur[rank] = (int)d->nprocs++;
}

static ft_proc_t *find(ft_drv_t *d, pid_t pid) {
  for (size_t i = 0; i < d->nprocs; i++)
    if (d->procs[i].pid == pid) return &d->procs[i];
  return NULL;
}

/* "kind pid rank cycle t_ms extra" from a rank. */
static void handle(ft_drv_t *d, const char *line) {
  char kind[32];
  int pid = 0, rank = 0, cycle = 0;
  long long t = 0;
  if (sscanf(line, "%31s %d %d %d %lld", kind, &pid, &rank, &cycle, &t) != 5 ||
      cycle < 0 || cycle >= d->scen->cycles) {
    fprintf(stderr, "ft: bad event line '%s'\n", line);
    d->failed++;
    return;
  }
  ft_cyc_t *y = &d->cyc[cycle];
  ft_proc_t *p = find(d, pid);
  if (strcmp(kind, "dying") == 0 || strcmp(kind, "stopping") == 0) {
    if (p) p->dying = kind[0] == 'd';
    if (!y->t_fault) y->t_fault = t;
  } else if (strcmp(kind, "cut") == 0) {
    ft_sleep_ms(d->plans[cycle].delay_ms);
    if (ft_link_set(d->netns, rank, 0)) d->failed++;
    y->t_fault = ft_now_ms();
  } else if (strcmp(kind, "lost") == 0) {
    y->lost++;
  } else if (strcmp(kind, "ready") == 0) {
    y->ready++;
  } else if (strcmp(kind, "joined") == 0) {
    y->joined++;
  }
}

static void drain_events(ft_drv_t *d) {
  for (;;) {
    ssize_t got = read(d->ctl_rd, d->line + d->linelen,
                       sizeof d->line - 1 - d->linelen);
    if (got <= 0) return;
    d->linelen += (size_t)got;
    char *nl;
    while ((nl = memchr(d->line, '\n', d->linelen)) != NULL) {
      *nl = '\0';
      handle(d, d->line);
      size_t used = (size_t)(nl + 1 - d->line);
      memmove(d->line, nl + 1, d->linelen - used);
      d->linelen -= used;
    }
    CHECK(d->linelen < sizeof d->line - 1, "ft: event line too long");
  }
}

/* A process may end in one way only: exit 0, or SIGKILL after it said it
 * raises it. */
static void judge(ft_drv_t *d, ft_proc_t *p) {
  int st = p->status;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return;
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && p->dying) return;
  if (WIFEXITED(st))
    fprintf(stderr, "ft: rank %d (process %d, incarnation %d) exited with "
            "%d\n", p->rank, (int)p->pid, p->inc, WEXITSTATUS(st));
  else
    fprintf(stderr, "ft: rank %d (process %d, incarnation %d) was killed by "
            "signal %d\n", p->rank, (int)p->pid, p->inc, WTERMSIG(st));
  d->failed++;
}

static void reap(ft_drv_t *d) {
  for (;;) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    if (pid == d->store.pid) {
      fprintf(stderr, "ft: the store process ended while the ranks ran\n");
      d->store.pid = -1;
      d->failed++;
      continue;
    }
    ft_proc_t *p = find(d, pid);
    if (!p) continue;
    if (WIFSTOPPED(st)) {
      p->stopped = 1;
      continue;
    }
    drain_events(d); /* its "dying" was written before it died */
    p->running = 0;
    p->status = st;
    judge(d, p);
  }
}

static int victims_gone(const ft_drv_t *d, const ft_plan_t *p) {
  for (int i = 0; i < p->nlost; i++) {
    int c = d->cur[p->lost[i]];
    if (c >= 0 && d->procs[c].running) return 0;
  }
  return 1;
}

/* Continue frozen victims once every survivor dropped them; start the
 * replacements (or the new ranks) once every survivor waits for them and
 * the old processes are gone. */
static void advance(ft_drv_t *d) {
  for (int c = 0; c < d->scen->cycles; c++) {
    ft_plan_t *p = &d->plans[c];
    ft_cyc_t *y = &d->cyc[c];
    int nsurv = p->size_before - p->nlost;
    if (p->kind == FT_STOP && !y->cont_sent && y->lost == nsurv) {
      int stopped = 1;
      for (int i = 0; i < p->nlost; i++)
        stopped &= d->procs[d->cur[p->lost[i]]].stopped;
      if (stopped) {
        for (int i = 0; i < p->nlost; i++) {
          ft_proc_t *v = &d->procs[d->cur[p->lost[i]]];
          v->stopped = 0;
          kill(v->pid, SIGCONT);
        }
        y->cont_sent = 1;
      }
    }
    if (y->spawned || y->ready < nsurv || !victims_gone(d, p)) continue;
    if (p->kind == FT_CUT)
      for (int i = 0; i < p->nlost; i++)
        if (ft_link_set(d->netns, p->lost[i], 1)) d->failed++;
    for (int i = 0; i < p->nadd; i++) spawn(d, p->add[i], c, 1);
    y->spawned = 1;
  }
}

static int running(const ft_drv_t *d) {
  int n = 0;
  for (size_t i = 0; i < d->nprocs; i++) n += d->procs[i].running;
  return n;
}

static void kill_all(ft_drv_t *d, const char *why) {
  for (size_t i = 0; i < d->nprocs; i++) {
    ft_proc_t *p = &d->procs[i];
    if (!p->running) continue;
    fprintf(stderr, "ft: killing rank %d (process %d, incarnation %d): %s\n",
            p->rank, (int)p->pid, p->inc, why);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->running = 0;
  }
}

static void run(ft_drv_t *d) {
  for (int r = 0; r < d->n; r++) spawn(d, r, 0, 0);
  while (running(d) > 0) {
    struct pollfd pfd = {d->ctl_rd, POLLIN, 0};
    poll(&pfd, 1, 5);
    drain_events(d);
    reap(d);
    advance(d);
    if (d->failed) {
      kill_all(d, "another process failed");
      return;
    }
    if (ft_now_ms() > d->deadline) {
      d->failed++;
      kill_all(d, "the run's deadline passed");
      return;
    }
  }
  for (int c = 0; c < d->scen->cycles; c++)
    if (!d->cyc[c].spawned) {
      fprintf(stderr, "ft: every process ended before cycle %d recovered\n",
              c);
      d->failed++;
    }
}

/* KEY=VALUE arguments: seed, netns and store_host are the driver's, the
 * rest goes to the environment of every rank. */
static void parse_args(ft_drv_t *d, int argc, char **argv,
                       const char **host) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  d->seed = (uint64_t)ts.tv_sec * 1000003u + (uint64_t)ts.tv_nsec;
  for (int i = 3; i < argc; i++) {
    char *eq = strchr(argv[i], '=');
    if (!eq || eq == argv[i]) usage();
    *eq = '\0';
    const char *v = eq + 1;
    if (strcmp(argv[i], "seed") == 0) d->seed = strtoull(v, NULL, 0);
    else if (strcmp(argv[i], "netns") == 0) d->netns = v;
    else if (strcmp(argv[i], "store_host") == 0) *host = v;
    else CHECK(setenv(argv[i], v, 1) == 0, "setenv %s", argv[i]);
  }
  /* Short deadlines unless the caller chose others. */
  setenv("MEP_CORE_TIMEOUT_MS", "3000", 0);
  setenv("MEP_CORE_PROBE_MS", "400", 0);
  setenv("MEP_CORE_CHUNK_BYTES", "4096", 0);
  setenv("MEP_LOG", "warn", 0);
  if (!d->netns) setenv("MEP_TCP_IFNAME", "lo", 0);
}

static void setup(ft_drv_t *d, const char *host) {
  char buf[64];
  d->timeout_ms = (int)ft_env_num("MEP_CORE_TIMEOUT_MS", 0);
  d->probe_ms = (int)ft_env_num("MEP_CORE_PROBE_MS", 0);
  d->max_size = ft_scen_max_size(d->scen, d->n);
  d->plans = ft_xcalloc((size_t)d->scen->cycles, sizeof *d->plans);
  d->cyc = ft_xcalloc((size_t)d->scen->cycles, sizeof *d->cyc);
  for (int c = 0; c < d->scen->cycles; c++)
    ft_plan_make(d->scen, d->n, d->seed, c, &d->plans[c]);
  d->cur = ft_xcalloc((size_t)d->max_size, sizeof *d->cur);
  d->next_inc = ft_xcalloc((size_t)d->max_size, sizeof *d->next_inc);
  for (int r = 0; r < d->max_size; r++) d->cur[r] = -1;
  ssize_t len = readlink("/proc/self/exe", d->self, sizeof d->self - 1);
  CHECK(len > 0 && len < (ssize_t)sizeof d->self - 1, "readlink self");
  d->self[len] = '\0';
  snprintf(d->dir, sizeof d->dir, "/tmp/mep-ft-XXXXXX");
  CHECK(mkdtemp(d->dir) != NULL, "mkdtemp: %s", strerror(errno));
  d->store.host = host;
  CHECK(mep_launch_store_start(&d->store) == 0, "ft: no store on %s", host);
  /* The event pipe: the ranks inherit the write end. */
  int fds[2];
  CHECK(pipe(fds) == 0, "pipe");
  d->ctl_rd = fds[0];
  d->ctl_wr = fds[1];
  fcntl(d->ctl_rd, F_SETFD, FD_CLOEXEC);
  fcntl(d->ctl_rd, F_SETFL, O_NONBLOCK);
  setenv("FT_SCEN", d->scen->name, 1);
  snprintf(buf, sizeof buf, "%d", d->n);
  setenv("FT_N", buf, 1);
  snprintf(buf, sizeof buf, "%" PRIu64, d->seed);
  setenv("FT_SEED", buf, 1);
  setenv("FT_STORE_HOST", host, 1);
  snprintf(buf, sizeof buf, "%d", d->store.port);
  setenv("FT_STORE_PORT", buf, 1);
  snprintf(buf, sizeof buf, "%d", d->ctl_wr);
  setenv("FT_CTL_FD", buf, 1);
  setenv("FT_DIR", d->dir, 1);
  d->deadline = ft_now_ms() +
                1000 * ft_env_num("FT_DEADLINE_S", d->scen->deadline_s);
}

static void cleanup(ft_drv_t *d, int keep) {
  mep_launch_store_stop(&d->store);
  close(d->ctl_rd);
  close(d->ctl_wr);
  if (keep) {
    fprintf(stderr, "ft: reports kept in %s\n", d->dir);
  } else {
    for (size_t i = 0; i < d->nprocs; i++) {
      char path[512];
      snprintf(path, sizeof path, "%s/r%d.%d", d->dir, d->procs[i].rank,
               d->procs[i].inc);
      unlink(path);
    }
    rmdir(d->dir);
  }
  for (int c = 0; c < d->scen->cycles; c++) ft_plan_free(&d->plans[c]);
  free(d->plans), free(d->cyc), free(d->procs), free(d->cur),
      free(d->next_inc);
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "rank") == 0) return ft_rank_main();
  if (argc < 3) usage();
  ft_drv_t d;
  memset(&d, 0, sizeof d);
  d.scen = ft_scen_find(argv[1]);
  d.n = atoi(argv[2]);
  if (!d.scen || d.n < 2) usage();
  const char *host = "127.0.0.1";
  parse_args(&d, argc, argv, &host);
  if (d.scen->kind == FT_CUT && !d.netns) {
    printf("ft: %s needs network namespaces: run it through netns.sh\n",
           d.scen->name);
    return 77;
  }
  setup(&d, host);
  printf("ft: %s (%s), %d ranks, seed=%" PRIu64 " (pass seed=%" PRIu64
         " to replay); timeout %d ms, probe %d ms, chunk %s B\n",
         d.scen->name, d.scen->what, d.n, d.seed, d.seed, d.timeout_ms,
         d.probe_ms, getenv("MEP_CORE_CHUNK_BYTES"));
  fflush(stdout);
  long long t0 = ft_now_ms();
  run(&d);
  if (!d.failed) d.failed += ft_verify(&d);
  printf("ft: %s, %d ranks: %s in %lld ms\n", d.scen->name, d.n,
         d.failed ? "FAILED" : "passed", ft_now_ms() - t0);
  cleanup(&d, d.failed);
  return d.failed ? 1 : 0;
}
