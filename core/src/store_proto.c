/* store_proto.c - encoding and the pure, allocation-free decoder of the TCP
 * store's frames (format in store_proto.h). */
#include "store_proto.h"

#include <stdio.h>
#include <string.h>

void mep__store_put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void mep__store_put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

uint32_t mep__store_get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

uint64_t mep__store_get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

uint32_t mep__store_check(const uint8_t *hdr) {
  uint32_t h = 2166136261U;
  for (int i = 0; i < 24; i++) {
    h ^= hdr[i];
    h *= 16777619U;
  }
  return h;
}

void mep__store_encode_header(uint8_t out[MEP__STORE_HDR_LEN],
                              const mep__store_hdr_t *hdr) {
  mep__store_put_u32(out, MEP__STORE_MAGIC);
  out[4] = MEP__STORE_VERSION;
  out[5] = hdr->op;
  out[6] = (uint8_t)hdr->flags;
  out[7] = (uint8_t)(hdr->flags >> 8);
  mep__store_put_u32(out + 8, hdr->seq);
  mep__store_put_u32(out + 12, hdr->key_len);
  mep__store_put_u64(out + 16, hdr->val_len);
  mep__store_put_u32(out + 24, mep__store_check(out));
}

static int op_known(uint8_t op, mep__store_dir_t dir) {
  if (dir == MEP__STORE_REQUEST)
    return op >= MEP__STORE_SET && op <= MEP__STORE_CHECK;
  return op == MEP__STORE_OK || op == MEP__STORE_ERR;
}

/* The bytes that arrived so far must be a prefix of some valid header. */
static const char *check_prefix(const uint8_t *b, size_t len,
                                mep__store_dir_t dir) {
  uint8_t magic[4];
  mep__store_put_u32(magic, MEP__STORE_MAGIC);
  size_t n = len < 4 ? len : 4;
  if (memcmp(b, magic, n) != 0) return "bad magic (not a mep store client)";
  if (len > 4 && b[4] != MEP__STORE_VERSION) return "unknown protocol version";
  if (len > 5 && !op_known(b[5], dir)) return "unknown operation";
  return NULL;
}

static const char *check_request(const mep__store_hdr_t *h) {
  if (h->key_len == 0) return "empty key";
  if (h->flags & ~(uint16_t)MEP__STORE_NOWAIT ||
      (h->flags && h->op != MEP__STORE_GET))
    return "unknown flags";
  if ((h->op == MEP__STORE_GET || h->op == MEP__STORE_CHECK) && h->val_len)
    return "a value on a get or check";
  if (h->op == MEP__STORE_ADD && h->val_len != 8)
    return "an add whose value is not 8 bytes";
  return NULL;
}

static const char *check_reply(const mep__store_hdr_t *h) {
  if (h->key_len != 0) return "a key in a reply";
  if (h->flags != 0) return "unknown flags";
  if (h->op == MEP__STORE_OK && h->val_len > MEP__STORE_VAL_MAX)
    return "a reply value over the size limit";
  if (h->op == MEP__STORE_ERR &&
      (h->val_len < 4 || h->val_len > 4 + MEP__STORE_ERRMSG_MAX))
    return "an error reply of impossible length";
  return NULL;
}

mep__store_verdict_t mep__store_decode_header(const void *buf, size_t len,
                                              mep__store_dir_t dir,
                                              mep__store_hdr_t *hdr,
                                              const char **why) {
  const uint8_t *b = buf;
  const char *bad = check_prefix(b, len, dir);
  if (!bad && len < MEP__STORE_HDR_LEN) return MEP__STORE_NEED_MORE;
  if (!bad && mep__store_get_u32(b + 24) != mep__store_check(b))
    bad = "header checksum mismatch";
  mep__store_hdr_t h = {0};
  if (!bad) {
    h.op = b[5];
    h.flags = (uint16_t)(b[6] | (b[7] << 8));
    h.seq = mep__store_get_u32(b + 8);
    h.key_len = mep__store_get_u32(b + 12);
    h.val_len = mep__store_get_u64(b + 16);
    bad = dir == MEP__STORE_REQUEST ? check_request(&h) : check_reply(&h);
  }
  if (bad) {
    if (why) *why = bad;
    return MEP__STORE_MALFORMED;
  }
  *hdr = h;
  if (dir == MEP__STORE_REQUEST &&
      (h.key_len > MEP__STORE_KEY_MAX || h.val_len > MEP__STORE_VAL_MAX))
    return MEP__STORE_TOO_LARGE;
  return MEP__STORE_FRAME_OK;
}

mep__store_verdict_t mep__store_decode_frame(const void *buf, size_t len,
                                             mep__store_dir_t dir,
                                             mep__store_hdr_t *hdr,
                                             const uint8_t **key,
                                             const uint8_t **val,
                                             size_t *frame_len,
                                             const char **why) {
  mep__store_verdict_t v = mep__store_decode_header(buf, len, dir, hdr, why);
  if (v != MEP__STORE_FRAME_OK) return v;
  /* Both lengths are bounded by the limits here, so the sum cannot wrap. */
  uint64_t total = MEP__STORE_HDR_LEN + (uint64_t)hdr->key_len + hdr->val_len;
  if ((uint64_t)len < total) return MEP__STORE_NEED_MORE;
  const uint8_t *b = buf;
  *key = b + MEP__STORE_HDR_LEN;
  *val = *key + hdr->key_len;
  *frame_len = (size_t)total;
  return MEP__STORE_FRAME_OK;
}

int mep__store_parse_i64(const uint8_t *s, size_t len, int64_t *out) {
  size_t i = 0;
  int neg = len > 0 && s[0] == '-';
  i += (size_t)neg;
  if (len - i < 1 || len - i > 19) return -1;
  /* Accumulate as a negative number: INT64_MIN has no positive twin. */
  int64_t v = 0;
  for (; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    int d = s[i] - '0';
    if (v < (INT64_MIN + d) / 10) return -1;
    v = v * 10 - d;
  }
  if (!neg) {
    if (v == INT64_MIN) return -1;
    v = -v;
  }
  *out = v;
  return 0;
}

size_t mep__store_format_i64(int64_t v, char *out) {
  return (size_t)snprintf(out, 21, "%lld", (long long)v);
}
