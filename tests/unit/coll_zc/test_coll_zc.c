/* Zero-copy sends of the collective engine (coll.c, lreg.c): chunks of at
 * least 64 KiB (or a whole chunk_bytes, if smaller) leave straight from the
 * caller's buffer, registered locally and cached by exact (address,
 * length).
 *
 * On forked ranks (usage: test_coll_zc NRANKS [KEY=VALUE...], set in the
 * ranks' environment; 64 KiB chunks by default here), every
 * result is checked element by element against a reference each rank
 * computes alone from the generator every rank fills its input with:
 *   sizes   all-reduce (two-shot and one-shot), broadcast, all-to-all,
 *           all-gather, reduce-scatter at 0, 1, odd counts around the
 *           chunk and threshold, and several MiB; buffers off by one byte
 *           from any alignment; in-place all-reduce
 *   reuse   one buffer across calls with new contents: registered once
 *   alias   one address with another length (a buffer freed and another
 *           allocated there, made certain with an arena): a registration
 *           of its own, never the old one
 *   evict   more buffers than the cache holds, then the first again
 *   pinned  with the transports marked as pinning pages (not
 *           reg_by_address), nothing is registered and every chunk is
 *           staged: results still right
 *   path    large chunks did take the zero-copy path, small ones did not;
 *           chunks of copy steps landed straight in receivers' buffers
 *           (every chunk a sender sends after a receiver's first credit:
 *           the receiver's landing message precedes it), reductions never
 *   aside   an in-place two-shot all-reduce copied its input aside whole
 *           while it ran, and landed its second step's chunks
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "coll.h"
#include "copier.h"
#include "launch.h"

#define CHUNK 65536

static uint64_t writes_now(mep_comm_t *comm, int *entries,
                           unsigned long *made) {
  uint64_t w;
  int e;
  unsigned long m;
  mep__coll_zc_stats(comm, &w, &e, &m);
  if (entries) *entries = e;
  if (made) *made = m;
  return w;
}

/* Element i of rank r's input in call `tag`: small integers, so float32
 * sums are exact in any order. */
static int32_t val(int r, size_t i, int tag) {
  return (int32_t)((i * 7 + (size_t)r * 13 + (size_t)tag * 5) % 1000) - 500;
}

static void fill_i32(void *buf, size_t count, int r, int tag) {
  for (size_t i = 0; i < count; i++) {
    int32_t v = val(r, i, tag);
    memcpy((uint8_t *)buf + i * 4, &v, 4);
  }
}

static int32_t get_i32(const void *buf, size_t i) {
  int32_t v;
  memcpy(&v, (const uint8_t *)buf + i * 4, 4);
  return v;
}

/* A buffer of `bytes` at an address one byte past 64-byte alignment. */
static uint8_t *odd_alloc(size_t bytes, void **base) {
  *base = malloc(bytes + 65);
  CHECK(*base, "out of memory");
  return (uint8_t *)(((uintptr_t)*base + 63) & ~(uintptr_t)63) + 1;
}

static void check_allreduce(mep_comm_t *comm, size_t count, int inplace,
                            int tag) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  void *b1, *b2;
  uint8_t *in = odd_alloc(count * 4, &b1), *out = odd_alloc(count * 4, &b2);
  fill_i32(in, count, me, tag);
  if (inplace) out = in;
  CHECK_OK(mep_allreduce(comm, in, out, count, MEP_INT32, MEP_SUM, NULL));
  for (size_t i = 0; i < count; i++) {
    int32_t want = 0;
    for (int r = 0; r < n; r++) want += val(r, i, tag);
    CHECK(get_i32(out, i) == want, "rank %d: allreduce count %zu%s element "
          "%zu: %d, want %d", me, count, inplace ? " in place" : "", i,
          get_i32(out, i), want);
  }
  free(b1);
  free(b2);
}

static void check_broadcast(mep_comm_t *comm, size_t bytes, int root,
                            int tag) {
  int me = mep_comm_rank(comm);
  void *b;
  uint8_t *buf = odd_alloc(bytes, &b);
  for (size_t i = 0; i < bytes; i++)
    buf[i] = me == root ? (uint8_t)(i * 31 + (size_t)tag) : 0xee;
  CHECK_OK(mep_broadcast(comm, buf, bytes, MEP_UINT8, root, NULL));
  for (size_t i = 0; i < bytes; i++)
    CHECK(buf[i] == (uint8_t)(i * 31 + (size_t)tag), "rank %d: broadcast of "
          "%zu from %d: byte %zu is %u", me, bytes, root, i, buf[i]);
  free(b);
}

