/* worker.c - result records and watchdogs of a check's rank process. */
#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PC_LINE_MAX 2048

pc_worker_t *pc__self;
static pthread_t g_watchdog;
static int g_watchdog_on;
static atomic_int g_stop;
/* Plugin calls made so far, twice: odd while one runs, and the name of
 * the last one (worker.h). A count, not a clock: a time stamp per call
 * would put two clock reads into every call the benchmark times (costly
 * where the clock is slow, as in an emulated guest); the watchdog keeps
 * the time itself. */
atomic_ullong pc__call_seq;
const char *_Atomic pc__call_name;
const char *pc__call_copied;
static pthread_mutex_t g_out_lock = PTHREAD_MUTEX_INITIALIZER;
/* Formatted before the alarm can fire: a signal handler may only write(). */
static char g_alarm_msg[256];
static size_t g_alarm_len;

pc_worker_t *pc_self(void) { return pc__self; }

int64_t pc_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t pc_now_ms(void) { return pc_now_ns() / 1000000; }

const char *pc_err(int code) {
  static _Thread_local char buf[1024];
  const char *detail = mep_last_error();
  if (detail && detail[0])
    snprintf(buf, sizeof buf, "%s (%s)", mep_strerror(code), detail);
  else
    snprintf(buf, sizeof buf, "%s", mep_strerror(code));
  return buf;
}

static void write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return; /* the supervisor is gone; nobody to tell */
    buf += n;
    len -= (size_t)n;
  }
}

/* One record: "KIND @NS message\n", NS being when it happened (both ranks
 * share CLOCK_MONOTONIC, so the supervisor can tell which failure came
 * first even when it reads both at once), with newlines in the message
 * flattened so that the supervisor can split records by line. */
static void emit(const char *kind, const char *fmt, va_list ap) {
  char line[PC_LINE_MAX];
  int k = snprintf(line, sizeof line, "%s @%lld ", kind,
                   (long long)pc_now_ns());
  vsnprintf(line + k, sizeof line - (size_t)k - 1, fmt, ap);
  size_t len = strlen(line);
  for (size_t i = 0; i < len; i++)
    if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
  line[len++] = '\n';
  pthread_mutex_lock(&g_out_lock);
  if (pc__self) write_all(pc__self->result_fd, line, len);
  pthread_mutex_unlock(&g_out_lock);
}

static void emit_plain(const char *kind, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit(kind, fmt, ap);
  va_end(ap);
}

void pc_pass(void) { emit_plain("PASS", "%s", ""); }

_Noreturn void pc_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit("FAIL", fmt, ap);
  va_end(ap);
  _exit(1); /* skips LSan too: what leaks after a failure is not news */
}

_Noreturn void pc_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit("SKIP", fmt, ap);
  va_end(ap);
  _exit(0);
}

_Noreturn void pc_peer_gone(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit("PEER", fmt, ap);
  va_end(ap);
  _exit(1);
}

void pc_info(const char *fmt, ...) {
  if (!pc__self || !pc__self->opts->verbose) return;
  va_list ap;
  va_start(ap, fmt);
  emit("INFO", fmt, ap);
  va_end(ap);
}

void pc_bench_line(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit("BENCH", fmt, ap);
  va_end(ap);
}

void pc__call_name_copy(const char *name) {
  if (!pc__self || !pc__self->shared) return;
  /* Only for the post-mortem; a torn name there is harmless. */
  strncpy(pc__self->shared->call, name, sizeof pc__self->shared->call - 1);
  pc__call_copied = name;
}

/* init, connect, reg and the releases may legitimately take up to
 * env->timeout_ms (devices, handshakes, pinning memory); the rest must
 * not block at all (poll never blocks), so a shorter limit there makes
 * the hung rank, not its waiting peer, report the failure. */
static int may_block(const char *name) {
  static const char *const slow[] = {"init", "connect", "reg", "dereg",
                                     "close", "fini"};
  for (size_t i = 0; i < sizeof slow / sizeof slow[0]; i++)
    if (strcmp(name, slow[i]) == 0) return 1;
  return 0;
}

static int64_t limit_ms(const char *name) {
  int t = pc__self->opts->timeout_ms;
  if (may_block(name)) return (int64_t)t + 1000;
  return t / 2 > 100 ? t / 2 : 100;
}

static void *watchdog_main(void *arg) {
  (void)arg;
  unsigned long long seen = 0; /* the call being timed, and since when */
  int64_t start = 0;
  while (!atomic_load(&g_stop)) {
    struct timespec ts = {0, 20 * 1000000};
    nanosleep(&ts, NULL);
    /* A call is timed from the first turn that finds it running (at most
     * a turn, 20 ms, after it began); an unchanged count around the
     * name's read means the name belongs to it. */
    unsigned long long seq = atomic_load(&pc__call_seq);
    const char *name = atomic_load(&pc__call_name);
    if (!(seq & 1) || !name || atomic_load(&pc__call_seq) != seq) continue;
    if (seq != seen) {
      seen = seq;
      start = pc_now_ns();
      continue;
    }
    int64_t ran = (pc_now_ns() - start) / 1000000; /* at least */
    int64_t limit = limit_ms(name);
    if (ran <= limit) continue;
    emit_plain("FAIL",
               "timed out after %lld ms in %s() (the plugin call did not "
               "return within %lld ms)",
               (long long)ran, name, (long long)limit);
    _exit(3);
  }
  return NULL;
}

static void on_alarm(int sig) {
  (void)sig;
  if (pc__self) {
    const char *p = g_alarm_msg;
    size_t len = g_alarm_len;
    while (len > 0) {
      ssize_t n = write(pc__self->result_fd, p, len);
      if (n <= 0) break;
      p += n;
      len -= (size_t)n;
    }
  }
  _exit(3);
}

void pc_worker_start(pc_worker_t *w, int budget_ms) {
  pc__self = w;
  snprintf(g_alarm_msg, sizeof g_alarm_msg,
           "FAIL timed out after %d ms (the check as a whole, in rank %d)\n",
           budget_ms, w->rank);
  g_alarm_len = strlen(g_alarm_msg);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);
  alarm((unsigned)((budget_ms + 999) / 1000));
  atomic_store(&g_stop, 0);
  if (pthread_create(&g_watchdog, NULL, watchdog_main, NULL) != 0)
    pc_fail("cannot start the watchdog thread");
  g_watchdog_on = 1;
}

void pc_worker_stop(void) {
  alarm(0);
  if (!g_watchdog_on) return;
  atomic_store(&g_stop, 1);
  pthread_join(g_watchdog, NULL);
  g_watchdog_on = 0;
}
