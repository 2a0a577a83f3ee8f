/*
 * test_tcp_wire - the tcp transport's wire decoders and validators, without
 * sockets: hand-built good messages, every field wrong, boundary offsets and
 * lengths, truncated and wrong-secret handshakes, and a fuzz loop that
 * mutates valid headers (writes, signals and goodbyes) and compares the
 * validator with a naive predicate written here from the format description
 * alone.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mep/mep.h"
#include "wire.h"

static int failures;
#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      failures++;                                                             \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
    }                                                                         \
  } while (0)

/* xorshift64*, seeded from the command line or the time, printed so a
 * failure can be replayed */
static uint64_t rng;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545F4914F6CDD1Dull;
}

/* ------------------------------------------------- the test's own view */

/* little-endian by arithmetic, independent of wire.h's helpers */
static void le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++, v /= 256) p[i] = (uint8_t)(v % 256);
}
static uint64_t rd(const uint8_t *p, int n) {
  uint64_t v = 0, mul = 1;
  for (int i = 0; i < n; i++, mul *= 256) v += p[i] * mul;
  return v;
}

typedef struct {
  uint32_t id;
  uint64_t len;
} region_t;

static const region_t regions[] = {
    {1, 0}, {2, 1}, {3, 4096}, {5, 1u << 20}, {7, UINT64_MAX}, {9, 13},
};
#define NREG (sizeof regions / sizeof regions[0])

static int lookup(void *arg, uint32_t id, uint64_t *len) {
  (void)arg;
  for (size_t i = 0; i < NREG; i++)
    if (regions[i].id == id) return *len = regions[i].len, 1;
  return 0;
}

static void hdr(uint8_t *h, int type, int op, int count, uint32_t region,
                uint64_t off, uint64_t lv, uint64_t seq) {
  h[0] = (uint8_t)type;
  h[1] = (uint8_t)op;
  le(h + 2, (uint64_t)count, 2);
  le(h + 4, region, 4);
  le(h + 8, off, 8);
  le(h + 16, lv, 8);
  le(h + 24, seq, 8);
}

enum { OK = 0, PROTO = 1, BOUNDS = 2 };

/* The naive predicate: the set of rule classes a header violates (bit
 * PROTO for malformed, bit BOUNDS for out-of-region). It computes the end
 * of the access and detects the wrap-around, where the plugin compares
 * against what is left of the region. */
static int naive(const uint8_t *h, uint64_t seq, unsigned nsock) {
  int type = h[0], op = h[1];
  unsigned count = (unsigned)rd(h + 2, 2);
  uint32_t region = (uint32_t)rd(h + 4, 4);
  uint64_t off = rd(h + 8, 8), lv = rd(h + 16, 8), s = rd(h + 24, 8);
  int bad = 0;
  if (type < 1 || type > 3) return 1 << PROTO;
  if (s != seq) bad |= 1 << PROTO;
  if (type == 3) /* goodbye: no region, every other field zero */
    return op || count || region || off || lv ? 1 << PROTO : bad;
  int known = 0;
  uint64_t rlen = 0;
  for (size_t i = 0; i < NREG; i++)
    if (regions[i].id == region) known = 1, rlen = regions[i].len;
  if (!known) bad |= 1 << BOUNDS;
  if (type == 1) {
    if (op != 0 || count != 0) bad |= 1 << PROTO;
    uint64_t end = off + lv; /* wraps iff end < off */
    if (known && (end < off || end > rlen)) bad |= 1 << BOUNDS;
  } else {
    if (op > 1 || count != nsock || off % 8 != 0) bad |= 1 << PROTO;
    uint64_t end = off + 8;
    if (known && (end < off || end > rlen)) bad |= 1 << BOUNDS;
  }
  return bad;
}

static int check(const uint8_t *h, size_t len, uint64_t seq, unsigned nsock,
                 char *why, size_t wl) {
  mep__tcp_msg_expect_t e = {.seq = seq, .nsock = nsock,
                             .region_len = lookup};
  mep__tcp_msg_t m;
  return mep__tcp_msg_check(h, len, &e, &m, why, wl);
}

