/* test_store_proto.c - the TCP store's frame decoder against a naive
 * restatement of the format (ref_* below), on known bytes, round trips,
 * every truncation, every single-bit corruption and random mutations.
 * MEP_TEST_SEED=<n> replays a run. */
#include "store_proto.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAIL(...)                                                        \
  do {                                                                   \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                      \
    fprintf(stderr, __VA_ARGS__);                                        \
    fprintf(stderr, " (seed %" PRIu64 ")\n", seed);                      \
    exit(1);                                                             \
  } while (0)
#define EXPECT(c, ...)                                                   \
  do {                                                                   \
    if (!(c)) FAIL(__VA_ARGS__);                                         \
  } while (0)

static uint64_t seed, rng_state;

static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

/* ------------------------------------------------ the naive reference */

static uint32_t ref_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static uint64_t ref_le64(const uint8_t *p) {
  return (uint64_t)ref_le32(p) | (uint64_t)ref_le32(p + 4) << 32;
}

static uint32_t ref_fnv(const uint8_t *p, size_t n) {
  uint32_t h = 0x811c9dc5u;
  while (n--) h = (h ^ *p++) * 0x01000193u;
  return h;
}

enum { R_OK, R_MORE, R_LARGE, R_BAD };

static int ref_is_request_op(int op) { return op >= 1 && op <= 4; }
static int ref_is_reply_op(int op) { return op == 0x80 || op == 0x81; }

/* The format's rules as written in store_proto.h, one by one. */
static int ref_verdict(const uint8_t *b, size_t len, int reply,
                       int whole_frame) {
  static const char magic[4] = {'M', 'E', 'P', 'S'};
  for (size_t i = 0; i < 4 && i < len; i++)
    if (b[i] != (uint8_t)magic[i]) return R_BAD;
  if (len >= 5 && b[4] != 1) return R_BAD;
  if (len >= 6 && !(reply ? ref_is_reply_op(b[5]) : ref_is_request_op(b[5])))
    return R_BAD;
  if (len < 28) return R_MORE;
  if (ref_le32(b + 24) != ref_fnv(b, 24)) return R_BAD;
  int op = b[5];
  unsigned flags = b[6] | (unsigned)b[7] << 8;
  uint64_t klen = ref_le32(b + 12), vlen = ref_le64(b + 16);
  if (!reply) {
    if (klen == 0) return R_BAD;
    if (op == 2 ? flags > 1 : flags != 0) return R_BAD;
    if ((op == 2 || op == 4) && vlen != 0) return R_BAD;
    if (op == 3 && vlen != 8) return R_BAD;
    if (klen > 4096 || vlen > (1ull << 30)) return R_LARGE;
  } else {
    if (klen != 0 || flags != 0) return R_BAD;
    if (op == 0x80 && vlen > (1ull << 30)) return R_BAD;
    if (op == 0x81 && (vlen < 4 || vlen > 1028)) return R_BAD;
  }
  if (whole_frame && len < 28 + klen + vlen) return R_MORE;
  return R_OK;
}

static int to_ref(mep__store_verdict_t v) {
  switch (v) {
  case MEP__STORE_FRAME_OK: return R_OK;
  case MEP__STORE_NEED_MORE: return R_MORE;
  case MEP__STORE_TOO_LARGE: return R_LARGE;
  default: return R_BAD;
  }
}

/* Runs both decoders on an exact-size heap copy (so ASan sees any read
 * past `len`) and compares them with the reference. */
static void compare(const uint8_t *b, size_t len, int reply) {
  uint8_t *copy = malloc(len ? len : 1);
  memcpy(copy, b, len);
  mep__store_dir_t dir = reply ? MEP__STORE_REPLY : MEP__STORE_REQUEST;
  mep__store_hdr_t h;
  const char *why = NULL;
  int got = to_ref(mep__store_decode_header(copy, len, dir, &h, &why));
  int want = ref_verdict(b, len, reply, 0);
  EXPECT(got == want, "header verdict %d, reference %d (len %zu)", got,
         want, len);
  if (got == R_BAD) EXPECT(why && *why, "no reason for a malformed header");
  if (got == R_OK || got == R_LARGE) {
    EXPECT(h.op == b[5] && h.seq == ref_le32(b + 8) &&
               h.key_len == ref_le32(b + 12) &&
               h.val_len == ref_le64(b + 16) &&
               h.flags == (b[6] | b[7] << 8),
           "header fields differ from the bytes");
  }
  const uint8_t *k = NULL, *v = NULL;
  size_t flen = 0;
  got = to_ref(
      mep__store_decode_frame(copy, len, dir, &h, &k, &v, &flen, &why));
  want = ref_verdict(b, len, reply, 1);
  EXPECT(got == want, "frame verdict %d, reference %d (len %zu)", got, want,
         len);
  if (got == R_OK) {
    size_t total = 28 + (size_t)h.key_len + (size_t)h.val_len;
    EXPECT(flen == total && k == copy + 28 && v == copy + 28 + h.key_len,
           "frame bounds wrong: %zu vs %zu", flen, total);
  }
  free(copy);
}

