/*
 * test_verbs_wire - the verbs plugin's pure encoders and decoders, without
 * a device or a socket: the RDMA bootstrap's messages (handshake.h), the
 * address blob and its reachability rule, the remote key, and the RC
 * step's path MTU and link-layer check (rdma_rc.c). Round trips of
 * random values; then a fuzz loop per format that mutates valid bytes and
 * compares each decoder with a predicate written here from the format's
 * description alone (little-endian by arithmetic, not with the plugin's
 * helpers).
 * usage: test_verbs_wire [SEED]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "handshake.h"
#include "rdma_dev.h"
#include "verbs.h"

static int failures;
#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      if (++failures < 20) {                                                  \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
        fprintf(stderr, __VA_ARGS__);                                         \
        fprintf(stderr, "\n");                                                \
      }                                                                       \
    }                                                                         \
  } while (0)

static uint64_t rng;
static uint64_t rnd(void) {
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545F4914F6CDD1Dull;
}
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }

static uint64_t rd(const uint8_t *p, int n) {
  uint64_t v = 0, mul = 1;
  for (int i = 0; i < n; i++, mul *= 256) v += p[i] * mul;
  return v;
}
static int zero(const uint8_t *p, int n) {
  for (int i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* Flips 1 to 3 random bytes, sometimes to a value that sits at an edge. */
static void mutate(uint8_t *b, size_t len) {
  int k = 1 + (int)below(3);
  static const uint8_t edge[] = {0, 1, 2, 5, 6, 16, 17, 0x7f, 0xff};
  for (int i = 0; i < k; i++) {
    size_t at = (size_t)below(len);
    b[at] = below(2) ? (uint8_t)rnd() : edge[below(sizeof edge)];
  }
}

/* ------------------------------------------------------------ qpinfo */

static void random_qpinfo(mep__rdma_qpinfo_t *q) {
  memset(q, 0, sizeof *q);
  for (int i = 0; i < 16; i++) q->gid[i] = (uint8_t)rnd();
  q->lid = (uint16_t)rnd();
  q->port = (uint8_t)(1 + below(2));
  q->link_layer = (uint8_t)(1 + below(2));
  q->mtu = (uint8_t)(1 + below(5));
  q->nqp = (uint8_t)(1 + below(16));
  q->scratch_addr = rnd();
  q->scratch_rkey = (uint32_t)rnd();
  for (int i = 0; i < q->nqp; i++) {
    q->qpn[i] = (uint32_t)(1 + below(0xffffff));
    q->psn[i] = (uint32_t)below(0x1000000);
  }
}

/* The format of handshake.h, read by hand: 1 valid, 0 not. */
static int qpinfo_valid(const uint8_t *b) {
  int nqp = b[21];
  if (b[19] != 1 && b[19] != 2) return 0;
  if (b[20] < 1 || b[20] > 5 || b[18] == 0) return 0;
  if (nqp < 1 || nqp > 16 || !zero(b + 22, 2) || !zero(b + 36, 4)) return 0;
  for (int i = 0; i < 16; i++) {
    uint64_t qpn = rd(b + 40 + 8 * i, 4), psn = rd(b + 44 + 8 * i, 4);
    if (i >= nqp && (qpn || psn)) return 0;
    if (i < nqp && (qpn == 0 || qpn > 0xffffff || psn > 0xffffff)) return 0;
  }
  return 1;
}

