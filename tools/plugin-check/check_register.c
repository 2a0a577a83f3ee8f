/* check_register.c - registration, import, and what deregistration means
 * for a peer's later writes. */
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "link.h"
#include "pattern.h"
#include "sess.h"

#define PC_CTL_LEN 4096

/* ----------------------------------------------------------- register */

enum { N_REGS = 3 };

static uint64_t bg_seed(const pc_worker_t *w, int rank, int i) {
  return pc_seed_for(w->seed, 0xb6, (uint64_t)rank, (uint64_t)i);
}

/* Rank `rank` writes byte k of this stream to its peer's regions. */
static uint64_t src_seed(const pc_worker_t *w, int rank) {
  return pc_seed_for(w->seed, 0x5c, (uint64_t)rank, 0);
}

static unsigned char stream_byte(uint64_t seed, uint64_t i) {
  unsigned char b;
  pc_fill(&b, 1, seed, i);
  return b;
}

static void expect_byte(const pc_region_t *r, size_t at, unsigned char want,
                        int i) {
  unsigned char got = pc_region_byte(r, at);
  if (got != want)
    pc_fail("byte %zu of registered region %d (%zu bytes) is 0x%02x after "
            "the peer's write, want 0x%02x",
            at, i, r->len, got, want);
}

/* reg of a memory kind that props leaves out must be refused. Host memory
 * offered as CUDA memory may also be refused as MEP_ERR_INVALID (it is not
 * CUDA memory); real host memory offered to a plugin without host memory
 * is MEP_ERR_UNSUPPORTED. */
static void refused_kind(pc_sess_t *s, mep_memkind_t kind, int invalid_ok) {
  const char *name = kind == MEP_MEM_CUDA ? "MEP_MEM_CUDA" : "MEP_MEM_HOST";
  unsigned char host[4096];
  memset(host, 0, sizeof host);
  mep_tp_mr_t *mr = NULL;
  unsigned char rkey[MEP_TP_MAX_RKEY];
  size_t rkey_len = sizeof rkey;
  pc_call_begin("reg");
  int rc = s->tp->reg(s->ctx, host, sizeof host, kind, &mr, rkey, &rkey_len);
  pc_call_end();
  if (rc == 0)
    pc_fail("reg accepted %s memory although props does not list it "
            "(mem_kinds 0x%x)",
            name, s->props.mem_kinds);
  if (rc != MEP_ERR_UNSUPPORTED && !(invalid_ok && rc == MEP_ERR_INVALID))
    pc_fail("reg of %s memory (not in props) returned %s; want "
            "MEP_ERR_UNSUPPORTED",
            name, pc_err(rc));
}

static void reg_unhandled_refused(pc_sess_t *s) {
  if (!(s->props.mem_kinds & MEP_TP_MEM_CUDA))
    refused_kind(s, MEP_MEM_CUDA, 1);
  if (!(s->props.mem_kinds & MEP_TP_MEM_HOST))
    refused_kind(s, MEP_MEM_HOST, 0);
}

