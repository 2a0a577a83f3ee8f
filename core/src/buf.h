/* buf.h - a growable byte buffer and a bounds-checked reader, for the
 * blobs the core publishes through the store (cards, region keys). Values
 * from the store come from other processes, so every read is checked. */
#ifndef MEP_SRC_BUF_H
#define MEP_SRC_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct mep__wbuf {
  uint8_t *data;
  size_t len, cap;
  int oom; /* sticky: set once an allocation failed */
} mep__wbuf_t;

void mep__wbuf_u32(mep__wbuf_t *b, uint32_t v);
void mep__wbuf_u64(mep__wbuf_t *b, uint64_t v);
/* A u32 length followed by the bytes. */
void mep__wbuf_bytes(mep__wbuf_t *b, const void *p, size_t len);
void mep__wbuf_str(mep__wbuf_t *b, const char *s);
void mep__wbuf_free(mep__wbuf_t *b);

typedef struct mep__rbuf {
  const uint8_t *data;
  size_t len, pos;
  int bad; /* sticky: set once a read ran past the end */
} mep__rbuf_t;

uint32_t mep__rbuf_u32(mep__rbuf_t *b);
uint64_t mep__rbuf_u64(mep__rbuf_t *b);
/* Points into the buffer; *len is set; NULL (and bad) past the end. */
const void *mep__rbuf_bytes(mep__rbuf_t *b, size_t *len);
/* A malloc'ed NUL-terminated copy, or NULL (bad, or out of memory). */
char *mep__rbuf_str(mep__rbuf_t *b);

#endif