static void test_qpinfo(void) {
  for (int it = 0; it < 2000; it++) {
    mep__rdma_qpinfo_t q, back;
    random_qpinfo(&q);
    uint8_t b[MEP_RDMA_QPINFO_LEN];
    mep__rdma_qpinfo_encode(b, &q);
    char why[160];
    CHECK(mep__rdma_qpinfo_decode(b, sizeof b, &back, why, sizeof why) == 0,
          "a valid qpinfo refused: %s", why);
    CHECK(memcmp(&q, &back, sizeof q) == 0, "qpinfo round trip differs");
    CHECK(rd(b + 24, 8) == q.scratch_addr && b[21] == q.nqp &&
              rd(b + 40, 4) == q.qpn[0],
          "qpinfo fields at the wrong offsets");
    CHECK(mep__rdma_qpinfo_decode(b, sizeof b - 1, &back, why, sizeof why) ==
              MEP_ERR_PROTOCOL,
          "a truncated qpinfo accepted");
    mutate(b, sizeof b);
    int want = qpinfo_valid(b);
    int got = mep__rdma_qpinfo_decode(b, sizeof b, &back, why, sizeof why);
    CHECK(got == (want ? 0 : MEP_ERR_PROTOCOL),
          "mutated qpinfo: decoder %d, predicate %d (%s)", got, want, why);
    if (!got)
      CHECK(back.nqp == b[21] && back.qpn[0] == rd(b + 40, 4) &&
                back.lid == rd(b + 16, 2),
            "decoded qpinfo disagrees with its bytes");
  }
}

/* ------------------------------------------------------------- hello */

enum { H_OK, H_NEED, H_PROTO, H_AUTH, H_STALE };

typedef struct {
  uint32_t rank, size;
  uint64_t inc;
  uint8_t secret[64];
  uint32_t slen;
} side_t;

/* What a hello of len bytes should be, by the description: the header
 * and fixed part first (malformed: PROTO), then the length (NEED or
 * PROTO for extra bytes), the secret (AUTH), the qpinfo (PROTO), and
 * last whether it names this incarnation (STALE). */
static int hello_class(const uint8_t *b, size_t len, const side_t *me) {
  if (len >= 16 && (rd(b, 4) != 0x4250454d || rd(b + 4, 2) != 1))
    return H_PROTO;
  if (len >= 16 && (rd(b + 6, 2) < 1 || rd(b + 6, 2) > 5)) return H_PROTO;
  if (len < 40) return H_NEED;
  uint64_t from = rd(b + 8, 4), to = rd(b + 12, 4), slen = rd(b + 32, 4);
  if (rd(b + 6, 2) != 1 || rd(b + 36, 4) || to != me->rank ||
      from >= me->size || from >= me->rank || rd(b + 16, 8) == 0 ||
      slen > 256)
    return H_PROTO;
  size_t total = 40 + slen + 168;
  if (len < total) return H_NEED;
  if (len > total) return H_PROTO;
  if (slen != me->slen || memcmp(b + 40, me->secret, slen)) return H_AUTH;
  if (!qpinfo_valid(b + 40 + slen)) return H_PROTO;
  if (rd(b + 24, 8) != me->inc) return H_STALE;
  return H_OK;
}

static int hello_got(int rc) {
  if (rc > 0) return H_NEED;
  switch (rc) {
  case 0: return H_OK;
  case MEP_ERR_AUTH: return H_AUTH;
  case MEP_ERR_UNREACHABLE: return H_STALE;
  default: return H_PROTO;
  }
}

static size_t make_hello(uint8_t *b, size_t cap, const side_t *me,
                         mep__rdma_hello_t *h) {
  memset(h, 0, sizeof *h);
  h->from = (uint32_t)below(me->rank);
  h->to = me->rank;
  h->from_inc = rnd() | 1;
  h->to_inc = me->inc;
  h->secret_len = me->slen;
  h->secret = me->secret;
  random_qpinfo(&h->qp);
  return mep__rdma_hello_encode(b, cap, h);
}