/* ------------------------------------------------------------ frames */

static size_t build(uint8_t *out, uint8_t op, uint16_t flags, uint32_t seq,
                    const uint8_t *key, uint32_t klen, const uint8_t *val,
                    uint64_t vlen) {
  mep__store_hdr_t h = {.op = op, .flags = flags, .seq = seq,
                        .key_len = klen, .val_len = vlen};
  mep__store_encode_header(out, &h);
  if (klen) memcpy(out + 28, key, klen);
  if (vlen) memcpy(out + 28 + klen, val, (size_t)vlen);
  return 28 + klen + (size_t)vlen;
}

static void fill(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
}

/* Hand-assembled bytes pin the format independently of the encoder. */
static void test_known_bytes(void) {
  uint8_t want[31] = {'M', 'E', 'P', 'S', 1, 1, 0, 0, 0x01, 0x02, 0x03, 0x04,
                      1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
                      0, 0, 0, 0, 'k', 'v', 'w'};
  uint32_t c = ref_fnv(want, 24);
  for (int i = 0; i < 4; i++) want[24 + i] = (uint8_t)(c >> (8 * i));
  uint8_t got[31];
  build(got, 1, 0, 0x04030201, (const uint8_t *)"k", 1,
        (const uint8_t *)"vw", 2);
  EXPECT(!memcmp(got, want, sizeof want), "encoder bytes differ from spec");
  mep__store_hdr_t h;
  const uint8_t *k, *v;
  size_t n;
  EXPECT(mep__store_decode_frame(want, sizeof want, MEP__STORE_REQUEST, &h,
                                 &k, &v, &n, NULL) == MEP__STORE_FRAME_OK,
         "hand-made frame refused");
  EXPECT(h.op == 1 && h.seq == 0x04030201 && h.key_len == 1 &&
             h.val_len == 2 && n == 31 && *k == 'k' && !memcmp(v, "vw", 2),
         "hand-made frame misread");
}

static const size_t val_sizes[] = {0, 1, 7, 13, 4097, 65536};

static void round_trip(uint8_t op, uint16_t flags, uint32_t klen,
                       uint64_t vlen, int reply) {
  uint8_t *key = malloc(klen + 1), *val = malloc((size_t)vlen + 1);
  fill(key, klen);
  fill(val, (size_t)vlen);
  if (op == 0x81) memcpy(val, "\xfc\xff\xff\xff", 4);
  size_t total = 28 + klen + (size_t)vlen;
  uint8_t *f = malloc(total + 40);
  uint32_t seq = (uint32_t)rnd();
  build(f, op, flags, seq, key, klen, val, vlen);
  fill(f + total, 40); /* the next frame's bytes must not matter */
  mep__store_dir_t dir = reply ? MEP__STORE_REPLY : MEP__STORE_REQUEST;
  mep__store_hdr_t h;
  const uint8_t *k, *v;
  size_t n;
  for (size_t extra = 0; extra <= 40; extra += 40) {
    EXPECT(mep__store_decode_frame(f, total + extra, dir, &h, &k, &v, &n,
                                   NULL) == MEP__STORE_FRAME_OK,
           "valid frame op %d klen %u vlen %" PRIu64 " refused", op, klen,
           vlen);
    EXPECT(h.op == op && h.flags == flags && h.seq == seq &&
               h.key_len == klen && h.val_len == vlen && n == total,
           "header fields changed in a round trip");
    EXPECT(!memcmp(k, key, klen) && !memcmp(v, val, (size_t)vlen),
           "key or value changed in a round trip");
  }
  /* Every proper prefix is a frame still arriving. */
  for (size_t len = 0; len < total; len++) {
    mep__store_verdict_t r =
        mep__store_decode_frame(f, len, dir, &h, &k, &v, &n, NULL);
    EXPECT(r == MEP__STORE_NEED_MORE, "prefix %zu of %zu gave %d", len,
           total, r);
  }
  /* Every single-bit corruption of the header is refused. */
  for (size_t bit = 0; bit < 28 * 8; bit++) {
    f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    EXPECT(mep__store_decode_frame(f, total, dir, &h, &k, &v, &n, NULL) ==
               MEP__STORE_MALFORMED,
           "header bit %zu flipped was accepted", bit);
    compare(f, total, reply);
    f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
  }
  free(f);
  free(key);
  free(val);
}