void pc_check_register(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  pc_rng_t rng;
  pc_rng_seed(&rng, pc_seed_for(w->seed, 0x4e, 0, 0));
  size_t sizes[N_REGS] = {1, 2 * (size_t)pc_rng_range(&rng, 500, 50000) + 1,
                          (size_t)pc_big_size(w)};
  pc_region_t ctl, src, reg[N_REGS];
  pc_remote_t rctl, rreg[N_REGS];
  pc_region_reg(&s, &ctl, PC_CTL_LEN);
  pc_region_reg(&s, &src, PC_CTL_LEN);
  pc_region_fill(&src, 0, src.len, src_seed(w, w->rank), 0);
  for (int i = 0; i < N_REGS; i++) {
    pc_region_reg(&s, &reg[i], sizes[i]);
    pc_region_fill(&reg[i], 0, sizes[i], bg_seed(w, w->rank, i), 0);
    pc_info("rank %d: region of %zu bytes has an rkey of %zu bytes",
            w->rank, sizes[i], reg[i].rkey_len);
  }
  for (int i = 0; i < N_REGS; i++)
    for (int j = i + 1; j < N_REGS; j++)
      if (reg[i].rkey_len == reg[j].rkey_len &&
          memcmp(reg[i].rkey, reg[j].rkey, reg[i].rkey_len) == 0)
        pc_fail("regions of %zu and %zu bytes got the same rkey blob; a "
                "peer cannot tell them apart",
                sizes[i], sizes[j]);

  pc_region_share(&s, &ctl, &rctl);
  for (int i = 0; i < N_REGS; i++) {
    pc_region_share(&s, &reg[i], &rreg[i]);
    if (rreg[i].len != sizes[i])
      pc_fail("internal: the peer's region %d is %llu bytes, want %zu", i,
              (unsigned long long)rreg[i].len, sizes[i]);
  }

  /* The first and the last byte of each of the peer's regions. */
  for (int i = 0; i < N_REGS; i++) {
    pc_write(&s, &src, (uint64_t)(2 * i), &rreg[i], 0, 1);
    if (sizes[i] > 1)
      pc_write(&s, &src, (uint64_t)(2 * i + 1), &rreg[i], sizes[i] - 1, 1);
  }
  pc_signal(&s, &rctl, 0, 1, MEP_SIGNAL_ADD);
  pc_wait_word(&s, &ctl, 0, 1, "the signal after writes to the regions");
  uint64_t peer_src = src_seed(w, s.peer);
  for (int i = 0; i < N_REGS; i++) {
    expect_byte(&reg[i], 0, stream_byte(peer_src, (uint64_t)(2 * i)), i);
    if (sizes[i] == 1) continue;
    expect_byte(&reg[i], sizes[i] - 1,
                stream_byte(peer_src, (uint64_t)(2 * i + 1)), i);
    pc_region_expect(&reg[i], 1, sizes[i] - 2, bg_seed(w, w->rank, i), 1,
                     "the bytes between the first and the last (not written)");
  }
  pc_wait_all(&s, "the writes to the regions");
  reg_unhandled_refused(&s);

  pc_link_barrier(1, "the barrier before dereg");
  for (int i = 0; i < N_REGS; i++) {
    pc_remote_release(&s, &rreg[i]);
    pc_region_dereg(&s, &reg[i]);
  }
  pc_remote_release(&s, &rctl);
  pc_region_dereg(&s, &src);
  pc_region_dereg(&s, &ctl);
  pc_sess_close(&s);
}

/* -------------------------------------------------------------- dereg */

#define PC_DEREG_LEN 65537u
#define PC_DEREG_WRITE 4097u

/* 1 if the region holds the background but for the peer's write of
 * PC_DEREG_WRITE bytes of `data` at offset 1. */
static int landed_in_place(const pc_region_t *a, uint64_t bg,
                           uint64_t data) {
  unsigned char *copy = malloc(a->len);
  if (!copy) pc_fail("out of memory for a copy of %zu bytes", a->len);
  pc_region_read(a, 0, copy, a->len);
  const size_t end = 1 + PC_DEREG_WRITE;
  size_t at;
  unsigned char want;
  int ok = !pc_diff(copy, 1, bg, 0, &at, &want) &&
           !pc_diff(copy + 1, PC_DEREG_WRITE, data, 0, &at, &want) &&
           !pc_diff(copy + end, a->len - end, bg, end, &at, &want);
  free(copy);
  return ok;
}

/* Rank 1: deregisters a region rank 0 then writes to. A plugin that maps
 * the peer's memory (MEP_DEV_PTR, like nvlink over CUDA IPC) cannot take
 * the mapping back from the importer: the write may land, but exactly
 * where it was aimed. */