static void test_hello(void) {
  for (int it = 0; it < 3000; it++) {
    side_t me = {.rank = (uint32_t)(1 + below(64)), .inc = rnd() | 1,
                 .slen = (uint32_t)below(65)};
    me.size = me.rank + 1 + (uint32_t)below(8);
    for (uint32_t i = 0; i < me.slen; i++) me.secret[i] = (uint8_t)rnd();
    mep__rdma_hello_expect_t exp = {.rank = me.rank, .size = me.size,
                                    .incarnation = me.inc,
                                    .secret = me.secret,
                                    .secret_len = me.slen};
    uint8_t b[MEP_RDMA_MAX_MSG + 8];
    mep__rdma_hello_t h, out;
    size_t n = make_hello(b, sizeof b, &me, &h);
    CHECK(n == 40 + me.slen + 168, "hello of %zu bytes", n);
    char why[200];
    CHECK(mep__rdma_hello_check(b, n, &exp, &out, why, sizeof why) == 0,
          "a good hello refused: %s", why);
    CHECK(out.from == h.from && out.from_inc == h.from_inc &&
              memcmp(&out.qp, &h.qp, sizeof h.qp) == 0,
          "hello round trip differs");
    /* every prefix asks for more, never for less than it has */
    size_t cut = (size_t)below(n);
    int need = mep__rdma_hello_check(b, cut, &exp, &out, why, sizeof why);
    CHECK(need > (int)cut && need <= (int)n,
          "a prefix of %zu of %zu bytes: %d", cut, n, need);
    /* one byte more is garbage after it */
    CHECK(mep__rdma_hello_check(b, n + 1, &exp, &out, why, sizeof why) ==
              MEP_ERR_PROTOCOL,
          "a hello with a byte after it accepted");
    size_t len = below(4) ? n : (size_t)below(n + 1);
    mutate(b, len ? len : 1);
    int want = hello_class(b, len, &me);
    int rc = mep__rdma_hello_check(b, len, &exp, &out, why, sizeof why);
    CHECK(hello_got(rc) == want, "mutated hello of %zu bytes: %d, want "
          "class %d (%s)", len, rc, want, why);
  }
}

/* ----------------------------------------------------------- answers */

static void test_answers(void) {
  for (int it = 0; it < 3000; it++) {
    uint32_t from = (uint32_t)rnd(), to = (uint32_t)rnd();
    mep__rdma_qpinfo_t q, back;
    random_qpinfo(&q);
    uint8_t b[200];
    int is_nak = (int)below(2);
    uint32_t reason = (uint32_t)(1 + below(2));
    size_t n = is_nak ? mep__rdma_nak_encode(b, sizeof b, from, to, reason)
                      : mep__rdma_accept_encode(b, sizeof b, from, to, &q);
    CHECK(n == (is_nak ? 24u : 184u), "answer of %zu bytes", n);
    int nak = -1;
    char why[160];
    CHECK(mep__rdma_answer_check(b, n, from, to, &nak, &back, why,
                                 sizeof why) == 0 &&
              nak == (is_nak ? (int)reason : 0),
          "a good answer refused: %s", why);
    if (!is_nak) CHECK(memcmp(&q, &back, sizeof q) == 0, "accept differs");
    mutate(b, n);
    /* by the description */
    uint64_t type = rd(b + 6, 2);
    int want;
    if (rd(b, 4) != 0x4250454d || rd(b + 4, 2) != 1 || type < 1 || type > 5 ||
        (type != 2 && type != 3) || rd(b + 8, 4) != from ||
        rd(b + 12, 4) != to)
      want = -1;
    else if (n != (type == 2 ? 184u : 24u))
      want = n < (type == 2 ? 184u : 24u) ? 1 : -1;
    else if (type == 2)
      want = qpinfo_valid(b + 16) ? 0 : -1;
    else
      want = rd(b + 20, 4) == 0 && (rd(b + 16, 4) == 1 || rd(b + 16, 4) == 2)
                 ? 0
                 : -1;
    int rc = mep__rdma_answer_check(b, n, from, to, &nak, &back, why,
                                    sizeof why);
    int got = rc > 0 ? 1 : rc == 0 ? 0 : -1;
    CHECK(got == want, "mutated answer: %d, want %d (%s)", rc, want, why);
  }
}

/* ----------------------------------------------------- address blobs */