/* The validator agrees with the naive predicate on h. */
static void agree(const uint8_t *h, uint64_t seq, unsigned nsock,
                  const char *what) {
  char why[256] = "";
  int rc = check(h, MEP_TCP_HDR_LEN, seq, nsock, why, sizeof why);
  int bad = naive(h, seq, nsock);
  if (!bad) {
    CHECK(rc == 0, "%s: valid header refused: %s", what, why);
    return;
  }
  CHECK(rc == MEP_ERR_PROTOCOL || rc == MEP_ERR_BOUNDS,
        "%s: invalid header (classes %#x) accepted or odd code %d", what, bad,
        rc);
  if (bad == 1 << PROTO)
    CHECK(rc == MEP_ERR_PROTOCOL, "%s: malformed only, got %d (%s)", what, rc,
          why);
  if (bad == 1 << BOUNDS)
    CHECK(rc == MEP_ERR_BOUNDS, "%s: out of bounds only, got %d (%s)", what,
          rc, why);
  CHECK(why[0] != '\0', "%s: refusal without a reason", what);
}

/* ------------------------------------------------------------ messages */

static void test_messages(void) {
  uint8_t h[MEP_TCP_HDR_LEN], enc[MEP_TCP_HDR_LEN];
  char why[256];
  /* good: a write, matching the plugin's encoder byte for byte */
  hdr(h, 1, 0, 0, 3, 17, 4079, 42);
  mep__tcp_msg_t m = {.type = 1, .region = 3, .offset = 17,
                      .len_or_value = 4079, .seq = 42};
  mep__tcp_msg_encode(enc, &m);
  CHECK(!memcmp(h, enc, sizeof h), "encoder differs from the format");
  mep__tcp_msg_expect_t e = {.seq = 42, .nsock = 3, .region_len = lookup};
  mep__tcp_msg_t out;
  CHECK(mep__tcp_msg_check(h, sizeof h, &e, &out, why, sizeof why) == 0,
        "good write: %s", why);
  CHECK(out.region == 3 && out.offset == 17 && out.len_or_value == 4079 &&
            out.seq == 42 && out.type == 1,
        "decoded fields differ");
  /* good: zero-length writes anywhere up to the end, whole region */
  hdr(h, 1, 0, 0, 3, 4096, 0, 0);
  CHECK(check(h, 32, 0, 1, why, sizeof why) == 0, "0 bytes at end: %s", why);
  hdr(h, 1, 0, 0, 1, 0, 0, 0);
  CHECK(check(h, 32, 0, 1, why, sizeof why) == 0, "0 bytes in empty: %s", why);
  hdr(h, 1, 0, 0, 3, 0, 4096, 0);
  CHECK(check(h, 32, 0, 1, why, sizeof why) == 0, "whole region: %s", why);
  /* good signals: SET and ADD, last word */
  hdr(h, 2, 0, 3, 3, 4088, 5, 9);
  CHECK(check(h, 32, 9, 3, why, sizeof why) == 0, "signal set: %s", why);
  hdr(h, 2, 1, 1, 5, 0, UINT64_MAX, 0);
  CHECK(check(h, 32, 0, 1, why, sizeof why) == 0, "signal add: %s", why);
  /* good goodbyes: any sequence number, any sockets per peer; the encoder
   * writes the same bytes */
  hdr(h, 3, 0, 0, 0, 0, 0, 0);
  CHECK(check(h, 32, 0, 1, why, sizeof why) == 0, "goodbye: %s", why);
  hdr(h, 3, 0, 0, 0, 0, 0, UINT64_MAX);
  CHECK(check(h, 32, UINT64_MAX, 16, why, sizeof why) == 0,
        "goodbye at the last sequence number: %s", why);
  hdr(h, 3, 0, 0, 0, 0, 0, 12345);
  mep__tcp_msg_t bye = {.type = MEP_TCP_MSG_BYE, .seq = 12345};
  mep__tcp_msg_encode(enc, &bye);
  CHECK(MEP_TCP_MSG_BYE == 3 && !memcmp(h, enc, sizeof h),
        "goodbye encoder differs from the format");
  CHECK(mep__tcp_msg_check(h, sizeof h, &(mep__tcp_msg_expect_t){
                               .seq = 12345, .nsock = 2,
                               .region_len = lookup},
                           &out, why, sizeof why) == 0 &&
            out.type == 3 && out.seq == 12345,
        "goodbye decoded: %s", why);
  for (size_t n = 0; n < MEP_TCP_HDR_LEN; n++)
    CHECK(check(h, n, 12345, 1, why, sizeof why) == MEP_ERR_PROTOCOL,
          "truncated goodbye of %zu bytes accepted", n);

  struct {
    const char *what;
    int type, op, count;
    uint32_t region;
    uint64_t off, lv, seq;
    unsigned nsock;
    int want;
  } cases[] = {
      {"unknown type 0", 0, 0, 0, 3, 0, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"unknown type 4", 4, 0, 0, 3, 0, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"unknown type 255", 255, 0, 0, 3, 0, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"write with op", 1, 1, 0, 3, 0, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"write with count", 1, 0, 1, 3, 0, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"wrong sequence", 1, 0, 0, 3, 0, 1, 6, 1, MEP_ERR_PROTOCOL},
      {"unknown region", 1, 0, 0, 4, 0, 1, 0, 1, MEP_ERR_BOUNDS},
      {"region 0", 1, 0, 0, 0, 0, 0, 0, 1, MEP_ERR_BOUNDS},
      {"one past the end", 1, 0, 0, 3, 4095, 2, 0, 1, MEP_ERR_BOUNDS},
      {"offset past the end", 1, 0, 0, 3, 4097, 0, 0, 1, MEP_ERR_BOUNDS},
      {"length past the end", 1, 0, 0, 3, 0, 4097, 0, 1, MEP_ERR_BOUNDS},
      {"1 byte into empty", 1, 0, 0, 1, 0, 1, 0, 1, MEP_ERR_BOUNDS},
      {"off+len wraps", 1, 0, 0, 3, 16, UINT64_MAX - 15, 0, 1,
       MEP_ERR_BOUNDS},
      {"len UINT64_MAX", 1, 0, 0, 3, 1, UINT64_MAX, 0, 1, MEP_ERR_BOUNDS},
      {"off UINT64_MAX", 1, 0, 0, 3, UINT64_MAX, 1, 0, 1, MEP_ERR_BOUNDS},
      {"wrap in huge region", 1, 0, 0, 7, UINT64_MAX, 1, 0, 1,
       MEP_ERR_BOUNDS},
      {"signal unaligned", 2, 0, 1, 3, 4, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"signal unaligned by 1", 2, 0, 1, 3, 4081, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"signal past the end", 2, 0, 1, 3, 4096, 1, 0, 1, MEP_ERR_BOUNDS},
      {"signal in a 13-byte region", 2, 0, 1, 9, 8, 1, 0, 1, MEP_ERR_BOUNDS},
      {"signal into empty", 2, 0, 1, 1, 0, 1, 0, 1, MEP_ERR_BOUNDS},
      {"signal offset wraps", 2, 0, 1, 7, UINT64_MAX - 7, 1, 0, 1,
       MEP_ERR_BOUNDS},
      {"signal bad op", 2, 2, 1, 3, 0, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"signal count short", 2, 0, 2, 3, 0, 1, 0, 3, MEP_ERR_PROTOCOL},
      {"signal count 0", 2, 0, 0, 3, 0, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"signal unknown region", 2, 0, 1, 8, 0, 1, 0, 1, MEP_ERR_BOUNDS},
      {"goodbye with op", 3, 1, 0, 0, 0, 0, 0, 1, MEP_ERR_PROTOCOL},
      {"goodbye with count", 3, 0, 1, 0, 0, 0, 0, 1, MEP_ERR_PROTOCOL},
      {"goodbye with a region", 3, 0, 0, 3, 0, 0, 0, 1, MEP_ERR_PROTOCOL},
      {"goodbye with an unknown region", 3, 0, 0, 4, 0, 0, 0, 1,
       MEP_ERR_PROTOCOL},
      {"goodbye with an offset", 3, 0, 0, 0, 8, 0, 0, 1, MEP_ERR_PROTOCOL},
      {"goodbye with a value", 3, 0, 0, 0, 0, 1, 0, 1, MEP_ERR_PROTOCOL},
      {"goodbye with value 2^63", 3, 0, 0, 0, 0, 1ull << 63, 0, 1,
       MEP_ERR_PROTOCOL},
      {"goodbye, wrong sequence", 3, 0, 0, 0, 0, 0, 1, 1, MEP_ERR_PROTOCOL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    hdr(h, cases[i].type, cases[i].op, cases[i].count, cases[i].region,
        cases[i].off, cases[i].lv, cases[i].seq);
    why[0] = '\0';
    int rc = check(h, 32, 0, cases[i].nsock, why, sizeof why);
    CHECK(rc == cases[i].want, "%s: got %d want %d (%s)", cases[i].what, rc,
          cases[i].want, why);
    CHECK(why[0], "%s: no reason given", cases[i].what);
    agree(h, 0, cases[i].nsock, cases[i].what);
  }
  /* the example sentence of the design */
  hdr(h, 1, 0, 0, 5, 1044480, 8192, 0);
  check(h, 32, 0, 1, why, sizeof why);
  CHECK(strstr(why, "8192 bytes at offset 1044480 of region 5 (1048576 "
                    "bytes): out of bounds") != NULL,
        "reason reads '%s'", why);
  /* truncated headers */
  hdr(h, 1, 0, 0, 3, 0, 1, 0);
  for (size_t n = 0; n < MEP_TCP_HDR_LEN; n++)
    CHECK(check(h, n, 0, 1, why, sizeof why) == MEP_ERR_PROTOCOL,
          "truncated header of %zu bytes accepted", n);
  /* signal trailers */
  uint8_t tr[24];
  uint64_t counts[3];
  mep__tcp_msg_t sig = {.type = 2, .count = 3, .seq = 7};
  le(tr, 7, 8), le(tr + 8, 100, 8), le(tr + 16, 0, 8);
  CHECK(mep__tcp_counts_check(tr, 24, &sig, 0, counts, why, sizeof why) == 0,
        "good trailer: %s", why);
  CHECK(counts[0] == 7 && counts[1] == 100 && counts[2] == 0, "counts");
  CHECK(mep__tcp_counts_check(tr, 24, &sig, 1, counts, why, sizeof why) ==
            MEP_ERR_PROTOCOL, "own count must equal the sequence number");
  CHECK(mep__tcp_counts_check(tr, 16, &sig, 0, counts, why, sizeof why) ==
            MEP_ERR_PROTOCOL, "short trailer");
  CHECK(mep__tcp_counts_check(tr, 24, &sig, 3, counts, why, sizeof why) ==
            MEP_ERR_PROTOCOL, "socket index past the count");
}

/* Mutates valid headers at random and compares with the naive predicate. */
static void fuzz_messages(int iters) {
  long accepted = 0, refused = 0, byes[2] = {0, 0};
  for (int it = 0; it < iters; it++) {
    uint8_t h[MEP_TCP_HDR_LEN];
    unsigned nsock = 1 + (unsigned)(rnd() % MEP_TCP_MAX_SOCKS);
    uint64_t seq = rnd() % 4 ? rnd() % 1000 : rnd();
    const region_t *r = &regions[rnd() % NREG];
    uint64_t rl = r->len > (1ull << 40) ? (1ull << 40) : r->len;
    uint64_t kind = rnd() % 5;
    if (kind == 4) {
      hdr(h, 3, 0, 0, 0, 0, 0, seq);
    } else if (kind % 2) {
      uint64_t off = rl ? rnd() % (rl + 1) : 0;
      uint64_t len = rl - off ? rnd() % (rl - off + 1) : 0;
      hdr(h, 1, 0, 0, r->id, off, len, seq);
    } else {
      uint64_t words = rl / 8;
      uint64_t off = words ? 8 * (rnd() % words) : 0;
      hdr(h, 2, (int)(rnd() % 2), (int)nsock, r->id, off, rnd(), seq);
    }
    int nmut = (int)(rnd() % 4);
    for (int k = 0; k < nmut; k++) {
      static const int fields[][2] = {{0, 1},  {1, 1},  {2, 2},
                                      {4, 4},  {8, 8},  {16, 8},
                                      {24, 8}};
      const int *f = fields[rnd() % 7];
      uint64_t edge[] = {0, 1, 7, 8, rl, rl - 1, rl + 1, rl - 8,
                         UINT64_MAX, UINT64_MAX - 7, rnd(), rd(h + f[0], f[1]) + 1};
      switch (rnd() % 3) {
      case 0: /* flip a bit anywhere */
        h[rnd() % MEP_TCP_HDR_LEN] ^= (uint8_t)(1u << (rnd() % 8));
        break;
      case 1: /* a field to an edge value */
        le(h + f[0], edge[rnd() % 12], f[1]);
        break;
      default: /* a random byte */
        h[rnd() % MEP_TCP_HDR_LEN] = (uint8_t)rnd();
      }
    }
    if (naive(h, seq, nsock)) refused++; else accepted++;
    if (h[0] == 3) byes[naive(h, seq, nsock) != 0]++;
    agree(h, seq, nsock, "fuzz");
    if (failures > 20) return;
  }
  /* both outcomes must be well represented, or the loop tests nothing */
  CHECK(accepted > iters / 10 && refused > iters / 10,
        "fuzz mix: %ld accepted, %ld refused", accepted, refused);
  CHECK(byes[0] > iters / 50 && byes[1] > iters / 50,
        "fuzz mix: %ld goodbyes accepted, %ld refused", byes[0], byes[1]);
}

/* ----------------------------------------------------------- handshake */

static const uint8_t secret[16] = {9, 8, 7, 6, 5, 4, 3, 2,
                                   1, 0, 11, 12, 13, 14, 15, 16};

#define INC_FROM 0x1122334455667788ull
#define INC_TO 0x99aabbccddeeff01ull

static size_t hello(uint8_t *b, uint32_t magic, int ver, int nsock,
                    uint32_t from, uint32_t to, uint32_t idx,
                    const uint8_t *sec, uint32_t slen, uint64_t from_inc,
                    uint64_t to_inc) {
  le(b, magic, 4);
  le(b + 4, (uint64_t)ver, 2);
  le(b + 6, (uint64_t)nsock, 2);
  le(b + 8, from, 4);
  le(b + 12, to, 4);
  le(b + 16, idx, 4);
  le(b + 20, slen, 4);
  le(b + 24, from_inc, 8);
  le(b + 32, to_inc, 8);
  memcpy(b + 40, sec, slen);
  return 40 + slen;
}

static int hcheck(const uint8_t *b, size_t n, char *why) {
  mep__tcp_hello_expect_t e = {.rank = 5, .size = 8, .nsock = 2,
                               .incarnation = INC_TO,
                               .secret = secret, .secret_len = 16};
  mep__tcp_hello_t h;
  return mep__tcp_hello_check(b, n, &e, &h, why, 200);
}

static void test_acks(void) {
  char why[200];
  int refused = -1;
  uint8_t a[MEP_TCP_ACK_LEN];
  le(a, 0x4b50454du, 4), le(a + 4, 2, 2), le(a + 6, 4, 2), le(a + 8, 7, 4),
      le(a + 12, 3, 4);
  CHECK(mep__tcp_ack_check(a, 16, 4, 7, 3, &refused, why, sizeof why) == 0 &&
            refused == 0,
        "ack: %s", why);
  uint8_t ae[MEP_TCP_ACK_LEN];
  mep__tcp_ack_encode(ae, 4, 7, 3);
  CHECK(!memcmp(a, ae, 16), "ack encoder differs from the format");
  CHECK(mep__tcp_ack_check(a, 16, 4, 6, 3, &refused, why, sizeof why) != 0,
        "ack rank");
  CHECK(mep__tcp_ack_check(a, 16, 4, 7, 2, &refused, why, sizeof why) != 0,
        "ack idx");
  CHECK(mep__tcp_ack_check(a, 16, 3, 7, 3, &refused, why, sizeof why) != 0,
        "ack k");
  CHECK(mep__tcp_ack_check(a, 15, 4, 7, 3, &refused, why, sizeof why) != 0,
        "ack len");
  for (int i = 0; i < 16; i++) {
    for (int bit = 0; bit < 8; bit++) {
      a[i] ^= (uint8_t)(1u << bit);
      refused = -1;
      int rc = mep__tcp_ack_check(a, 16, 4, 7, 3, &refused, why, sizeof why);
      /* K and N differ in two bits: no single flip makes a refusal */
      CHECK(rc != 0, "ack with bit %d of byte %d changed accepted (refused "
            "%d)", bit, i, refused);
      a[i] ^= (uint8_t)(1u << bit);
    }
  }
  /* refusals: each known reason, nothing else */
  for (uint32_t r = 0; r < 6; r++) {
    uint8_t n[MEP_TCP_ACK_LEN];
    le(n, 0x4e50454du, 4), le(n + 4, 2, 2), le(n + 6, r, 2), le(n + 8, 7, 4),
        le(n + 12, 3, 4);
    uint8_t ne[MEP_TCP_ACK_LEN];
    mep__tcp_nak_encode(ne, r, 7, 3);
    CHECK(!memcmp(n, ne, 16), "refusal encoder differs from the format");
    CHECK(!memcmp(n, "MEPN", 4), "refusal magic spells MEPN");
    refused = -1;
    int rc = mep__tcp_ack_check(n, 16, 4, 7, 3, &refused, why, sizeof why);
    int known = r >= MEP_TCP_NAK_UNEXPECTED && r <= MEP_TCP_NAK_OTHER;
    CHECK(known ? rc == 0 && refused == (int)r : rc == MEP_ERR_PROTOCOL,
          "refusal with reason %u: rc %d refused %d", r, rc, refused);
    CHECK(strlen(mep__tcp_nak_text((int)r)) > 10, "reason %u has no text",
          r);
    if (!known) continue;
    /* a refusal names the acceptor and the socket as an ack does */
    CHECK(mep__tcp_ack_check(n, 16, 4, 6, 3, &refused, why, sizeof why) ==
              MEP_ERR_PROTOCOL,
          "refusal from another rank accepted");
    CHECK(mep__tcp_ack_check(n, 16, 4, 7, 0, &refused, why, sizeof why) ==
              MEP_ERR_PROTOCOL,
          "refusal for another socket accepted");
    le(n + 4, 1, 2);
    CHECK(mep__tcp_ack_check(n, 16, 4, 7, 3, &refused, why, sizeof why) ==
              MEP_ERR_PROTOCOL,
          "refusal of version 1 accepted");
  }
}

static void test_handshake(void) {
  uint8_t b[MEP_TCP_HELLO_LEN + MEP_TCP_MAX_SECRET], enc[sizeof b];
  char why[200];
  const uint32_t M = 0x4850454du;
  size_t n = hello(b, M, 2, 2, 3, 5, 1, secret, 16, INC_FROM, INC_TO);
  CHECK(!memcmp(b, "MEPH", 4), "magic spells MEPH");
  mep__tcp_hello_t h = {.nsock = 2, .from = 3, .to = 5, .index = 1,
                        .secret_len = 16, .from_inc = INC_FROM,
                        .to_inc = INC_TO, .secret = secret};
  CHECK(mep__tcp_hello_encode(enc, sizeof enc, &h) == n &&
            !memcmp(b, enc, n),
        "hello encoder differs from the format");
  CHECK(hcheck(b, n, why) == 0, "good hello: %s", why);
  mep__tcp_hello_expect_t e = {.rank = 5, .size = 8, .nsock = 2,
                               .incarnation = INC_TO,
                               .secret = secret, .secret_len = 16};
  mep__tcp_hello_t got;
  CHECK(mep__tcp_hello_check(b, n, &e, &got, why, sizeof why) == 0 &&
            got.from == 3 && got.index == 1 && got.from_inc == INC_FROM &&
            got.to_inc == INC_TO,
        "hello decoded wrongly");
  /* truncated: every prefix asks for more and is never accepted */
  for (size_t k = 0; k < n; k++) {
    int rc = hcheck(b, k, why);
    CHECK(rc > 0 && (size_t)rc > k && (size_t)rc <= n,
          "prefix of %zu bytes: %d", k, rc);
  }
  CHECK(hcheck(b, n + 1, why) == MEP_ERR_PROTOCOL, "trailing byte");
  struct {
    const char *what;
    uint32_t magic;
    int ver, nsock;
    uint32_t from, to, idx, slen;
    int flip;
    uint64_t from_inc, to_inc;
    int want;
  } cases[] = {
      {"magic", M ^ 0x100, 2, 2, 3, 5, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"version 1", M, 1, 2, 3, 5, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"version 3", M, 3, 2, 3, 5, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"sockets per peer", M, 2, 3, 3, 5, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"from a higher rank", M, 2, 2, 6, 5, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"from itself", M, 2, 2, 5, 5, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"from outside the group", M, 2, 2, 8, 5, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"from UINT32_MAX", M, 2, 2, UINT32_MAX, 5, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"to another rank", M, 2, 2, 3, 4, 1, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"socket index", M, 2, 2, 3, 5, 2, 16, -1, INC_FROM, INC_TO,
       MEP_ERR_PROTOCOL},
      {"from incarnation 0", M, 2, 2, 3, 5, 1, 16, -1, 0, INC_TO,
       MEP_ERR_PROTOCOL},
      {"to another incarnation", M, 2, 2, 3, 5, 1, 16, -1, INC_FROM,
       INC_TO ^ 1, MEP_ERR_PROTOCOL},
      {"to incarnation 0", M, 2, 2, 3, 5, 1, 16, -1, INC_FROM, 0,
       MEP_ERR_PROTOCOL},
      {"secret too short", M, 2, 2, 3, 5, 1, 15, -1, INC_FROM, INC_TO,
       MEP_ERR_AUTH},
      {"secret too long", M, 2, 2, 3, 5, 1, 17, -1, INC_FROM, INC_TO,
       MEP_ERR_AUTH},
      {"secret length huge", M, 2, 2, 3, 5, 1, UINT32_MAX, -1, INC_FROM,
       INC_TO, MEP_ERR_AUTH},
      {"secret first byte", M, 2, 2, 3, 5, 1, 16, 0, INC_FROM, INC_TO,
       MEP_ERR_AUTH},
      {"secret last byte", M, 2, 2, 3, 5, 1, 16, 15, INC_FROM, INC_TO,
       MEP_ERR_AUTH},
  };
  uint8_t sec[64] = {0};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    memcpy(sec, secret, 16);
    if (cases[i].flip >= 0) sec[cases[i].flip] ^= 0x40;
    uint32_t sl = cases[i].slen <= 64 ? cases[i].slen : 0;
    hello(b, cases[i].magic, cases[i].ver, cases[i].nsock, cases[i].from,
          cases[i].to, cases[i].idx, sec, sl, cases[i].from_inc,
          cases[i].to_inc);
    le(b + 20, cases[i].slen, 4);
    why[0] = '\0';
    int rc = hcheck(b, 40 + sl, why);
    CHECK(rc == cases[i].want, "hello %s: got %d want %d (%s)",
          cases[i].what, rc, cases[i].want, why);
    CHECK(why[0], "hello %s: no reason", cases[i].what);
  }
  /* a wrong magic is refused after its first differing byte */
  memcpy(b, "GET / HTTP/1.1\r\n", 16);
  CHECK(hcheck(b, 1, why) == MEP_ERR_PROTOCOL, "HTTP probe, 1 byte");
  /* random garbage is never accepted */
  for (int it = 0; it < 100000; it++) {
    size_t len = rnd() % sizeof b;
    for (size_t k = 0; k < len; k++) b[k] = (uint8_t)rnd();
    CHECK(hcheck(b, len, why) != 0, "random hello accepted");
  }
  test_acks();
}

