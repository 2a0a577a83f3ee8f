/* clock.h - time for deadlines and the backoff of loops that wait on
 * memory. A leaf: it calls nothing else of mep. */
#ifndef MEP_SRC_CLOCK_H
#define MEP_SRC_CLOCK_H

#include <stdint.h>

/* Milliseconds on CLOCK_MONOTONIC. */
uint64_t mep__now_ms(void);

/* The moment `ms` milliseconds from now, and whether it has come. */
uint64_t mep__deadline_in(uint64_t ms);
int mep__passed(uint64_t deadline);

/* Adaptive backoff for loops that wait on memory: spin, then yield, then
 * sleep in growing steps up to a small bound. */
typedef struct mep__backoff {
  unsigned rounds;
} mep__backoff_t;
void mep__backoff(mep__backoff_t *b);

#endif
