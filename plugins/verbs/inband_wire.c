/*
 * inband_wire.c - what carries a signal that the receiver's poll()
 * applies (docs/verbs.md, "Signals applied by the receiver"): the 32-bit
 * immediate of an RDMA WRITE with immediate, and the SEND that defines a
 * signal word or carries what an immediate cannot. Pure functions:
 * unit-tested (and fuzzed) without a device.
 *
 * Immediate (host order; on the wire in network order, as verbs wants):
 *   bit 31      1: a signal follows (0: a wake-up only, nothing to apply)
 *   bit 30      the operation: 0 SET, 1 ADD
 *   bits 29..22 the word's index (defined earlier by a message)
 *   bits 21..0  ADD: the addend; SET: the new value minus the last value
 *               SET through that index (0 before any)
 *
 * Message (32 B, little-endian): u32 magic "MEPS", u8 type (1: signal),
 * u8 operation (0 SET, 1 ADD), u16 index (VERBS_NO_INDEX: none; else the
 * index this word has from now on), u32 rkey, u32 zero, u64 the word's
 * address in the receiver, u64 the value.
 */
#include <string.h>

#include "verbs.h"

#define VERBS_SIG_MAGIC 0x5350454du /* "MEPS" */
#define VERBS_SIG_TYPE 1

uint32_t mep__verbs_imm_encode(int op, unsigned index, uint32_t v) {
  return VERBS_IMM_SIGNAL | (op == MEP_SIGNAL_ADD ? 1u << 30 : 0) |
         (uint32_t)(index & (VERBS_WORDS - 1)) << VERBS_IMM_VALUE_BITS |
         (v & VERBS_IMM_VALUE_MAX);
}

int mep__verbs_imm_decode(uint32_t imm, int *op, unsigned *index,
                          uint32_t *v) {
  if (!(imm & VERBS_IMM_SIGNAL)) return 0;
  *op = imm & 1u << 30 ? MEP_SIGNAL_ADD : MEP_SIGNAL_SET;
  *index = imm >> VERBS_IMM_VALUE_BITS & (VERBS_WORDS - 1);
  *v = imm & VERBS_IMM_VALUE_MAX;
  return 1;
}

void mep__verbs_sigmsg_encode(uint8_t out[VERBS_SIGMSG_LEN],
                              const mep__verbs_sigmsg_t *m) {
  memset(out, 0, VERBS_SIGMSG_LEN);
  mep__rdma_put32(out, VERBS_SIG_MAGIC);
  out[4] = VERBS_SIG_TYPE;
  out[5] = (uint8_t)m->op;
  mep__rdma_put16(out + 6, m->index);
  mep__rdma_put32(out + 8, m->rkey);
  mep__rdma_put64(out + 16, m->raddr);
  mep__rdma_put64(out + 24, m->value);
}

int mep__verbs_sigmsg_decode(const void *buf, size_t len,
                             mep__verbs_sigmsg_t *m, char *why,
                             size_t why_len) {
  const uint8_t *in = buf;
  const char *what = NULL;
  if (!buf || len != VERBS_SIGMSG_LEN)
    what = "its length is not 32 bytes";
  else if (mep__rdma_get32(in) != VERBS_SIG_MAGIC)
    what = "it is not a verbs signal (magic)";
  else if (in[4] != VERBS_SIG_TYPE)
    what = "an unknown message type";
  else if (in[5] != MEP_SIGNAL_SET && in[5] != MEP_SIGNAL_ADD)
    what = "an unknown signal operation";
  else if (mep__rdma_get32(in + 12))
    what = "nonzero padding";
  if (what)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL, "bad signal "
                         "message (%zu bytes): %s", len, what);
  m->op = in[5];
  m->index = mep__rdma_get16(in + 6);
  m->rkey = mep__rdma_get32(in + 8);
  m->raddr = mep__rdma_get64(in + 16);
  m->value = mep__rdma_get64(in + 24);
  if (m->index != VERBS_NO_INDEX && m->index >= VERBS_WORDS)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL, "bad signal "
                         "message: word index %u (at most %d)", m->index,
                         VERBS_WORDS - 1);
  if (m->raddr % 8)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL, "bad signal "
                         "message: the word at %#llx is not 8-byte aligned",
                         (unsigned long long)m->raddr);
  return 0;
}