/* Byte i of the block rank s sends rank d. */
static uint8_t a2a(int s, int d, size_t i) {
  return (uint8_t)(i * 3 + (size_t)s * 41 + (size_t)d * 7);
}

static void check_alltoall(mep_comm_t *comm, size_t bytes) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  void *b1, *b2;
  uint8_t *in = odd_alloc(bytes * (size_t)n, &b1);
  uint8_t *out = odd_alloc(bytes * (size_t)n, &b2);
  for (int d = 0; d < n; d++)
    for (size_t i = 0; i < bytes; i++) in[(size_t)d * bytes + i] = a2a(me, d, i);
  CHECK_OK(mep_alltoall(comm, in, out, bytes, MEP_UINT8, NULL));
  for (int s = 0; s < n; s++)
    for (size_t i = 0; i < bytes; i++)
      CHECK(out[(size_t)s * bytes + i] == a2a(s, me, i), "rank %d: alltoall "
            "of %zu: byte %zu from %d", me, bytes, i, s);
  free(b1);
  free(b2);
}

static void check_allgather(mep_comm_t *comm, size_t bytes) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  void *b1, *b2;
  uint8_t *in = odd_alloc(bytes, &b1);
  uint8_t *out = odd_alloc(bytes * (size_t)n, &b2);
  for (size_t i = 0; i < bytes; i++) in[i] = a2a(me, 0, i);
  CHECK_OK(mep_allgather(comm, in, out, bytes, MEP_UINT8, NULL));
  for (int s = 0; s < n; s++)
    for (size_t i = 0; i < bytes; i++)
      CHECK(out[(size_t)s * bytes + i] == a2a(s, 0, i), "rank %d: allgather "
            "of %zu: byte %zu from %d", me, bytes, i, s);
  free(b1);
  free(b2);
}

static void check_reduce_scatter(mep_comm_t *comm, size_t count) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  void *b1, *b2;
  uint8_t *in = odd_alloc(count * 4 * (size_t)n, &b1);
  uint8_t *out = odd_alloc(count * 4, &b2);
  fill_i32(in, count * (size_t)n, me, 9);
  CHECK_OK(mep_reduce_scatter(comm, in, out, count, MEP_INT32, MEP_SUM, NULL));
  for (size_t i = 0; i < count; i++) {
    int32_t want = 0;
    for (int r = 0; r < n; r++) want += val(r, (size_t)me * count + i, 9);
    CHECK(get_i32(out, i) == want, "rank %d: reduce_scatter %zu: element "
          "%zu: %d, want %d", me, count, i, get_i32(out, i), want);
  }
  free(b1);
  free(b2);
}

static void sizes(mep_comm_t *comm) {
  const size_t c4 = CHUNK / 4; /* elements of int32 in a chunk */
  const size_t counts[] = {0, 1, 1001, c4 - 1, c4, c4 + 1, 3 * c4 + 7,
                           (5u << 20) / 4 + 3};
  for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
    check_allreduce(comm, counts[k], 0, (int)k);
    check_allreduce(comm, counts[k], 1, (int)k + 100);
    check_reduce_scatter(comm, counts[k]);
    check_broadcast(comm, counts[k] * 4 + 1, (int)k % mep_comm_size(comm),
                    (int)k);
    check_alltoall(comm, counts[k] + 3);
    check_allgather(comm, counts[k] * 2 + 1);
  }
}

/* One buffer, new contents each call: one registration for it. */
static void reuse(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  size_t count = 200001;
  int32_t *in = malloc(count * 4), *out = malloc(count * 4);
  CHECK(in && out, "out of memory");
  unsigned long made0 = 0, made;
  for (int call = 0; call < 4; call++) {
    fill_i32(in, count, me, 50 + call);
    CHECK_OK(mep_allreduce(comm, in, out, count, MEP_INT32, MEP_SUM, NULL));
    for (size_t i = 0; i < count; i++) {
      int32_t want = 0;
      for (int r = 0; r < n; r++) want += val(r, i, 50 + call);
      CHECK(out[i] == want, "rank %d: reused buffer, call %d, element %zu: "
            "%d, want %d", me, call, i, out[i], want);
    }
    writes_now(comm, NULL, &made);
    if (call == 0) made0 = made;
  }
  CHECK(made == made0, "rank %d: a reused buffer was registered again (%lu "
        "registrations, %lu after its first call)", me, made, made0);
  free(in);
  free(out);
}

/* The same address with another length, and other contents: the cache
 * must register it afresh (a stale registration of the old length would be
 * wrong for a transport that pins pages). */