static void random_addr(mep__verbs_addr_t *a) {
  memset(a, 0, sizeof *a);
  a->link_layer = (uint8_t)(1 + below(2));
  a->port = (uint8_t)(1 + below(4));
  a->mtu = (uint8_t)(1 + below(5));
  a->prefix = (uint8_t)below(33);
  a->lid = (uint16_t)rnd();
  for (int i = 0; i < 16; i++) a->gid[i] = (uint8_t)rnd();
  a->fabric = below(2) ? rnd() : 0;
  for (int i = 0; i < 4; i++) a->boot.ip[i] = (uint8_t)rnd();
  a->boot.port = (uint16_t)(1 + below(65535));
  a->boot.incarnation = rnd() | 1;
}

static int addr_valid(const uint8_t *b) {
  return rd(b, 4) == 0x5650454d && rd(b + 4, 2) == 1 &&
         (b[6] == 1 || b[6] == 2) && b[7] != 0 && b[26] >= 1 &&
         b[26] <= 5 && b[27] <= 32 && zero(b + 28, 4) && rd(b + 44, 2) != 0 &&
         zero(b + 46, 2) && rd(b + 48, 8) != 0;
}

static void test_addr(void) {
  for (int it = 0; it < 3000; it++) {
    mep__verbs_addr_t a, back;
    random_addr(&a);
    uint8_t b[MEP_VERBS_ADDR_LEN];
    mep__verbs_addr_encode(b, &a);
    char why[160];
    CHECK(mep__verbs_addr_decode(b, sizeof b, &back, why, sizeof why) == 0 &&
              memcmp(&a, &back, sizeof a) == 0,
          "address round trip: %s", why);
    CHECK(mep__verbs_addr_decode(b, sizeof b + 1, &back, why, sizeof why) ==
              MEP_ERR_PROTOCOL,
          "an address of the wrong length accepted");
    mutate(b, sizeof b);
    int want = addr_valid(b);
    int rc = mep__verbs_addr_decode(b, sizeof b, &back, why, sizeof why);
    CHECK((rc == 0) == want, "mutated address: %d, want valid=%d (%s)", rc,
          want, why);
  }
}

/* An IPv4-mapped GID ::ffff:a.b.c.d. */
static void v4(mep__verbs_addr_t *a, uint32_t ip, int prefix) {
  memset(a->gid, 0, 10);
  a->gid[10] = a->gid[11] = 0xff;
  for (int i = 0; i < 4; i++) a->gid[12 + i] = (uint8_t)(ip >> (24 - 8 * i));
  a->prefix = (uint8_t)prefix;
  a->link_layer = 2;
}

static int reach(const mep__verbs_addr_t *a, const mep__verbs_addr_t *b) {
  char why[160];
  int x = mep__verbs_reach(a, b, why, sizeof why);
  int y = mep__verbs_reach(b, a, why, sizeof why);
  CHECK(x == y, "reach is not symmetric (%d, %d)", x, y);
  return x;
}

