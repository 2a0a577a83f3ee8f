/* check.h - assertions for mep's tests, and a deterministic generator so a
 * receiver can regenerate what a sender wrote. */
#ifndef MEP_TESTS_CHECK_H
#define MEP_TESTS_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mep/mep.h>

#define CHECK(cond, ...)                                                      \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
      fprintf(stderr, __VA_ARGS__);                                           \
      fprintf(stderr, "\n");                                                  \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

/* Checks a mep call returned `want`; prints mep_last_error() otherwise. */
#define CHECK_RC(call, want)                                                  \
  do {                                                                        \
    int rc_ = (call);                                                         \
    CHECK(rc_ == (want), "%s returned %d (%s), want %d; last error: %s",     \
          #call, rc_, mep_strerror(rc_), (int)(want), mep_last_error());     \
  } while (0)

#define CHECK_OK(call) CHECK_RC(call, MEP_OK)

/* The last error contains `needle`. */
#define CHECK_MSG(needle)                                                     \
  CHECK(strstr(mep_last_error(), (needle)) != NULL,                           \
        "message '%s' lacks '%s'", mep_last_error(), (needle))

static inline uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Fills buf with the stream of `seed`. */
static inline void fill_random(void *buf, size_t len, uint64_t seed) {
  uint8_t *p = buf;
  uint64_t s = seed, v = 0;
  for (size_t i = 0; i < len; i++) {
    if (i % 8 == 0) v = splitmix64(&s);
    p[i] = (uint8_t)(v >> (8 * (i % 8)));
  }
}

/* Index of the first byte of buf that differs from the stream of `seed`,
 * or -1. */
static inline long long diff_random(const void *buf, size_t len,
                                    uint64_t seed) {
  const uint8_t *p = buf;
  uint64_t s = seed, v = 0;
  for (size_t i = 0; i < len; i++) {
    if (i % 8 == 0) v = splitmix64(&s);
    if (p[i] != (uint8_t)(v >> (8 * (i % 8)))) return (long long)i;
  }
  return -1;
}

#endif
