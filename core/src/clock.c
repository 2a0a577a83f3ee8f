/* clock.c - time for deadlines, and the backoff of waiting loops
 * (clock.h). */
#include "clock.h"

#include <sched.h>
#include <time.h>

uint64_t mep__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t mep__deadline_in(uint64_t ms) { return mep__now_ms() + ms; }

int mep__passed(uint64_t deadline) { return mep__now_ms() >= deadline; }

/* Spinning first keeps the fast path fast; yielding then sleeping keeps
 * many ranks on few cores from starving the ones that have work. */
void mep__backoff(mep__backoff_t *b) {
  unsigned r = b->rounds++;
  if (r < 200) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else if (r < 400) {
    sched_yield();
  } else {
    unsigned us = r < 1000 ? 10 : r < 2000 ? 50 : 200;
    struct timespec ts = {0, (long)us * 1000};
    nanosleep(&ts, NULL);
  }
}