static void test_reach(void) {
  mep__verbs_addr_t a, b;
  random_addr(&a);
  b = a;
  a.fabric = b.fabric = 0;
  v4(&a, 0x0a000001, 24);
  v4(&b, 0x0a000002, 24);
  CHECK(reach(&a, &b) == 1, "10.0.0.1/24 and 10.0.0.2/24");
  v4(&b, 0x0a000102, 24);
  CHECK(reach(&a, &b) == 0, "10.0.0.1/24 and 10.0.1.2/24");
  v4(&b, 0x0a000102, 16);
  CHECK(reach(&a, &b) == 1, "10.0.0.1/24 and 10.0.1.2/16: the shorter");
  v4(&b, 0x0b000102, 0);
  CHECK(reach(&a, &b) == 1, "an unknown prefix matches");
  a.fabric = mep__verbs_fabric_hash("east");
  CHECK(reach(&a, &b) == 0, "a fabric on one side only");
  b.fabric = mep__verbs_fabric_hash("east");
  CHECK(reach(&a, &b) == 1, "the same fabric across subnets");
  b.fabric = mep__verbs_fabric_hash("west");
  CHECK(reach(&a, &b) == 0, "other fabrics");
  a.fabric = b.fabric = 0;
  a.link_layer = 1;
  CHECK(reach(&a, &b) == 0, "InfiniBand and Ethernet");
  b.link_layer = 1;
  memset(a.gid, 0, 16);
  memset(b.gid, 0, 16);
  a.gid[0] = b.gid[0] = 0xfe;
  a.gid[15] = 1;
  CHECK(reach(&a, &b) == 1, "one InfiniBand subnet");
  b.gid[3] = 7;
  CHECK(reach(&a, &b) == 0, "two InfiniBand subnets");
  CHECK(mep__verbs_fabric_hash("") == 0 && mep__verbs_fabric_hash(NULL) == 0,
        "an empty fabric name hashes to 0");
  /* random pairs: symmetric, and a function of the rule's inputs only */
  for (int it = 0; it < 5000; it++) {
    random_addr(&a);
    random_addr(&b);
    if (below(2)) b.fabric = a.fabric;
    if (below(2)) b.link_layer = a.link_layer;
    if (below(2)) v4(&a, (uint32_t)rnd(), (int)below(33));
    if (below(2)) v4(&b, (uint32_t)rnd() & 0xffffff00u, (int)below(33));
    if (below(3) == 0) memcpy(b.gid, a.gid, 12);
    int r = reach(&a, &b);
    int want;
    if (a.fabric || b.fabric) want = a.fabric == b.fabric;
    else if (a.link_layer != b.link_layer) want = 0;
    else if (a.link_layer == 2 && a.gid[10] == 0xff && a.gid[11] == 0xff &&
             zero(a.gid, 10) && b.gid[10] == 0xff && b.gid[11] == 0xff &&
             zero(b.gid, 10)) {
      int bits = a.prefix < b.prefix ? a.prefix : b.prefix;
      uint64_t ia = rd((const uint8_t[]){a.gid[15], a.gid[14], a.gid[13],
                                         a.gid[12]}, 4);
      uint64_t ib = rd((const uint8_t[]){b.gid[15], b.gid[14], b.gid[13],
                                         b.gid[12]}, 4);
      want = bits == 0 || (ia >> (32 - bits)) == (ib >> (32 - bits));
    } else {
      want = memcmp(a.gid, b.gid, 8) == 0;
    }
    CHECK(r == want, "reach %d, want %d", r, want);
  }
}

/* ------------------------------------------------------- remote keys */

static void test_rkey(void) {
  for (int it = 0; it < 3000; it++) {
    mep__verbs_rkey_t k = {.rank = (uint32_t)rnd(), .rkey = (uint32_t)rnd(),
                           .kind = (uint32_t)below(2),
                           .flags = (uint32_t)below(2), .addr = rnd() >> 1,
                           .len = rnd() >> 2},
                      back = {0};
    uint8_t b[MEP_VERBS_RKEY_LEN];
    mep__verbs_rkey_encode(b, &k);
    char why[160] = "";
    /* field by field: the struct's padding is not part of the key */
    CHECK(mep__verbs_rkey_decode(b, sizeof b, &back, why, sizeof why) == 0 &&
              k.rank == back.rank && k.rkey == back.rkey &&
              k.kind == back.kind && k.flags == back.flags &&
              k.addr == back.addr && k.len == back.len,
          "rkey round trip: %s", why[0] ? why : "a field differs");
    CHECK(mep__verbs_rkey_decode(b, sizeof b - 1, &back, why, sizeof why) ==
              MEP_ERR_PROTOCOL,
          "a short rkey accepted");
    mutate(b, sizeof b);
    uint64_t addr = rd(b + 16, 8), len = rd(b + 24, 8);
    /* version 1 (a u16 kind, no flags) is still read */
    int kind_ok = rd(b + 4, 2) == 1 ? rd(b + 6, 2) <= 1
                  : rd(b + 4, 2) == 2 ? b[6] <= 1 && b[7] <= 1
                                      : 0;
    int want = rd(b, 4) == 0x5750454d && kind_ok &&
               (len == 0 || addr <= UINT64_MAX - len);
    int rc = mep__verbs_rkey_decode(b, sizeof b, &back, why, sizeof why);
    CHECK((rc == 0) == want, "mutated rkey: %d, want valid=%d (%s)", rc,
          want, why);
  }
}

