/* The ring geometry against the documented rule, and the slot-header
 * check against every way a header can be wrong: each field of valid
 * headers is corrupted at random and must be refused, and valid headers
 * of random messages must pass. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "p2p.h"

/* The rule of DESIGN.md, written out independently. */
static void ref_geometry(uint64_t buf, uint64_t chunk, int npeers,
                         uint64_t *slot, uint64_t *nslots) {
  uint64_t share = buf / (uint64_t)npeers;
  uint64_t half = share / 2;
  uint64_t s = chunk < half ? chunk : half;
  s -= s % 64;
  if (s < 4096) s = 4096;
  uint64_t n = share / s;
  *slot = s;
  *nslots = n < 2 ? 2 : n;
}

static void test_geometry(uint64_t *seed) {
  mep__p2p_geom_t g;
  CHECK(mep__p2p_geometry(0, 4096, 1, &g) == MEP_ERR_INVALID, "zero buffer");
  CHECK(mep__p2p_geometry(4096, 4096, 0, &g) == MEP_ERR_INVALID, "no peers");
  /* Defaults: 16 MiB over one peer, 1 MiB chunks: 16 slots of 1 MiB. */
  CHECK_OK(mep__p2p_geometry(16u << 20, 1u << 20, 1, &g));
  CHECK(g.slot == 1u << 20 && g.nslots == 16 && !g.rounded_up,
        "defaults: %zu x %zu", g.nslots, g.slot);
  /* 64 KiB over 3 peers: share 21845, slot 10880, 2 slots. */
  CHECK_OK(mep__p2p_geometry(65536, 1u << 20, 3, &g));
  CHECK(g.slot == 10880 && g.nslots == 2 && !g.rounded_up,
        "64 KiB / 3: %zu x %zu", g.nslots, g.slot);
  /* Too small a share: two 4 KiB slots, said so. */
  CHECK_OK(mep__p2p_geometry(8192, 1u << 20, 5, &g));
  CHECK(g.slot == 4096 && g.nslots == 2 && g.rounded_up, "rounded up");
  for (int i = 0; i < 20000; i++) {
    uint64_t buf = 1 + splitmix64(seed) % ((uint64_t)1 << 36);
    uint64_t chunk = 4096 + splitmix64(seed) % ((uint64_t)1 << 24);
    int np = 1 + (int)(splitmix64(seed) % 5000);
    uint64_t slot, n;
    ref_geometry(buf, chunk, np, &slot, &n);
    CHECK_OK(mep__p2p_geometry(buf, chunk, np, &g));
    CHECK(g.slot == slot && g.nslots == n && g.ring == slot * n,
          "buf %llu chunk %llu peers %d: got %zu x %zu, want %llu x %llu",
          (unsigned long long)buf, (unsigned long long)chunk, np, g.nslots,
          g.slot, (unsigned long long)n, (unsigned long long)slot);
    CHECK(g.slot % 64 == 0 && g.slot >= 4096 && g.slot <= chunk + 4096 &&
              g.nslots >= 2,
          "invariants");
    CHECK(g.rounded_up == (buf / (uint64_t)np < 2 * slot), "rounded_up");
  }
}

/* A valid header for the next slot of a random message stream. */
static void valid_pair(uint64_t *seed, mep__p2p_hdr_t *h,
                       mep__p2p_expect_t *e) {
  size_t payload = 64 + (size_t)(splitmix64(seed) % 5000);
  uint64_t total = splitmix64(seed) % 4 == 0 ? 0
                                             : splitmix64(seed) % 20000;
  int in_msg = total > payload && splitmix64(seed) % 2;
  uint64_t got = in_msg ? payload * (1 + splitmix64(seed) %
                                             ((total - 1) / payload))
                        : 0;
  *e = (mep__p2p_expect_t){.src = (int)(splitmix64(seed) % 1000),
                           .slot_no = splitmix64(seed) % 100000,
                           .payload = payload,
                           .in_msg = in_msg,
                           .tag = (int32_t)(splitmix64(seed) % 1000),
                           .seq = splitmix64(seed) % 1000,
                           .total = total,
                           .got = got,
                           .next_seq = splitmix64(seed) % 1000};
  uint64_t left = total - got;
  *h = (mep__p2p_hdr_t){.magic = MEP__P2P_MAGIC,
                        .tag = in_msg ? e->tag
                                      : (int32_t)(splitmix64(seed) % 99),
                        .src = (uint32_t)e->src,
                        .slot_no = e->slot_no,
                        .seq = in_msg ? e->seq : e->next_seq,
                        .total = total,
                        .offset = got,
                        .len = left < payload ? left : payload};
}

static void test_header(uint64_t *seed) {
  char why[256];
  for (int i = 0; i < 200000; i++) {
    mep__p2p_hdr_t h;
    mep__p2p_expect_t e;
    valid_pair(seed, &h, &e);
    CHECK(mep__p2p_hdr_check(&h, &e, why, sizeof why) == MEP_OK,
          "valid header refused: %s", why);
    mep__p2p_hdr_t bad = h;
    uint64_t d = 1 + splitmix64(seed) % 1000;
    int field = (int)(splitmix64(seed) % 9);
    switch (field) {
    case 0: bad.magic ^= (uint32_t)d; break;
    case 1: bad.src += (uint32_t)d; break;
    case 2: bad.slot_no += d; break;
    case 3: bad.seq += d; break;
    case 4: bad.len += d; break;
    case 5: bad.len = h.len ? h.len - 1 : 1; break; /* short fragment */
    case 6: bad.offset += d; break;
    case 7: bad.flags = (uint32_t)d; break;
    case 8:
      if (e.in_msg) bad.total += d; /* a new message may have any length */
      else bad.tag = -(int32_t)d;
      break;
    }
    char why2[256] = "";
    CHECK(mep__p2p_hdr_check(&bad, &e, why2, sizeof why2) ==
              MEP_ERR_PROTOCOL,
          "corrupt field %d accepted (in_msg %d total %llu len %llu)", field,
          e.in_msg, (unsigned long long)h.total, (unsigned long long)h.len);
    CHECK(why2[0], "no reason for field %d", field);
    if (e.in_msg) { /* a fragment of another message */
      bad = h;
      bad.tag ^= 1;
      CHECK(mep__p2p_hdr_check(&bad, &e, why2, sizeof why2) ==
                MEP_ERR_PROTOCOL, "other tag accepted mid-message");
    }
  }
  /* Lengths near overflow never pass. */
  mep__p2p_hdr_t h;
  mep__p2p_expect_t e;
  valid_pair(seed, &h, &e);
  h.offset = UINT64_MAX - 1;
  h.len = 2;
  CHECK(mep__p2p_hdr_check(&h, &e, why, sizeof why) == MEP_ERR_PROTOCOL,
        "overflowing offset accepted");
  h.magic = 0;
  snprintf(why, sizeof why, "x");
  mep__p2p_hdr_check(&h, &e, why, sizeof why);
  CHECK(strstr(why, "magic"), "reason '%s' does not name the magic", why);
}

int main(int argc, char **argv) {
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0)
                           : (uint64_t)time(NULL);
  printf("seed %llu\n", (unsigned long long)seed);
  test_geometry(&seed);
  test_header(&seed);
  printf("ok\n");
  return 0;
}