/* --------------------------------------------------------------- blobs */

static void test_blobs(void) {
  char why[200];
  uint8_t b[MEP_TCP_RKEY_LEN + 1];
  uint64_t inc = rnd() | 1;
  mep__tcp_addr_t a = {.ip = {10, 1, 2, 3}, .port = 31001,
                       .incarnation = inc}, o;
  mep__tcp_addr_encode(b, &a);
  CHECK(mep__tcp_addr_decode(b, MEP_TCP_ADDR_LEN, &o, why, sizeof why) == 0 &&
            !memcmp(o.ip, a.ip, 4) && o.port == 31001 &&
            o.incarnation == inc,
        "address round trip: %s", why);
  CHECK(MEP_TCP_ADDR_LEN == 24 && rd(b + 12, 2) == 31001 && b[8] == 10 &&
            b[11] == 3 && rd(b + 16, 8) == inc,
        "address layout");
  CHECK(mep__tcp_addr_decode(b, MEP_TCP_ADDR_LEN - 1, &o, why, sizeof why),
        "short address");
  CHECK(mep__tcp_addr_decode(NULL, MEP_TCP_ADDR_LEN, &o, why, sizeof why),
        "NULL address");
  for (int i = 0; i < MEP_TCP_ADDR_LEN; i++) {
    if (i >= 8 && i < 12) continue; /* any IPv4 address is fine */
    uint8_t c[MEP_TCP_ADDR_LEN];
    memcpy(c, b, sizeof c);
    c[i] ^= (uint8_t)(1 + rnd() % 255);
    int ok = mep__tcp_addr_decode(c, sizeof c, &o, why, sizeof why) == 0;
    /* only a change to another non-zero port or incarnation stays valid */
    int port_ok = (i == 12 || i == 13) && rd(c + 12, 2) != 0;
    int inc_ok = i >= 16 && rd(c + 16, 8) != 0;
    CHECK(ok == (port_ok || inc_ok), "address byte %d changed: ok=%d", i,
          ok);
  }
  memset(b + 16, 0, 8);
  CHECK(mep__tcp_addr_decode(b, MEP_TCP_ADDR_LEN, &o, why, sizeof why) ==
                MEP_ERR_PROTOCOL &&
            strstr(why, "incarnation"),
        "address of incarnation 0 accepted");
  mep__tcp_rkey_t k = {.rank = 3, .region = 77, .len = (1ull << 40) + 5}, ko;
  mep__tcp_rkey_encode(b, &k);
  CHECK(mep__tcp_rkey_decode(b, MEP_TCP_RKEY_LEN, &ko, why, sizeof why) == 0 &&
            ko.rank == 3 && ko.region == 77 && ko.len == k.len,
        "rkey round trip: %s", why);
  CHECK(rd(b + 12, 4) == 77 && rd(b + 16, 8) == k.len, "rkey layout");
  CHECK(mep__tcp_rkey_decode(b, MEP_TCP_RKEY_LEN + 1, &ko, why, sizeof why),
        "long rkey");
  for (int i = 0; i < 8; i++) {
    b[i] ^= 0x10;
    CHECK(mep__tcp_rkey_decode(b, MEP_TCP_RKEY_LEN, &ko, why, sizeof why),
          "rkey header byte %d changed accepted", i);
    b[i] ^= 0x10;
  }
  le(b + 12, 0, 4);
  CHECK(mep__tcp_rkey_decode(b, MEP_TCP_RKEY_LEN, &ko, why, sizeof why),
        "rkey of region 0 accepted");
}

int main(int argc, char **argv) {
  rng = argc > 1 ? strtoull(argv[1], NULL, 0) : 0;
  if (!rng) {
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&rng, sizeof rng, 1, f) != 1) rng = 0x9e3779b97f4a7c15ull;
    if (f) fclose(f);
    rng |= 1;
  }
  printf("seed %#" PRIx64 "\n", rng);
  test_messages();
  fuzz_messages(300000);
  test_handshake();
  test_blobs();
  if (failures) {
    printf("%d checks failed (seed above)\n", failures);
    return 1;
  }
  printf("all wire checks passed\n");
  return 0;
}