static void test_round_trips(void) {
  static const uint32_t klens[] = {1, 2, 37, 4096};
  for (size_t ki = 0; ki < sizeof klens / sizeof *klens; ki++) {
    uint32_t kl = klens[ki];
    for (size_t vi = 0; vi < sizeof val_sizes / sizeof *val_sizes; vi++)
      round_trip(1, 0, kl, val_sizes[vi], 0);
    round_trip(2, 0, kl, 0, 0);
    round_trip(2, 1, kl, 0, 0);
    round_trip(3, 0, kl, 8, 0);
    round_trip(4, 0, kl, 0, 0);
  }
  for (size_t vi = 0; vi < sizeof val_sizes / sizeof *val_sizes; vi++)
    round_trip(0x80, 0, 0, val_sizes[vi], 1);
  round_trip(0x81, 0, 0, 4, 1);
  round_trip(0x81, 0, 0, 4 + 1024, 1);
}

/* Headers with a correct checksum but lengths, flags or ops the format
 * forbids. */
static void expect_header(uint8_t op, uint16_t flags, uint32_t klen,
                          uint64_t vlen, int reply, int want) {
  uint8_t hb[28];
  mep__store_hdr_t h = {.op = op, .flags = flags, .key_len = klen,
                        .val_len = vlen};
  mep__store_encode_header(hb, &h);
  mep__store_dir_t dir = reply ? MEP__STORE_REPLY : MEP__STORE_REQUEST;
  int got = to_ref(mep__store_decode_header(hb, 28, dir, &h, NULL));
  EXPECT(got == want, "op %d flags %u klen %u vlen %" PRIu64
         " %s: verdict %d, want %d", op, flags, klen, vlen,
         reply ? "reply" : "request", got, want);
  compare(hb, 28, reply);
}

static void test_bad_headers(void) {
  expect_header(1, 0, 0, 5, 0, R_BAD);           /* empty key */
  expect_header(2, 0, 3, 1, 0, R_BAD);           /* get with a value */
  expect_header(4, 0, 3, 8, 0, R_BAD);           /* check with a value */
  expect_header(3, 0, 3, 7, 0, R_BAD);           /* add of 7 bytes */
  expect_header(3, 0, 3, 9, 0, R_BAD);
  expect_header(1, 1, 3, 0, 0, R_BAD);           /* nowait on a set */
  expect_header(2, 2, 3, 0, 0, R_BAD);           /* unknown flag */
  expect_header(0, 0, 3, 0, 0, R_BAD);           /* op 0 */
  expect_header(5, 0, 3, 0, 0, R_BAD);
  expect_header(0x80, 0, 0, 0, 0, R_BAD);        /* a reply as a request */
  expect_header(1, 0, 3, 0, 1, R_BAD);           /* a request as a reply */
  expect_header(1, 0, 4097, 0, 0, R_LARGE);
  expect_header(2, 0, UINT32_MAX, 0, 0, R_LARGE);
  expect_header(1, 0, 3, (1ull << 30) + 1, 0, R_LARGE);
  expect_header(1, 0, 3, UINT64_MAX, 0, R_LARGE);
  expect_header(1, 0, 4096, 1ull << 30, 0, R_OK);
  expect_header(0x80, 0, 1, 0, 1, R_BAD);        /* key in a reply */
  expect_header(0x80, 1, 0, 0, 1, R_BAD);
  expect_header(0x80, 0, 0, (1ull << 30) + 1, 1, R_BAD);
  expect_header(0x81, 0, 0, 3, 1, R_BAD);
  expect_header(0x81, 0, 0, 1029, 1, R_BAD);
  uint8_t hb[28];
  mep__store_hdr_t h = {.op = 4, .key_len = 1};
  mep__store_encode_header(hb, &h);
  hb[4] = 2; /* another version, checksum made to match */
  uint32_t c = ref_fnv(hb, 24);
  for (int i = 0; i < 4; i++) hb[24 + i] = (uint8_t)(c >> (8 * i));
  EXPECT(mep__store_decode_header(hb, 28, MEP__STORE_REQUEST, &h, NULL) ==
             MEP__STORE_MALFORMED, "version 2 accepted");
  /* Garbage is refused from its first byte on. */
  EXPECT(mep__store_decode_header("G", 1, MEP__STORE_REQUEST, &h, NULL) ==
             MEP__STORE_MALFORMED, "a wrong first byte waits for more");
  EXPECT(mep__store_decode_header("MEPS\x01", 5, MEP__STORE_REQUEST, &h,
                                  NULL) == MEP__STORE_NEED_MORE,
         "a right prefix refused");
}

