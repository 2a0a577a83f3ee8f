/* ring.c - the shared-memory ring objects: creation by the receiver,
 * mapping by the sender, and copies that wrap around the end. */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int shm_ring_create(shm_ring_t *r, const char *name, uint64_t cap, int src,
                    int dst, const uint8_t *rx_nonce, const uint8_t *tx_nonce,
                    char *err, size_t err_len) {
  memset(r, 0, sizeof(*r));
  snprintf(r->name, sizeof(r->name), "%s", name);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(err, err_len, "shm_open(%s) failed: %s", name, strerror(errno));
    return MEP_ERR_SYSTEM;
  }
  r->named = 1;
  size_t len = SHM_RING_HDR_BYTES + (size_t)cap;
  /* Reserve the pages now: a sparse object in a full /dev/shm would kill
   * us with SIGBUS at the first touch instead of failing here. */
  int e = ftruncate(fd, (off_t)len) != 0 ? errno
                                         : posix_fallocate(fd, 0, (off_t)len);
  if (e) {
    snprintf(err, err_len,
             "reserving %zu bytes for %s failed: %s%s", len, name,
             strerror(e),
             e == ENOSPC ? " (/dev/shm is full: enlarge it, e.g. docker "
                           "--shm-size, or lower [shm] ring_bytes)"
                         : "");
    close(fd);
    shm_ring_unlink(r);
    return e == ENOSPC ? MEP_ERR_NOMEM : MEP_ERR_SYSTEM;
  }
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int map_errno = errno;
  close(fd);
  if (p == MAP_FAILED) {
    snprintf(err, err_len, "mapping %zu bytes of %s failed: %s", len, name,
             strerror(map_errno));
    shm_ring_unlink(r);
    return MEP_ERR_SYSTEM;
  }
  r->hdr = p;
  r->data = (uint8_t *)p + SHM_RING_HDR_BYTES;
  r->cap = cap;
  r->map_len = len;
  r->hdr->version = SHM_PROTO_VERSION;
  r->hdr->hdr_bytes = SHM_RING_HDR_BYTES;
  r->hdr->data_bytes = cap;
  r->hdr->src_rank = src;
  r->hdr->dst_rank = dst;
  memcpy(r->hdr->rx_nonce, rx_nonce, SHM_NONCE_BYTES);
  memcpy(r->hdr->tx_nonce, tx_nonce, SHM_NONCE_BYTES);
  atomic_store_explicit(&r->hdr->magic, SHM_RING_MAGIC, memory_order_release);
  return 0;
}

/* Checks the header the peer wrote, before trusting its sizes. */
static int ring_check(const struct shm_ring_hdr *h, off_t size, int src,
                      int dst, const uint8_t *rx_nonce,
                      const uint8_t *tx_nonce, char *err, size_t err_len) {
  if (h->version != SHM_PROTO_VERSION) {
    snprintf(err, err_len, "protocol version %u, this plugin speaks %u",
             h->version, SHM_PROTO_VERSION);
    return MEP_ERR_PROTOCOL;
  }
  if (h->hdr_bytes != SHM_RING_HDR_BYTES || h->data_bytes < SHM_RING_MIN ||
      h->data_bytes > SHM_RING_MAX || h->data_bytes % 64 != 0 ||
      (uint64_t)size != SHM_RING_HDR_BYTES + h->data_bytes) {
    snprintf(err, err_len,
             "bad geometry (header %u bytes, data %llu bytes, object %lld "
             "bytes)",
             h->hdr_bytes, (unsigned long long)h->data_bytes,
             (long long)size);
    return MEP_ERR_PROTOCOL;
  }
  if (h->src_rank != src || h->dst_rank != dst ||
      memcmp(h->rx_nonce, rx_nonce, SHM_NONCE_BYTES) != 0 ||
      memcmp(h->tx_nonce, tx_nonce, SHM_NONCE_BYTES) != 0) {
    snprintf(err, err_len, "made for ranks %d->%d of another connection",
             h->src_rank, h->dst_rank);
    return MEP_ERR_PROTOCOL;
  }
  return 0;
}

int shm_ring_open(shm_ring_t *r, const char *name, int src, int dst,
                  const uint8_t *rx_nonce, const uint8_t *tx_nonce, char *err,
                  size_t err_len) {
  memset(r, 0, sizeof(*r));
  snprintf(r->name, sizeof(r->name), "%s", name);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    snprintf(err, err_len, "shm_open(%s) failed: %s", name, strerror(errno));
    return MEP_ERR_SYSTEM;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    snprintf(err, err_len, "fstat(%s) failed: %s", name, strerror(errno));
    close(fd);
    return MEP_ERR_SYSTEM;
  }
  /* The creator sizes the object before it publishes the magic. */
  if (st.st_size < (off_t)SHM_RING_HDR_BYTES ||
      st.st_size > (off_t)SHM_RING_HDR_BYTES + (off_t)SHM_RING_MAX) {
    close(fd);
    return 0;
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
                 MAP_SHARED, fd, 0);
  int map_errno = errno;
  close(fd);
  if (p == MAP_FAILED) {
    snprintf(err, err_len, "mapping %s failed: %s", name, strerror(map_errno));
    return MEP_ERR_SYSTEM;
  }
  struct shm_ring_hdr *h = p;
  if (atomic_load_explicit(&h->magic, memory_order_acquire) !=
      SHM_RING_MAGIC) {
    munmap(p, (size_t)st.st_size);
    return 0;
  }
  int rc = ring_check(h, st.st_size, src, dst, rx_nonce, tx_nonce, err,
                      err_len);
  if (rc < 0) {
    munmap(p, (size_t)st.st_size);
    return rc;
  }
  r->hdr = h;
  r->data = (uint8_t *)p + SHM_RING_HDR_BYTES;
  r->cap = h->data_bytes;
  r->map_len = (size_t)st.st_size;
  return 1;
}

void shm_ring_unlink(shm_ring_t *r) {
  if (r->named) shm_unlink(r->name); /* ENOENT: the peer already did */
  r->named = 0;
}

void shm_ring_unmap(shm_ring_t *r) {
  if (r->hdr) munmap(r->hdr, r->map_len);
  r->hdr = NULL;
  r->data = NULL;
}

void shm_ring_read(const shm_ring_t *r, uint64_t pos, void *dst,
                   uint64_t len) {
  uint64_t at = pos % r->cap;
  uint64_t first = len < r->cap - at ? len : r->cap - at;
  memcpy(dst, r->data + at, (size_t)first);
  if (len > first) memcpy((uint8_t *)dst + first, r->data, (size_t)(len - first));
}

void shm_ring_write(shm_ring_t *r, uint64_t pos, const void *src,
                    uint64_t len) {
  uint64_t at = pos % r->cap;
  uint64_t first = len < r->cap - at ? len : r->cap - at;
  memcpy(r->data + at, src, (size_t)first);
  if (len > first)
    memcpy(r->data, (const uint8_t *)src + first, (size_t)(len - first));
}
