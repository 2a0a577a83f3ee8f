/* pattern.c - reproducible pseudo-random data and its comparison. */
#include "pattern.h"

#include <string.h>

#include "worker.h"

uint64_t pc_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void pc_rng_seed(pc_rng_t *r, uint64_t seed) { r->state = seed; }

uint64_t pc_rng_next(pc_rng_t *r) {
  r->state += 0x9e3779b97f4a7c15ull;
  return pc_mix(r->state);
}

uint64_t pc_rng_range(pc_rng_t *r, uint64_t lo, uint64_t hi) {
  uint64_t span = hi - lo + 1;
  if (span == 0) return pc_rng_next(r); /* the whole 64-bit range */
  return lo + pc_rng_next(r) % span;
}

uint64_t pc_seed_for(uint64_t base, uint64_t a, uint64_t b, uint64_t c) {
  return pc_mix(pc_mix(pc_mix(base ^ a) ^ b) ^ c);
}

/* The 8 bytes of word k of a stream, least significant first. */
static uint64_t word_of(uint64_t seed, uint64_t k) {
  return pc_mix(seed ^ (k * 0xd1b54a32d192ed03ull));
}

static unsigned char byte_of(uint64_t seed, uint64_t i) {
  return (unsigned char)(word_of(seed, i / 8) >> (8 * (i % 8)));
}

void pc_fill(void *dst, size_t len, uint64_t seed, uint64_t start) {
  unsigned char *p = dst;
  size_t i = 0;
  while (i < len && (start + i) % 8 != 0) {
    p[i] = byte_of(seed, start + i);
    i++;
  }
  for (; i + 8 <= len; i += 8) {
    uint64_t w = word_of(seed, (start + i) / 8);
    for (int b = 0; b < 8; b++) p[i + (size_t)b] = (unsigned char)(w >> (8 * b));
  }
  for (; i < len; i++) p[i] = byte_of(seed, start + i);
}

int pc_diff(const void *buf, size_t len, uint64_t seed, uint64_t start,
            size_t *at, unsigned char *want) {
  unsigned char chunk[8192];
  const unsigned char *p = buf;
  for (size_t off = 0; off < len; off += sizeof chunk) {
    size_t n = len - off < sizeof chunk ? len - off : sizeof chunk;
    pc_fill(chunk, n, seed, start + off);
    if (memcmp(chunk, p + off, n) == 0) continue;
    for (size_t i = 0; i < n; i++) {
      if (chunk[i] != p[off + i]) {
        *at = off + i;
        *want = chunk[i];
        return 1;
      }
    }
  }
  return 0;
}

void pc_expect_part(const void *buf, size_t len, size_t at, size_t total,
                    uint64_t seed, uint64_t start, const char *what) {
  size_t i;
  unsigned char want;
  if (!pc_diff(buf, len, seed, start, &i, &want)) return;
  pc_fail("byte %zu of %zu differs (got 0x%02x, want 0x%02x) in %s", at + i,
          total, ((const unsigned char *)buf)[i], want, what);
}

void pc_expect(const void *buf, size_t len, uint64_t seed, uint64_t start,
               const char *what) {
  pc_expect_part(buf, len, 0, len, seed, start, what);
}