static void alias(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  size_t big = 300007, small = 170003;
  int32_t *arena = malloc(big * 4), *out = malloc(big * 4);
  CHECK(arena && out, "out of memory");
  size_t lens[] = {big, small, big, small / 2 + 1};
  for (int k = 0; k < 4; k++) {
    unsigned long before, after;
    writes_now(comm, NULL, &before);
    fill_i32(arena, lens[k], me, 70 + k);
    CHECK_OK(mep_allreduce(comm, arena, out, lens[k], MEP_INT32, MEP_SUM,
                           NULL));
    writes_now(comm, NULL, &after);
    for (size_t i = 0; i < lens[k]; i++) {
      int32_t want = 0;
      for (int r = 0; r < n; r++) want += val(r, i, 70 + k);
      CHECK(out[i] == want, "rank %d: length %zu at a reused address: "
            "element %zu: %d, want %d", me, lens[k], i, out[i], want);
    }
    /* new lengths register both buffers; the same (address, length) as
     * before finds them */
    int fresh = k != 2;
    CHECK(fresh ? after > before : after == before, "rank %d: %zu elements "
          "at a reused address: %lu registrations before, %lu after", me,
          lens[k], before, after);
  }
  free(arena);
  free(out);
}

/* More buffers than the cache holds, then the first again. */
static void evict(mep_comm_t *comm) {
  enum { NBUF = 12 };
  int32_t *bufs[NBUF];
  size_t count = 70001;
  for (int b = 0; b < NBUF; b++) {
    bufs[b] = malloc(count * 4);
    CHECK(bufs[b], "out of memory");
  }
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  unsigned long made[2];
  for (int round = 0; round < 2; round++) {
    for (int b = 0; b < NBUF; b++) {
      int tag = 200 + round * NBUF + b;
      fill_i32(bufs[b], count, me, tag);
      CHECK_OK(mep_allreduce(comm, bufs[b], bufs[b], count, MEP_INT32,
                             MEP_MAX, NULL));
      for (size_t i = 0; i < count; i++) {
        int32_t want = val(0, i, tag);
        for (int r = 1; r < n; r++)
          if (val(r, i, tag) > want) want = val(r, i, tag);
        CHECK(bufs[b][i] == want, "rank %d: buffer %d round %d element %zu",
              me, b, round, i);
      }
    }
    writes_now(comm, NULL, &made[round]);
  }
  int entries;
  writes_now(comm, &entries, NULL);
  CHECK(entries <= 8, "rank %d: the cache holds %d entries", me, entries);
  /* cycling through more buffers than it holds, each was evicted before
   * its turn came again, and registered anew */
  CHECK(made[1] - made[0] == NBUF, "rank %d: %lu registrations in the "
          "second round over %d buffers", me, made[1] - made[0], NBUF);
  for (int b = 0; b < NBUF; b++) free(bufs[b]);
}

/* As if every transport pinned pages: callers' buffers stay unregistered. */
static void pinned(mep_comm_t *comm) {
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  int was[16];
  CHECK(comm->ntps <= 16, "%d transports", comm->ntps);
  for (int i = 0; i < comm->ntps; i++) {
    was[i] = comm->tps[i].props.reg_by_address;
    comm->tps[i].props.reg_by_address = 0;
  }
  size_t count = 150001;
  int32_t *in = malloc(count * 4), *out = malloc(count * 4);
  CHECK(in && out, "out of memory");
  int entries0, entries;
  unsigned long made0, made;
  uint64_t w0 = writes_now(comm, &entries0, &made0);
  for (int call = 0; call < 3; call++) {
    fill_i32(in, count, me, 300 + call);
    CHECK_OK(mep_allreduce(comm, in, out, count, MEP_INT32, MEP_SUM, NULL));
    for (size_t i = 0; i < count; i++) {
      int32_t want = 0;
      for (int r = 0; r < n; r++) want += val(r, i, 300 + call);
      CHECK(out[i] == want, "rank %d: pinned, call %d, element %zu: %d, "
            "want %d", me, call, i, out[i], want);
    }
  }
  uint64_t w = writes_now(comm, &entries, &made);
  CHECK(made == made0 && entries == entries0 && w == w0, "rank %d: "
        "pinned: %lu registrations for 3 calls (want 0), cache %d -> %d "
        "entries, %llu zero-copy writes (want 0)", me, made - made0, entries0,
        entries, (unsigned long long)(w - w0));
  for (int i = 0; i < comm->ntps; i++)
    comm->tps[i].props.reg_by_address = was[i];
  free(in);
  free(out);
}