static void dereg_receiver(pc_sess_t *s, uint64_t bg, uint64_t data) {
  pc_region_t a, ctl;
  pc_region_reg(s, &a, PC_DEREG_LEN);
  pc_region_reg(s, &ctl, PC_CTL_LEN);
  pc_region_fill(&a, 0, a.len, bg, 0);
  pc_region_send(&a);
  pc_region_send(&ctl);
  /* First, the path works while the region is registered. */
  pc_wait_word(s, &ctl, 0, 1, "the signal after a write before dereg");
  pc_region_expect(&a, 1, PC_DEREG_WRITE, data, 0,
                   "a write to the region while it was registered");
  pc_region_fill(&a, 0, a.len, bg, 0);

  s->allow_failures = 1;
  pc_call_begin("dereg");
  int rc = s->tp->dereg(s->ctx, a.mr);
  pc_call_end();
  if (rc != 0) pc_fail("dereg failed: %s", pc_err(rc));
  pc_link_barrier(1, "the barrier after dereg");

  /* The peer's signal follows its write; if it arrives, the write was
   * handled before it. A plugin may instead drop the peer: then a failure
   * naming it arrives. Either way the region must be as it was. */
  int64_t deadline = pc_now_ms() + s->w->opts->timeout_ms;
  const char *how = NULL;
  while (!how) {
    if (pc_word(&ctl, 0) >= 2) how = "the signal after it arrived";
    else if (s->n_fails > 0) how = "the receiver reported the peer failed";
    int n = pc_progress(s);
    if (pc_now_ms() > deadline)
      pc_fail("timed out after %d ms: after a write to a deregistered "
              "region, neither the signal that follows it nor a failure "
              "report naming rank %d arrived",
              s->w->opts->timeout_ms, s->peer);
    pc_relax(s, n);
  }
  int64_t grace = pc_now_ms() + 50;
  while (pc_now_ms() < grace) pc_relax(s, pc_progress(s));
  int in_place = pc_sess_maps_peer(s) && landed_in_place(&a, bg, data);
  if (!in_place)
    pc_region_expect(&a, 0, a.len, bg, 0,
                     "the deregistered region after the peer wrote to it "
                     "(the write landed)");
  pc_info("rank 1: the write to the deregistered region %s; %s%s%s",
          in_place ? "landed where it was aimed (the plugin maps the peer's "
                     "memory: the owner cannot revoke it)"
                   : "did not land",
          how, s->n_fails ? ": " : "",
          s->n_fails ? mep_strerror(s->fails[0].status) : "");
  /* Freed only once the peer let go of its import (the writer unimports
   * before this barrier): the memory of a mapped region must outlive its
   * mappings. */
  pc_link_barrier(1, "the end of the check");
  pc_region_free(&a);
  pc_link_barrier(0, "the barrier before close");
  pc_region_dereg(s, &ctl);
}

/* Rank 0: writes to rank 1's region before and after its dereg. */
static void dereg_writer(pc_sess_t *s, uint64_t data) {
  pc_region_t src;
  pc_remote_t ra, rctl;
  pc_region_reg(s, &src, PC_DEREG_WRITE);
  pc_region_fill(&src, 0, src.len, data, 0);
  pc_region_import(s, &ra);
  pc_region_import(s, &rctl);
  pc_write(s, &src, 0, &ra, 1, PC_DEREG_WRITE);
  pc_signal(s, &rctl, 0, 1, MEP_SIGNAL_ADD);
  pc_wait_all(s, "the write before dereg");
  pc_link_barrier(1, "the barrier after dereg");

  s->allow_failures = 1;
  int rc = pc_try_write(s, &src, 0, &ra, 1, PC_DEREG_WRITE, s->next_token++);
  if (rc != 0)
    pc_info("rank 0: the write to the deregistered region was refused "
            "locally: %s",
            pc_err(rc));
  rc = pc_try_signal(s, &rctl, 0, 1, MEP_SIGNAL_ADD);
  if (rc != 0) pc_info("rank 0: the signal after it: %s", pc_err(rc));
  pc_wait_all(s, "the write to the deregistered region");
  pc_remote_release(s, &ra);
  pc_link_barrier(1, "the end of the check");
  pc_link_barrier(0, "the barrier before close");
  pc_remote_release(s, &rctl);
  pc_region_dereg(s, &src);
}

void pc_check_dereg(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_open(&s, w);
  uint64_t bg = pc_seed_for(w->seed, 0xde, 1, 0);
  uint64_t data = pc_seed_for(w->seed, 0xde, 2, 0);
  if (w->rank == 1)
    dereg_receiver(&s, bg, data);
  else
    dereg_writer(&s, data);
  pc_sess_close_alone(&s, 0);
}