/* A version-1 key reads as a key without flags. */
static void test_rkey_v1(void) {
  uint8_t b[MEP_VERBS_RKEY_LEN];
  mep__verbs_rkey_t k = {.rank = 3, .rkey = 0x1234, .kind = 1, .flags = 1,
                         .addr = 4096, .len = 64},
                    back = {0};
  mep__verbs_rkey_encode(b, &k);
  b[4] = 1; /* version 1: kind as u16 */
  b[7] = 0;
  char why[160] = "";
  CHECK(mep__verbs_rkey_decode(b, sizeof b, &back, why, sizeof why) == 0 &&
            back.kind == 1 && back.flags == 0 && back.rkey == 0x1234,
        "a version-1 key: %s", why);
}

/* ------------------------------------- signals in band (inband_wire.c) */

static void test_imm(void) {
  for (int it = 0; it < 3000; it++) {
    int op = (int)below(2), op2 = -1;
    unsigned idx = (unsigned)below(VERBS_WORDS), idx2 = 0;
    uint32_t v = (uint32_t)below(VERBS_IMM_VALUE_MAX + 1ull), v2 = 0;
    uint32_t imm = mep__verbs_imm_encode(op, idx, v);
    CHECK(mep__verbs_imm_decode(imm, &op2, &idx2, &v2) == 1 && op2 == op &&
              idx2 == idx && v2 == v,
          "immediate round trip: op %d index %u value %u", op, idx, v);
    uint32_t any = (uint32_t)rnd();
    CHECK(mep__verbs_imm_decode(any, &op2, &idx2, &v2) == (int)(any >> 31),
          "immediate %#x: the signal bit decides", any);
    if (any >> 31)
      CHECK(idx2 < VERBS_WORDS && v2 <= VERBS_IMM_VALUE_MAX,
            "immediate %#x decodes out of range", any);
  }
  int op;
  unsigned idx;
  uint32_t v;
  CHECK(mep__verbs_imm_decode(0, &op, &idx, &v) == 0,
        "immediate 0 (a one-sided SET's wake-up) carries a signal");
}

static void test_sigmsg(void) {
  for (int it = 0; it < 3000; it++) {
    mep__verbs_sigmsg_t m = {.op = (int)below(2),
                             .index = below(4) ? (uint16_t)below(VERBS_WORDS)
                                               : VERBS_NO_INDEX,
                             .rkey = (uint32_t)rnd(), .raddr = rnd() & ~7ull,
                             .value = rnd()},
                        back = {0};
    uint8_t b[VERBS_SIGMSG_LEN];
    mep__verbs_sigmsg_encode(b, &m);
    char why[160] = "";
    CHECK(mep__verbs_sigmsg_decode(b, sizeof b, &back, why, sizeof why) ==
                  0 &&
              back.op == m.op && back.index == m.index &&
              back.rkey == m.rkey && back.raddr == m.raddr &&
              back.value == m.value,
          "signal message round trip: %s", why[0] ? why : "a field differs");
    CHECK(mep__verbs_sigmsg_decode(b, sizeof b - 1, &back, why, sizeof why) ==
              MEP_ERR_PROTOCOL,
          "a short signal message accepted");
    mutate(b, sizeof b);
    uint64_t index = rd(b + 6, 2);
    int want = rd(b, 4) == 0x5350454d && b[4] == 1 && b[5] <= 1 &&
               (index < VERBS_WORDS || index == VERBS_NO_INDEX) &&
               zero(b + 12, 4) && rd(b + 16, 8) % 8 == 0;
    int rc = mep__verbs_sigmsg_decode(b, sizeof b, &back, why, sizeof why);
    CHECK((rc == 0) == want, "mutated signal message: %d, want valid=%d (%s)",
          rc, want, why);
  }
}

/* ------------------------------------------------ bootstrap address */