/* Lengths near the edges, where the rules switch. */
static uint64_t edge_len(void) {
  static const uint64_t edges[] = {0, 1, 3, 4, 7, 8, 9, 1028, 1029, 4095,
                                   4096, 4097, (1ull << 30) - 1, 1ull << 30,
                                   (1ull << 30) + 1, UINT32_MAX, UINT64_MAX};
  if (rnd() & 1) return edges[rnd_below(sizeof edges / sizeof *edges)];
  return rnd_below(64);
}

static void fuzz(long iters) {
  uint8_t buf[28 + 160];
  for (long it = 0; it < iters; it++) {
    size_t len;
    int reply = (int)(rnd() & 1);
    int kind = (int)rnd_below(4);
    if (kind == 0) {
      /* pure noise, sometimes behind a right magic */
      len = (size_t)rnd_below(sizeof buf);
      fill(buf, len);
      if (rnd() & 1) memcpy(buf, "MEPS\x01", len < 5 ? len : 5);
    } else {
      /* a header with random fields and a valid checksum, often with
       * its body, then random byte mutations */
      uint8_t ops[] = {0, 1, 2, 3, 4, 5, 0x7f, 0x80, 0x81, 0x82, 0xff};
      mep__store_hdr_t h = {
          .op = ops[rnd_below(sizeof ops)],
          .flags = (uint16_t)(rnd_below(4) == 0 ? rnd() : rnd_below(2)),
          .seq = (uint32_t)rnd(), .key_len = (uint32_t)edge_len(),
          .val_len = edge_len()};
      mep__store_encode_header(buf, &h);
      fill(buf + 28, sizeof buf - 28);
      len = 28 + (size_t)rnd_below(sizeof buf - 28 + 1);
      if (kind == 2) {
        int n = 1 + (int)rnd_below(4);
        for (int i = 0; i < n; i++)
          buf[rnd_below(len)] = (uint8_t)rnd();
      }
      if (kind == 3) len = (size_t)rnd_below(len + 1);
    }
    compare(buf, len, reply);
  }
}

/* ---------------------------------------------------- counter values */

static int ref_parse(const char *s, size_t len, int64_t *out) {
  size_t i = len && s[0] == '-';
  if (len - i < 1 || len - i > 19) return -1;
  for (size_t j = i; j < len; j++)
    if (s[j] < '0' || s[j] > '9') return -1;
  char tmp[32];
  memcpy(tmp, s, len);
  tmp[len] = '\0';
  errno = 0;
  long long v = strtoll(tmp, NULL, 10);
  if (errno == ERANGE) return -1;
  *out = v;
  return 0;
}

static void test_counters(void) {
  static const int64_t fixed[] = {0, 1, -1, 9, 10, INT64_MAX, INT64_MIN,
                                  INT64_MAX - 1, INT64_MIN + 1};
  for (int i = 0; i < 2000; i++) {
    int64_t v = i < 9 ? fixed[i] : (int64_t)(rnd() >> rnd_below(64));
    if (i >= 9 && (rnd() & 1)) v = -v;
    char text[24];
    size_t n = mep__store_format_i64(v, text);
    char want[32];
    snprintf(want, sizeof want, "%" PRId64, v);
    EXPECT(n == strlen(want) && !strcmp(text, want), "format %" PRId64, v);
    int64_t back = 0;
    EXPECT(mep__store_parse_i64((const uint8_t *)text, n, &back) == 0 &&
               back == v, "parse of %s", text);
  }
  static const char *bad[] = {"", "-", "+1", " 1", "1 ", "1a", "--1",
                              "9223372036854775808", "-9223372036854775809",
                              "00000000000000000001", "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int64_t v;
    EXPECT(mep__store_parse_i64((const uint8_t *)bad[i], strlen(bad[i]),
                                &v) != 0, "'%s' parsed", bad[i]);
  }
  const char alphabet[] = "0123456789-+ x9";
  for (int i = 0; i < 200000; i++) {
    char s[24];
    size_t len = (size_t)rnd_below(23);
    for (size_t j = 0; j < len; j++)
      s[j] = alphabet[rnd_below(sizeof alphabet - 1)];
    int64_t a = 0, b = 0;
    int ra = mep__store_parse_i64((const uint8_t *)s, len, &a);
    int rb = ref_parse(s, len, &b);
    EXPECT(ra == rb && (ra != 0 || a == b), "parse of '%.*s': %d/%" PRId64
           " vs reference %d/%" PRId64, (int)len, s, ra, a, rb, b);
  }
}

int main(void) {
  const char *env = getenv("MEP_TEST_SEED");
  seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
  rng_state = seed * 2654435761u + 88172645463325252ull;
  printf("seed %" PRIu64 "\n", seed);
  test_known_bytes();
  test_bad_headers();
  test_round_trips();
  test_counters();
  fuzz(300000);
  printf("ok\n");
  return 0;
}
