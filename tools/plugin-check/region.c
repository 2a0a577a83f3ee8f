/* region.c - the suite's registrations, the peer's imported regions, and
 * the bytes of both, on host or CUDA memory (sess.h). */
#include <string.h>

#include "link.h"
#include "sess.h"

/* ------------------------------------------------------------ registrations */

/* Fails unless the registration wrote an rkey that fits the ABI's room and
 * nothing past the room it was given. */
static void check_rkey(const unsigned char *rkey, size_t room_total,
                       size_t rkey_len) {
  if (rkey_len > MEP_TP_MAX_RKEY)
    pc_fail("reg returned an rkey of %zu bytes, more than MEP_TP_MAX_RKEY "
            "(%d)",
            rkey_len, MEP_TP_MAX_RKEY);
  for (size_t i = MEP_TP_MAX_RKEY; i < room_total; i++)
    if (rkey[i] != PC_CANARY)
      pc_fail("reg wrote past the %d rkey bytes it was given (byte %zu)",
              MEP_TP_MAX_RKEY, i);
}

void pc_region_reg(pc_sess_t *s, pc_region_t *r, size_t len) {
  memset(r, 0, sizeof *r);
  pc_mem_require(s->mem, s->props.mem_kinds);
  r->mem = s->mem;
  r->ptr = pc_mem_alloc(r->mem, len);
  r->len = len;
  unsigned char rkey[MEP_TP_MAX_RKEY + 64];
  memset(rkey, PC_CANARY, sizeof rkey);
  size_t rkey_len = MEP_TP_MAX_RKEY;
  pc_call_begin("reg");
  int rc = s->tp->reg(s->ctx, r->ptr, len, pc_mem_kind(r->mem), &r->mr, rkey,
                      &rkey_len);
  pc_call_end();
  if (rc != 0)
    pc_fail("reg of %zu bytes of %s memory failed: %s", len,
            pc_mem_name(r->mem), pc_err(rc));
  check_rkey(rkey, sizeof rkey, rkey_len);
  memcpy(r->rkey, rkey, rkey_len);
  r->rkey_len = rkey_len;
}

void pc_region_free(pc_region_t *r) {
  if (r->ptr) pc_mem_free(r->mem, r->ptr);
  r->ptr = NULL;
}

void pc_region_dereg(pc_sess_t *s, pc_region_t *r) {
  pc_call_begin("dereg");
  int rc = s->tp->dereg(s->ctx, r->mr);
  pc_call_end();
  if (rc != 0)
    pc_fail("dereg of a region of %zu bytes failed: %s", r->len, pc_err(rc));
  pc_region_free(r);
}

/* ------------------------------------------------------------------ bytes */

/* Every access names a range of the region; one outside it is a bug of
 * the suite, not of the plugin. */
static void in_region(const pc_region_t *r, size_t off, size_t len) {
  if (off > r->len || len > r->len - off)
    pc_fail("internal: bytes [%zu, +%zu) of a region of %zu bytes", off, len,
            r->len);
}

static unsigned char *at(const pc_region_t *r, size_t off) {
  return (unsigned char *)r->ptr + off;
}

void pc_region_fill(const pc_region_t *r, size_t off, size_t len,
                    uint64_t seed, uint64_t start) {
  in_region(r, off, len);
  pc_mem_fill(r->mem, at(r, off), len, seed, start);
}

void pc_region_expect(const pc_region_t *r, size_t off, size_t len,
                      uint64_t seed, uint64_t start, const char *what) {
  in_region(r, off, len);
  pc_mem_expect(r->mem, at(r, off), len, seed, start, what);
}

void pc_region_read(const pc_region_t *r, size_t off, void *dst,
                    size_t len) {
  in_region(r, off, len);
  pc_mem_get(r->mem, dst, at(r, off), len);
}

unsigned char pc_region_byte(const pc_region_t *r, size_t off) {
  unsigned char b;
  pc_region_read(r, off, &b, 1);
  return b;
}

uint64_t pc_word(const pc_region_t *r, size_t off) {
  in_region(r, off, 8);
  return pc_mem_word(r->mem, at(r, off));
}

/* ---------------------------------------------------------------- sharing */

void pc_region_send(const pc_region_t *r) {
  unsigned char msg[8 + MEP_TP_MAX_RKEY];
  uint64_t len = r->len;
  memcpy(msg, &len, 8);
  memcpy(msg + 8, r->rkey, r->rkey_len);
  pc_link_send(PC_TAG_RKEY, msg, 8 + r->rkey_len);
}

void pc_region_import(pc_sess_t *s, pc_remote_t *rm) {
  unsigned char msg[8 + MEP_TP_MAX_RKEY];
  size_t n = pc_link_recv(PC_TAG_RKEY, msg, sizeof msg, "an rkey blob");
  if (n < 8) pc_fail("internal: short rkey message from rank %d", s->peer);
  memset(rm, 0, sizeof *rm);
  memcpy(&rm->len, msg, 8);
  pc_call_begin("import");
  int rc = s->tp->import(s->ep, msg + 8, n - 8, &rm->rmr);
  pc_call_end();
  if (rc != 0)
    pc_fail("import of rank %d's region of %llu bytes (rkey of %zu bytes) "
            "failed: %s",
            s->peer, (unsigned long long)rm->len, n - 8, pc_err(rc));
}

void pc_region_share(pc_sess_t *s, const pc_region_t *mine,
                     pc_remote_t *theirs) {
  pc_region_send(mine);
  pc_region_import(s, theirs);
}

void pc_remote_release(pc_sess_t *s, pc_remote_t *rm) {
  pc_call_begin("unimport");
  int rc = s->tp->unimport(s->ep, rm->rmr);
  pc_call_end();
  if (rc != 0) pc_fail("unimport failed: %s", pc_err(rc));
}
