/* harness.h - what the collective and point-to-point tests share: the run's
 * settings from the command line, buffers with canaries around them, and
 * the cross-rank comparison of results through the store. */
#ifndef MEP_TESTS_COLL_HARNESS_H
#define MEP_TESTS_COLL_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include <mep/mep.h>

typedef struct coll_ctx {
  mep_comm_t *comm;
  mep_store_t *store;
  int me, n;
  uint64_t seed;   /* of the run; each case derives its own */
  size_t chunk;    /* [core] chunk_bytes the run set */
  unsigned cases;  /* cases made so far, the same count on every rank */
  /* Hashes of results that every rank must hold bit for bit, with the
   * case each belongs to; compared with rank 0's by hashes_compare. */
  uint64_t *hashes;
  char **labels;
  size_t nhashes, cap;
} coll_ctx_t;

/* Applies the KEY=VALUE arguments argv[first..] with setenv before any rank
 * is forked ("seed=N" sets the run's seed instead; without it the seed
 * comes from the clock and is printed, so a failure can be replayed).
 * Returns the run's seed. */
uint64_t harness_args(int argc, char **argv, int first);

/* The run's settings for a rank: comm and store from mep_launch, the seed
 * from harness_args, the chunk from MEP_CORE_CHUNK_BYTES. */
void ctx_init(coll_ctx_t *ctx, mep_comm_t *comm, mep_store_t *store,
              uint64_t seed);
void ctx_fini(coll_ctx_t *ctx);

/* Records the hash of a result that every rank must share. */
void hashes_add(coll_ctx_t *ctx, const char *label, const void *buf,
                size_t len);
/* Publishes this rank's hashes under `section` and checks that they equal
 * rank 0's, one by one; exits naming the first case that differs. */
void hashes_compare(coll_ctx_t *ctx, const char *section);

/* A test buffer: `len` data bytes at offset `off` (odd offsets make the
 * data unaligned), with canary bytes before and after, so writes outside
 * the data are seen. */
typedef struct tbuf {
  uint8_t *base;
  size_t off, len, total;
  uint64_t cseed; /* the canary is the fill_random stream of cseed */
} tbuf_t;
#define TBUF_PAD 64

void tbuf_alloc(tbuf_t *b, size_t len, size_t off, uint64_t cseed);
void tbuf_free(tbuf_t *b);
static inline uint8_t *tbuf_data(const tbuf_t *b) { return b->base + b->off; }
/* A copy of the buffer as allocated (canary everywhere), total bytes; the
 * caller writes the data it expects into it and compares with tbuf_diff. */
uint8_t *tbuf_pristine(const tbuf_t *b);
/* Offset from the data's start of the first byte that differs from
 * `expect` (negative: in the canary before it), or TBUF_SAME. */
#define TBUF_SAME ((long long)1 << 62)
long long tbuf_diff(const tbuf_t *b, const uint8_t *expect);

/* Waits until every rank reached the store barrier `name` (each name used
 * once), without using the library's collectives; 60 s deadline. */
void store_barrier(coll_ctx_t *ctx, const char *name);

/* Never NULL (exits); malloc(0) gives 1 byte so count 0 still has an
 * address. */
void *xmalloc(size_t len);

long long now_ms(void);
/* Sleeps ms milliseconds. */
void sleep_ms(int ms);

#endif
