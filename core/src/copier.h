/* copier.h - a thread that copies memory while the progress thread goes
 * on: the in-place input of a large all-reduce goes aside there
 * (coll.c, aside_start). One job at a time. */
#ifndef MEP_COPIER_H
#define MEP_COPIER_H

#include <stddef.h>
#include <stdint.h>

typedef struct mep__copier mep__copier_t;

/* Starts the thread: 0, or a negative MEP_ERR_* (described). */
int mep__copier_new(mep__copier_t **out);
/* Waits for a job in progress and joins the thread. NULL is ignored. */
void mep__copier_free(mep__copier_t *c);
/* Copies n bytes from src to dst in the thread, [first_lo, first_hi)
 * first and in order (mep__copier_reach follows it), then the rest;
 * returns at once. The caller keeps both buffers alive, and a range of
 * src unwritten until the copy has passed it. No job may be running. */
void mep__copier_start(mep__copier_t *c, uint8_t *dst, const uint8_t *src,
                       size_t n, size_t first_lo, size_t first_hi);
/* Returns once the first `bytes` bytes of the running job's first range
 * are copied (at once if no job runs): from then on the caller may write
 * them in src. */
void mep__copier_reach(mep__copier_t *c, size_t bytes);
/* Returns once the job started last is done (at once if none is). */
void mep__copier_wait(mep__copier_t *c);
/* For tests: every job waits this long before it copies, so that a
 * caller that did not wait for it is caught reading a half-made copy. */
extern unsigned mep__copier_delay_us;
/* The CPUs this process may run on; a copier pays off from 4. */
int mep__cpus(void);

#endif
