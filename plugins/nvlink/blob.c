/* blob.c - the address and remote-key blobs: encoded little-endian with a
 * magic and a version, decoded with every length checked, since they come
 * from another process through the store. */
#include <stdio.h>
#include <string.h>

#include "nvlink.h"

#define ADDR_MAGIC 0x414c564eu /* "NVLA" */
#define RKEY_MAGIC 0x4b4c564eu /* "NVLK" */

static uint8_t *put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + 4;
}

static uint8_t *put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + 8;
}

static const uint8_t *get32(const uint8_t *p, uint32_t *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) *v |= (uint32_t)p[i] << (8 * i);
  return p + 4;
}

static const uint8_t *get64(const uint8_t *p, uint64_t *v) {
  *v = 0;
  for (int i = 0; i < 8; i++) *v |= (uint64_t)p[i] << (8 * i);
  return p + 8;
}

static int header_ok(const void *buf, size_t len, size_t want, uint32_t magic,
                     const char *what, char *why, size_t why_len) {
  if (!buf || len != want) {
    snprintf(why, why_len, "the %s blob has %zu bytes, expected %zu", what,
             buf ? len : 0, want);
    return 0;
  }
  uint32_t m, v;
  get32(get32(buf, &m), &v);
  if (m != magic || v != NVL_BLOB_VERSION) {
    snprintf(why, why_len, "the %s blob is not an nvlink %s of version %d "
             "(magic %#x, version %u)", what, what, NVL_BLOB_VERSION, m, v);
    return 0;
  }
  return 1;
}

void mep__nvl_addr_encode(uint8_t *buf, const nvl_addr_t *a) {
  uint8_t *p = put32(put32(buf, ADDR_MAGIC), NVL_BLOB_VERSION);
  p = put64(put64(put64(p, a->host), a->nonce), a->visible);
  p = put32(put32(p, a->pid), a->dev);
  memcpy(p, a->uuid, sizeof a->uuid);
  memcpy(p + sizeof a->uuid, a->busid, NVL_BUSID_LEN);
}

int mep__nvl_addr_decode(const void *buf, size_t len, nvl_addr_t *a,
                         char *why, size_t why_len) {
  if (!header_ok(buf, len, NVL_ADDR_LEN, ADDR_MAGIC, "address", why, why_len))
    return -1;
  const uint8_t *p = (const uint8_t *)buf + 8;
  p = get64(get64(get64(p, &a->host), &a->nonce), &a->visible);
  p = get32(get32(p, &a->pid), &a->dev);
  memcpy(a->uuid, p, sizeof a->uuid);
  memcpy(a->busid, p + sizeof a->uuid, NVL_BUSID_LEN);
  if (!memchr(a->busid, '\0', NVL_BUSID_LEN)) {
    snprintf(why, why_len, "the address blob's PCI bus id is not "
             "terminated");
    return -1;
  }
  return 0;
}

void mep__nvl_rkey_encode(uint8_t *buf, const nvl_rkey_t *k) {
  uint8_t *p = put32(put32(buf, RKEY_MAGIC), NVL_BLOB_VERSION);
  p = put64(put64(put64(put64(p, k->nonce), k->off), k->len), k->size);
  memcpy(p, k->handle, NVL_HANDLE_LEN);
}

int mep__nvl_rkey_decode(const void *buf, size_t len, nvl_rkey_t *k,
                         char *why, size_t why_len) {
  if (!header_ok(buf, len, NVL_RKEY_LEN, RKEY_MAGIC, "remote-key", why,
                 why_len))
    return -1;
  const uint8_t *p = (const uint8_t *)buf + 8;
  p = get64(get64(get64(get64(p, &k->nonce), &k->off), &k->len), &k->size);
  memcpy(k->handle, p, NVL_HANDLE_LEN);
  if (k->off > k->size || k->len > k->size - k->off) {
    snprintf(why, why_len, "the key's region [%llu, +%llu) lies outside its "
             "allocation of %llu bytes", (unsigned long long)k->off,
             (unsigned long long)k->len, (unsigned long long)k->size);
    return -1;
  }
  return 0;
}
