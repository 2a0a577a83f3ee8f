/* desc_reach.c - what a MEP_DEV_PTR region part promises, tried on the
 * GPU: a kernel of this process loads the peer's region through `base`
 * and gets exactly the bytes the peer put there, and its stores through
 * `base` land in the peer's region, where they were aimed and nowhere
 * else. Both ranks do both at once, on CUDA memory. */
#include "desc_reach.h"

#include <stdio.h>

#include "link.h"
#include "mem_cuda.h"
#include "pattern.h"

/* The peer stores `len` bytes of stream `seed` at `off` of the region. */
typedef struct store {
  uint64_t off, len, seed;
} store_t;

/* Odd offset and odd length, so that neither is a multiple of any
 * vector width; both ranks derive each other's. */
static store_t store_of(const pc_worker_t *w, int from, uint64_t region_len) {
  pc_rng_t g;
  pc_rng_seed(&g, pc_seed_for(w->seed, 0xd5, (uint64_t)from, 0));
  store_t st;
  st.seed = pc_rng_next(&g);
  st.off = 2 * pc_rng_range(&g, 0, 2047) + 1;
  st.len = 2 * pc_rng_range(&g, 0, (region_len - st.off - 2) / 2) + 1;
  return st;
}

static void load_through(const pc_reach_t *r, void *scratch) {
  pc_cuda_kernel_copy(scratch, (const void *)(uintptr_t)r->base,
                      r->peer_len);
  char what[200];
  snprintf(what, sizeof what,
           "rank %d's region of %llu bytes as a kernel loads it through the "
           "region part's base 0x%llx",
           r->s->peer, (unsigned long long)r->peer_len,
           (unsigned long long)r->base);
  pc_mem_expect(PC_MEM_CUDA, scratch, r->peer_len, r->peer_seed, 0, what);
}

static void store_through(const pc_reach_t *r, void *scratch) {
  store_t st = store_of(r->s->w, r->s->w->rank, r->peer_len);
  pc_mem_fill(PC_MEM_CUDA, scratch, st.len, st.seed, 0);
  pc_cuda_kernel_copy((unsigned char *)(uintptr_t)r->base + st.off, scratch,
                      st.len);
}

/* The own region after the peer's stores: its own stream but for them. */
static void expect_peer_store(const pc_reach_t *r) {
  const pc_region_t *m = r->mine;
  store_t st = store_of(r->s->w, r->s->peer, m->len);
  char what[240];
  snprintf(what, sizeof what,
           "the %llu bytes rank %d's kernel stored at offset %llu of this "
           "region through its base",
           (unsigned long long)st.len, r->s->peer,
           (unsigned long long)st.off);
  pc_region_expect(m, st.off, st.len, st.seed, 0, what);
  uint64_t end = st.off + st.len;
  pc_region_expect(m, 0, st.off, r->my_seed, 0,
                   "the bytes before the peer's store through base (a store "
                   "landed elsewhere)");
  pc_region_expect(m, end, m->len - end, r->my_seed, end,
                   "the bytes after the peer's store through base (a store "
                   "landed elsewhere)");
}

void pc_desc_reach(const pc_reach_t *r) {
  void *scratch = pc_mem_alloc(PC_MEM_CUDA, r->peer_len);
  load_through(r, scratch);
  /* Neither stores before both have loaded the other's untouched bytes. */
  pc_link_barrier(1, "the barrier after the loads through base");
  store_through(r, scratch);
  /* The kernel has finished (and fenced) when store_through returns. */
  pc_link_barrier(1, "the barrier after the stores through base");
  expect_peer_store(r);
  pc_mem_free(PC_MEM_CUDA, scratch);
  pc_info("rank %d: a kernel loaded rank %d's %llu bytes through base 0x%llx "
          "and stored into them",
          r->s->w->rank, r->s->peer, (unsigned long long)r->peer_len,
          (unsigned long long)r->base);
}
