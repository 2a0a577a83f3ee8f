/* addr.c - the address blob: who this process is and where it runs.
 *
 * Layout (native byte order: both ends are on one host):
 *   u32 magic, u16 version, u16 host_len, i32 rank, u32 pid,
 *   u64 start_time, u8 nonce[16], host_len bytes of host id. */
#include "shm.h"

#include <stdio.h>
#include <string.h>

#define ADDR_MAGIC 0x41534d50u /* "PMSA" */
#define ADDR_HEAD (4 + 2 + 2 + 4 + 4 + 8 + SHM_NONCE_BYTES)

int shm_addr_encode(const shm_addr_t *a, void *buf, size_t *len) {
  size_t host_len = strlen(a->host_id);
  size_t need = ADDR_HEAD + host_len;
  if (need > MEP_TP_MAX_ADDR || need > *len) return MEP_ERR_INVALID;
  uint8_t *p = buf;
  uint32_t magic = ADDR_MAGIC, pid = (uint32_t)a->pid;
  uint16_t version = SHM_PROTO_VERSION, hl = (uint16_t)host_len;
  int32_t rank = a->rank;
  memcpy(p, &magic, 4);
  memcpy(p + 4, &version, 2);
  memcpy(p + 6, &hl, 2);
  memcpy(p + 8, &rank, 4);
  memcpy(p + 12, &pid, 4);
  memcpy(p + 16, &a->start_time, 8);
  memcpy(p + 24, a->nonce, SHM_NONCE_BYTES);
  memcpy(p + ADDR_HEAD, a->host_id, host_len);
  *len = need;
  return 0;
}

int shm_addr_decode(const void *buf, size_t len, shm_addr_t *a, char *err,
                    size_t err_len) {
  const uint8_t *p = buf;
  uint32_t magic, pid;
  uint16_t version, hl;
  int32_t rank;
  memset(a, 0, sizeof(*a));
  if (!buf || len < ADDR_HEAD || len > MEP_TP_MAX_ADDR) {
    snprintf(err, err_len, "address blob of %zu bytes is not between %d and "
             "%d bytes long", len, ADDR_HEAD, MEP_TP_MAX_ADDR);
    return MEP_ERR_PROTOCOL;
  }
  memcpy(&magic, p, 4);
  memcpy(&version, p + 4, 2);
  memcpy(&hl, p + 6, 2);
  memcpy(&rank, p + 8, 4);
  memcpy(&pid, p + 12, 4);
  if (magic != ADDR_MAGIC) {
    snprintf(err, err_len, "address blob is not an shm address");
    return MEP_ERR_PROTOCOL;
  }
  if (version != SHM_PROTO_VERSION) {
    snprintf(err, err_len, "address blob of protocol version %u, this plugin "
             "speaks %u", version, SHM_PROTO_VERSION);
    return MEP_ERR_PROTOCOL;
  }
  if ((size_t)hl != len - ADDR_HEAD || hl == 0 || memchr(p + ADDR_HEAD, 0, hl)) {
    snprintf(err, err_len, "address blob of %zu bytes holds a bad host id "
             "length %u", len, hl);
    return MEP_ERR_PROTOCOL;
  }
  if (rank < 0 || pid == 0 || pid > (uint32_t)INT32_MAX) {
    snprintf(err, err_len, "address blob names rank %d, pid %u", rank, pid);
    return MEP_ERR_PROTOCOL;
  }
  a->rank = rank;
  a->pid = (pid_t)pid;
  memcpy(&a->start_time, p + 16, 8);
  memcpy(a->nonce, p + 24, SHM_NONCE_BYTES);
  memcpy(a->host_id, p + ADDR_HEAD, hl);
  a->host_id[hl] = '\0';
  return 0;
}
