/* name.c - names of the ring objects in /dev/shm.
 *
 * A name must differ between jobs and between connections, and must not be
 * guessable by someone without the job's secret (who could otherwise
 * create it first). So it is a keyed hash (SipHash-2-4, written from its
 * published description) of both ranks and both processes' nonces, keyed
 * by the job secret. */
#include "shm.h"

#include <stdio.h>
#include <string.h>

static uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

static uint64_t load_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void sip_round(uint64_t v[4]) {
  v[0] += v[1];
  v[1] = rotl(v[1], 13) ^ v[0];
  v[0] = rotl(v[0], 32);
  v[2] += v[3];
  v[3] = rotl(v[3], 16) ^ v[2];
  v[0] += v[3];
  v[3] = rotl(v[3], 21) ^ v[0];
  v[2] += v[1];
  v[1] = rotl(v[1], 17) ^ v[2];
  v[2] = rotl(v[2], 32);
}

static void sip_absorb(uint64_t v[4], uint64_t m) {
  v[3] ^= m;
  sip_round(v);
  sip_round(v);
  v[0] ^= m;
}

static uint64_t siphash24(const uint8_t key[16], const uint8_t *msg,
                          size_t len) {
  uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
  uint64_t v[4] = {k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull,
                   k0 ^ 0x6c7967656e657261ull, k1 ^ 0x7465646279746573ull};
  size_t full = len & ~(size_t)7;
  for (size_t i = 0; i < full; i += 8) sip_absorb(v, load_le64(msg + i));
  uint64_t last = (uint64_t)(len & 0xff) << 56;
  for (size_t i = full; i < len; i++) last |= (uint64_t)msg[i] << (8 * (i - full));
  sip_absorb(v, last);
  v[2] ^= 0xff;
  for (int i = 0; i < 4; i++) sip_round(v);
  return v[0] ^ v[1] ^ v[2] ^ v[3];
}

void shm_key_from_secret(const uint8_t *secret, size_t len, uint8_t key[16]) {
  memset(key, 0, 16);
  for (size_t i = 0; secret && i < len; i++) key[i % 16] ^= secret[i];
}

static size_t put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
  return 4;
}

void shm_ring_name(const uint8_t key[16], int src, int dst,
                   const uint8_t *rx_nonce, const uint8_t *tx_nonce,
                   char name[SHM_NAME_MAX]) {
  uint8_t msg[1 + 4 + 4 + 2 * SHM_NONCE_BYTES];
  size_t n = 1;
  n += put_u32(msg + n, (uint32_t)src);
  n += put_u32(msg + n, (uint32_t)dst);
  memcpy(msg + n, rx_nonce, SHM_NONCE_BYTES);
  n += SHM_NONCE_BYTES;
  memcpy(msg + n, tx_nonce, SHM_NONCE_BYTES);
  n += SHM_NONCE_BYTES;
  msg[0] = 1; /* two domains give 128 bits */
  uint64_t a = siphash24(key, msg, n);
  msg[0] = 2;
  uint64_t b = siphash24(key, msg, n);
  snprintf(name, SHM_NAME_MAX, "/mep-shm-%016llx%016llx",
           (unsigned long long)a, (unsigned long long)b);
}