static void test_boot_addr(void) {
  for (int it = 0; it < 2000; it++) {
    mep__rdma_boot_addr_t a, back;
    memset(&a, 0, sizeof a);
    memset(&back, 0, sizeof back);
    a.port = (uint16_t)(1 + below(65535));
    a.incarnation = rnd() | 1;
    for (int i = 0; i < 4; i++) a.ip[i] = (uint8_t)rnd();
    uint8_t b[MEP_RDMA_BOOT_ADDR_LEN];
    mep__rdma_boot_addr_encode(b, &a);
    char why[100];
    CHECK(mep__rdma_boot_addr_decode(b, &back, why, sizeof why) == 0 &&
              memcmp(&a, &back, sizeof a) == 0,
          "bootstrap address round trip: %s", why);
    mutate(b, sizeof b);
    int want = rd(b + 4, 2) != 0 && zero(b + 6, 2) && rd(b + 8, 8) != 0;
    int rc = mep__rdma_boot_addr_decode(b, &back, why, sizeof why);
    CHECK((rc == 0) == want, "mutated bootstrap address: %d (%s)", rc, why);
  }
}

/* The RC step's path (rdma_rc.c) for every MTU of the configuration (0:
 * the port's), the port and the peer, against the rule written here: the
 * configured MTU capped by the port's, then the smaller of the two sides';
 * and the error, naming both layers, when the peer's port is on another
 * link layer. */
static void test_rc_path(void) {
  static const char *const layer[3] = {"", "InfiniBand", "Ethernet"};
  mep__rdma_dev_t d;
  mep__rdma_qpinfo_t t;
  char why[96];
  for (int cfg = 0; cfg <= 5; cfg++)
    for (int port = 1; port <= 5; port++)
      for (int peer = 1; peer <= 5; peer++) {
        memset(&d, 0, sizeof d);
        memset(&t, 0, sizeof t);
        d.link_layer = t.link_layer = 2;
        d.mtu = (uint8_t)port;
        t.mtu = (uint8_t)peer;
        mep__rdma_path_t p = {.mtu = cfg};
        int mine = cfg == 0 || cfg > port ? port : cfg;
        int want = mine < peer ? mine : peer;
        enum ibv_mtu mtu = 0;
        int rc = mep__rdma_rc_path(&d, &p, &t, &mtu, why, sizeof why);
        CHECK(rc == 0 && (int)mtu == want,
              "cfg %d port %d peer %d: rc %d, MTU %d, want %d", cfg, port,
              peer, rc, (int)mtu, want);
      }
  for (int mine = 1; mine <= 2; mine++) {
    memset(&d, 0, sizeof d);
    memset(&t, 0, sizeof t);
    d.link_layer = (uint8_t)mine;
    t.link_layer = (uint8_t)(3 - mine);
    d.mtu = t.mtu = 3;
    mep__rdma_path_t p = {0};
    enum ibv_mtu mtu = 0;
    char want[96];
    snprintf(want, sizeof want,
             "device is on another link layer (%s, this one %s)",
             layer[3 - mine], layer[mine]);
    int rc = mep__rdma_rc_path(&d, &p, &t, &mtu, why, sizeof why);
    CHECK(rc == MEP_ERR_UNREACHABLE && strcmp(why, want) == 0,
          "link layers %d and %d: rc %d, \"%s\"", mine, 3 - mine, rc, why);
  }
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0)
                           : (uint64_t)time(NULL) ^ 0x5eed;
  rng = seed ? seed : 1;
  printf("test_verbs_wire: seed %" PRIu64 "\n", seed);
  test_qpinfo();
  test_hello();
  test_answers();
  test_addr();
  test_reach();
  test_rkey();
  test_rkey_v1();
  test_imm();
  test_sigmsg();
  test_boot_addr();
  test_rc_path();
  if (failures) {
    fprintf(stderr, "%d failures (seed %" PRIu64 ")\n", failures, seed);
    return 1;
  }
  printf("all checks passed\n");
  return 0;
}
