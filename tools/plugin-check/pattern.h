/* pattern.h - reproducible pseudo-random data. Byte i of the stream
 * `seed` is a pure function of (seed, i), so a receiver regenerates what
 * the sender wrote, chunk by chunk and from any position, instead of
 * receiving a copy through the transport under test. */
#ifndef PC_PATTERN_H
#define PC_PATTERN_H

#include <stddef.h>
#include <stdint.h>

/* A bijective 64-bit mixer (the splitmix64 finaliser). */
uint64_t pc_mix(uint64_t x);

/* A sequential generator for sizes, offsets and values. */
typedef struct pc_rng {
  uint64_t state;
} pc_rng_t;
void pc_rng_seed(pc_rng_t *r, uint64_t seed);
uint64_t pc_rng_next(pc_rng_t *r);
/* Uniform in [lo, hi]. */
uint64_t pc_rng_range(pc_rng_t *r, uint64_t lo, uint64_t hi);

/* dst[i] = byte (start + i) of stream `seed`, for i < len. */
void pc_fill(void *dst, size_t len, uint64_t seed, uint64_t start);

/* Compares buf[0..len) with the stream; returns 1 and the first differing
 * index and expected byte if they differ, else 0. */
int pc_diff(const void *buf, size_t len, uint64_t seed, uint64_t start,
            size_t *at, unsigned char *want);

/* Fails the check unless buf[0..len) holds the stream. `what` describes
 * the range; the message reads "byte 4097 of 65537 differs (got 0x3c,
 * want 0x91) in <what>". */
void pc_expect(const void *buf, size_t len, uint64_t seed, uint64_t start,
               const char *what);

/* pc_expect for a part of a larger range: buf[0..len) holds bytes at..
 * at+len of `total`, and the stream starts at `start` for byte `at`; the
 * message counts bytes from the start of the whole range. */
void pc_expect_part(const void *buf, size_t len, size_t at, size_t total,
                    uint64_t seed, uint64_t start, const char *what);

/* A seed for one purpose, derived from the check's seed and small ids. */
uint64_t pc_seed_for(uint64_t base, uint64_t a, uint64_t b, uint64_t c);

#endif
