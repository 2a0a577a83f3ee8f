/* ft_ref.h - the collectives each cycle runs, their inputs and the
 * independent reference of their results over the surviving ranks.
 *
 * Inputs are a pure function of (seed, step id, rank, index), so any rank
 * can regenerate any other's. The reference follows mep.h's rules written
 * out here, not the library's code: reductions combine the survivors in
 * rank order (float32 as a naive float32 sum, so results are bit-exact),
 * avg divides by the number of survivors (integers truncate toward zero),
 * and the all-gather / all-to-all blocks of ranks that are not survivors
 * keep what the buffer held before. */
#ifndef MEP_TESTS_FT_REF_H
#define MEP_TESTS_FT_REF_H

#include <stddef.h>
#include <stdint.h>

#include <mep/mep.h>

typedef enum {
  FT_ALLREDUCE,
  FT_ALLGATHER,
  FT_ALLTOALL,
  FT_BARRIER,
} ft_coll_t;

typedef struct ft_step {
  ft_coll_t coll;
  mep_dtype_t dt; /* MEP_INT64, MEP_INT32 or MEP_FLOAT32 */
  mep_op_t op;    /* all-reduce only */
  size_t count;   /* per rank (all-gather, all-to-all block) */
} ft_step_t;

/* The list a cycle runs before the recovery point (where faults strike)
 * and again after it over the full group; *large is the index of its
 * largest all-reduce (the one a victim dies in the middle of). */
const ft_step_t *ft_steps(int short_list, size_t *n, int *large);
/* The short list the survivors run after the faulty one, before they
 * recover the lost ranks. */
const ft_step_t *ft_steps_after(size_t *n);

/* "allreduce float32 sum x1048583" into buf. */
void ft_step_name(const ft_step_t *s, char *buf, size_t len);
/* A step whose healthy run takes milliseconds: its duration is checked
 * against the timeout. */
int ft_step_small(const ft_step_t *s);

/* One rank's buffers for one step: send holds the rank's input, recv a
 * canary pattern (also FT_TAIL bytes past its end) that the collective
 * overwrites where it delivers data. */
#define FT_TAIL 64
typedef struct ft_bufs {
  uint8_t *send, *recv;
  size_t send_len, recv_len; /* recv_len excludes the tail */
} ft_bufs_t;

void ft_bufs_make(const ft_step_t *s, uint64_t seed, uint64_t gid, int rank,
                  int size, ft_bufs_t *b);
void ft_bufs_free(ft_bufs_t *b);

/* Checks rank `rank`'s recv after step gid against the reference over the
 * ranks r < size with alive[r] != 0. Returns 0, or -1 with a sentence in
 * why naming the first wrong element. */
int ft_ref_check(const ft_step_t *s, uint64_t seed, uint64_t gid, int rank,
                 int size, const uint8_t *alive, const ft_bufs_t *b,
                 char *why, size_t whylen);

/* FNV-1a of the recv data (not the tail): what survivors compare. */
uint64_t ft_hash(const ft_bufs_t *b);

#endif