/* Large chunks went out zero-copy; a message below the threshold did not. */
static void path(mep_comm_t *comm) {
  int me = mep_comm_rank(comm);
  uint64_t w0 = writes_now(comm, NULL, NULL);
  check_allreduce(comm, 1001, 0, 1);
  check_alltoall(comm, 100);
  uint64_t w1 = writes_now(comm, NULL, NULL);
  CHECK(w1 == w0, "rank %d: %llu zero-copy writes for small messages", me,
        (unsigned long long)(w1 - w0));
  uint64_t l1 = mep__coll_landed(comm);
  check_alltoall(comm, 4 * CHUNK);
  uint64_t w2 = writes_now(comm, NULL, NULL), l2 = mep__coll_landed(comm);
  uint64_t peers = (uint64_t)(mep_comm_size(comm) - 1);
  /* 4 chunks to each peer */
  CHECK(w2 - w1 == 4u * peers, "rank %d: %llu zero-copy writes for an "
        "all-to-all of 4 chunks per peer", me, (unsigned long long)(w2 - w1));
  /* chunks 2 and 3 wait for credits, which follow the landing message */
  CHECK(l2 - l1 >= 2u * peers && l2 - l1 <= 4u * peers, "rank %d: %llu of "
        "%llu chunks landed in the receivers' buffers", me,
        (unsigned long long)(l2 - l1), (unsigned long long)(4u * peers));
  check_reduce_scatter(comm, 4 * CHUNK);
  CHECK(mep__coll_landed(comm) == l2, "rank %d: a reduction's chunks landed "
        "in a receiver's buffer", me);
}

/* In place, a two-shot all-reduce copies its input aside (with the copy
 * thread, while its first step runs, here made 20 ms late, so that the
 * first step's reductions wait before they overwrite this rank's block):
 * by its end all of it is aside as the caller passed it (a retry over
 * survivors starts from there), and the chunks of its second step landed
 * in the caller's buffer. */
static void aside(mep_comm_t *comm) {
  mep__copier_delay_us = 20000;
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  size_t count = (size_t)n * (6 * CHUNK / 4) + 13, bytes = count * 4;
  uint8_t *buf = malloc(bytes), *orig = malloc(bytes);
  CHECK(buf && orig, "out of memory");
  fill_i32(orig, count, me, 400);
  memcpy(buf, orig, bytes);
  uint64_t l0 = mep__coll_landed(comm);
  CHECK_OK(mep_allreduce(comm, buf, buf, count, MEP_INT32, MEP_SUM, NULL));
  for (size_t i = 0; i < count; i++) {
    int32_t want = 0;
    for (int r = 0; r < n; r++) want += val(r, i, 400);
    CHECK(get_i32(buf, i) == want, "rank %d: in-place allreduce element "
          "%zu: %d, want %d", me, i, get_i32(buf, i), want);
  }
  const uint8_t *a;
  size_t cap;
  mep__coll_aside(comm, &a, &cap);
  CHECK(a && cap >= bytes && !memcmp(a, orig, bytes), "rank %d: the "
        "in-place input is not all aside as it was passed", me);
  CHECK(mep__coll_landed(comm) > l0, "rank %d: no chunk of the in-place "
        "all-reduce's second step landed in the caller's buffer", me);
  free(buf);
  free(orig);
  mep__copier_delay_us = 0;
}

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  (void)arg;
  const char *chunk = getenv("MEP_CORE_CHUNK_BYTES");
  sizes(comm);
  reuse(comm);
  alias(comm);
  evict(comm);
  if (atoll(chunk) == CHUNK) path(comm);
  aside(comm);
  pinned(comm);
  uint64_t w = writes_now(comm, NULL, NULL);
  CHECK(w > 0, "rank %d: no zero-copy writes", mep_comm_rank(comm));
  printf("rank %d: %llu zero-copy writes\n", mep_comm_rank(comm),
         (unsigned long long)w);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  setenv("MEP_CORE_CHUNK_BYTES", "65536", 0);
  for (int i = 2; i < argc; i++) {
    char *eq = strchr(argv[i], '=');
    CHECK(eq, "argument %s is not KEY=VALUE", argv[i]);
    *eq = 0;
    setenv(argv[i], eq + 1, 1);
  }
  mep_launch_opts_t o = {.size = n, .timeout_ms = 240000, .name = "collzc"};
  int bad = mep_launch(&o, body, NULL);
  printf("%d passed, %d failed\n", bad ? 0 : 1, bad ? 1 : 0);
  return bad ? 1 : 0;
}
