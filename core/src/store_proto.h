/* store_proto.h - the wire format of the built-in TCP store.
 *
 * Every message, request or reply, is one frame: a fixed 28-byte header,
 * then key_len bytes of key, then val_len bytes of value. Integers are
 * little-endian.
 *
 *   offset  size  field
 *        0     4  magic    "MEPS" (bytes 'M' 'E' 'P' 'S')
 *        4     1  version  MEP__STORE_VERSION
 *        5     1  op       a request (SET..CHECK) or a reply (OK, ERR)
 *        6     2  flags    MEP__STORE_NOWAIT on GET; 0 everywhere else
 *        8     4  seq      chosen by the client, echoed by the reply
 *       12     4  key_len
 *       16     8  val_len
 *       24     4  check    FNV-1a (32 bit) of bytes 0..23
 *
 * The check makes a corrupted or misaligned header (a length bit flipped,
 * a stream that lost its place) fail instead of being obeyed.
 *
 * Requests (key_len >= 1 always):
 *   SET    value = the bytes to store.                 reply OK, no value
 *   GET    no value. Parked by the server until the key exists, unless
 *          flags has NOWAIT: then an absent key is ERR MEP_ERR_TIMEOUT.
 *                                                      reply OK, the value
 *   ADD    value = int64 delta (8 bytes).              reply OK, int64 new
 *          A counter's value is stored as decimal ASCII text ("-12"), the
 *          way c10d stores keep counters, so get() of a counter reads the
 *          same through every store; add() on any other value is an ERR.
 *   CHECK  no value.                                   reply OK, 1 byte 0|1
 * Replies have key_len 0. ERR's value is an int32 MEP_ERR_* code and a
 * reason of at most MEP__STORE_ERRMSG_MAX bytes (not NUL-terminated).
 *
 * A request whose key is over MEP__STORE_KEY_MAX or whose value is over
 * MEP__STORE_VAL_MAX is well-formed but refused: the server reads and drops
 * its body, answers ERR MEP_ERR_INVALID and keeps the connection.
 */
#ifndef MEP_SRC_STORE_PROTO_H
#define MEP_SRC_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define MEP__STORE_MAGIC 0x5350454dU /* "MEPS" read little-endian */
#define MEP__STORE_VERSION 1
#define MEP__STORE_HDR_LEN 28
#define MEP__STORE_KEY_MAX 4096
#define MEP__STORE_VAL_MAX ((uint64_t)1 << 30)
#define MEP__STORE_ERRMSG_MAX 1024
#define MEP__STORE_NOWAIT 0x1

enum {
  MEP__STORE_SET = 1,
  MEP__STORE_GET = 2,
  MEP__STORE_ADD = 3,
  MEP__STORE_CHECK = 4,
  MEP__STORE_OK = 0x80,
  MEP__STORE_ERR = 0x81,
};

/* Which side is decoding: the server reads requests, the client replies. */
typedef enum {
  MEP__STORE_REQUEST = 0,
  MEP__STORE_REPLY = 1,
} mep__store_dir_t;

typedef enum {
  MEP__STORE_FRAME_OK = 0,   /* a complete, valid header (or frame) */
  MEP__STORE_NEED_MORE = 1,  /* valid so far, but too short to decide */
  MEP__STORE_TOO_LARGE = 2,  /* valid request over the key/value limits */
  MEP__STORE_MALFORMED = 3,  /* not a frame of this protocol */
} mep__store_verdict_t;

typedef struct mep__store_hdr {
  uint8_t op;
  uint16_t flags;
  uint32_t seq;
  uint32_t key_len;
  uint64_t val_len;
} mep__store_hdr_t;

/* FNV-1a (32 bit) of the first 24 header bytes. */
uint32_t mep__store_check(const uint8_t *hdr);

/* Writes the 28 header bytes, check included. */
void mep__store_encode_header(uint8_t out[MEP__STORE_HDR_LEN],
                              const mep__store_hdr_t *hdr);

/* Decides on the first `len` bytes of a stream that should start with a
 * header. Pure: reads only buf[0..len), allocates nothing. Bytes that can
 * already be seen to be wrong (magic, version, op) make MALFORMED before
 * the whole header arrived, so garbage is refused early. On FRAME_OK and
 * TOO_LARGE *hdr is filled; on MALFORMED *why (when why != NULL) names the
 * reason in a static string. */
mep__store_verdict_t mep__store_decode_header(const void *buf, size_t len,
                                              mep__store_dir_t dir,
                                              mep__store_hdr_t *hdr,
                                              const char **why);

/* Like mep__store_decode_header, but FRAME_OK only once the key and value
 * are in buf too: then *key and *val point into buf and *frame_len is the
 * frame's whole size. TOO_LARGE is reported as soon as the header is. */
mep__store_verdict_t mep__store_decode_frame(const void *buf, size_t len,
                                             mep__store_dir_t dir,
                                             mep__store_hdr_t *hdr,
                                             const uint8_t **key,
                                             const uint8_t **val,
                                             size_t *frame_len,
                                             const char **why);

void mep__store_put_u32(uint8_t *p, uint32_t v);
void mep__store_put_u64(uint8_t *p, uint64_t v);
uint32_t mep__store_get_u32(const uint8_t *p);
uint64_t mep__store_get_u64(const uint8_t *p);

/* A counter's value: an optional '-', then 1 to 19 decimal digits,
 * nothing else, within int64. 0 on success, -1 otherwise. */
int mep__store_parse_i64(const uint8_t *s, size_t len, int64_t *out);

/* Writes v in decimal to out (at least 21 bytes, NUL-terminated) and
 * returns the length without the NUL. */
size_t mep__store_format_i64(int64_t v, char *out);

#endif
