/* log.c - leveled log lines: "mep[rank] LEVEL message" to stderr or
 * MEP_LOG_FILE. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static const char *const level_names[] = {"error", "warn", "info", "debug",
                                          "trace"};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic int level = MEP_LOG_WARN;
static _Atomic int env_set;
static _Atomic int log_rank = -1;
static FILE *sink;
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;

int mep_log_parse_level(const char *name, mep_log_level_t *out) {
  for (int i = 0; name && i <= MEP_LOG_TRACE; i++) {
    if (strcasecmp(name, level_names[i]) == 0) {
      *out = (mep_log_level_t)i;
      return MEP_OK;
    }
  }
  return MEP_ERR_INVALID;
}

static void init_once(void) {
  const char *env = getenv("MEP_LOG");
  mep_log_level_t lvl;
  if (env && *env) {
    if (mep_log_parse_level(env, &lvl) == MEP_OK) {
      level = lvl;
      env_set = 1;
    } else {
      fprintf(stderr, "mep: MEP_LOG=%s is not one of error, warn, info, "
                      "debug, trace; using warn\n", env);
    }
  }
  const char *file = getenv("MEP_LOG_FILE");
  if (file && *file) {
    sink = fopen(file, "a");
    if (!sink)
      fprintf(stderr, "mep: cannot open MEP_LOG_FILE=%s; logging to "
                      "stderr\n", file);
  }
}

mep_log_level_t mep_log_get_level(void) {
  pthread_once(&once, init_once);
  return (mep_log_level_t)level;
}

void mep_log_set_level(mep_log_level_t lvl) {
  pthread_once(&once, init_once);
  if (lvl >= MEP_LOG_ERROR && lvl <= MEP_LOG_TRACE) level = lvl;
}

void mep__log_default_level(mep_log_level_t lvl) {
  pthread_once(&once, init_once);
  if (!env_set) mep_log_set_level(lvl);
}

void mep__log_set_rank(int rank) { log_rank = rank; }

void mep__log(mep_log_level_t lvl, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mep__vlog(lvl, fmt, ap);
  va_end(ap);
}

void mep__vlog(mep_log_level_t lvl, const char *fmt, va_list ap) {
  if (lvl < MEP_LOG_ERROR || lvl > mep_log_get_level()) return;
  char line[2048];
  int n = log_rank >= 0
              ? snprintf(line, sizeof line, "mep[%d] %-5s ", (int)log_rank,
                         level_names[lvl])
              : snprintf(line, sizeof line, "mep %-5s ", level_names[lvl]);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  pthread_mutex_lock(&sink_lock);
  FILE *out = sink ? sink : stderr;
  fprintf(out, "%s\n", line);
  fflush(out);
  pthread_mutex_unlock(&sink_lock);
}
