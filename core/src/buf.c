/* buf.c - little-endian encoding of the core's store blobs. */
#include "buf.h"

#include <stdlib.h>
#include <string.h>

static void put(mep__wbuf_t *b, const void *p, size_t len) {
  if (b->oom) return;
  if (b->len + len > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + len) cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) {
      b->oom = 1;
      return;
    }
    b->data = d;
    b->cap = cap;
  }
  if (len) memcpy(b->data + b->len, p, len);
  b->len += len;
}

void mep__wbuf_u32(mep__wbuf_t *b, uint32_t v) {
  uint8_t le[4];
  for (int i = 0; i < 4; i++) le[i] = (uint8_t)(v >> (8 * i));
  put(b, le, sizeof le);
}

void mep__wbuf_u64(mep__wbuf_t *b, uint64_t v) {
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(v >> (8 * i));
  put(b, le, sizeof le);
}

void mep__wbuf_bytes(mep__wbuf_t *b, const void *p, size_t len) {
  if (len > UINT32_MAX) {
    b->oom = 1;
    return;
  }
  mep__wbuf_u32(b, (uint32_t)len);
  put(b, p, len);
}

void mep__wbuf_str(mep__wbuf_t *b, const char *s) {
  mep__wbuf_bytes(b, s ? s : "", s ? strlen(s) : 0);
}

void mep__wbuf_free(mep__wbuf_t *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

static const uint8_t *take(mep__rbuf_t *b, size_t len) {
  if (b->bad || len > b->len - b->pos) {
    b->bad = 1;
    return NULL;
  }
  const uint8_t *p = b->data + b->pos;
  b->pos += len;
  return p;
}

uint32_t mep__rbuf_u32(mep__rbuf_t *b) {
  const uint8_t *p = take(b, 4);
  uint32_t v = 0;
  for (int i = 0; p && i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

uint64_t mep__rbuf_u64(mep__rbuf_t *b) {
  const uint8_t *p = take(b, 8);
  uint64_t v = 0;
  for (int i = 0; p && i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

const void *mep__rbuf_bytes(mep__rbuf_t *b, size_t *len) {
  *len = mep__rbuf_u32(b);
  const void *p = take(b, *len);
  if (!p) *len = 0;
  return p;
}

char *mep__rbuf_str(mep__rbuf_t *b) {
  size_t len;
  const char *p = mep__rbuf_bytes(b, &len);
  if (!p || memchr(p, '\0', len)) {
    b->bad = 1;
    return NULL;
  }
  char *s = malloc(len + 1);
  if (!s) return NULL;
  memcpy(s, p, len);
  s[len] = '\0';
  return s;
}
