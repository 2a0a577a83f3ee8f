/* addr.c - the address blob (what peers need to connect and, for the
 * model, to reach this process) and the remote-key blob. Fixed-width
 * little-endian fields (handshake.h's helpers); decoders check all. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ibgda.h"

#define ADDR_MAGIC 0x4750454du /* "MEPG" */
#define ADDR_VERSION 1

void mep__ibgda_addr_encode(uint8_t out[MEP_IBGDA_ADDR_LEN],
                            const ibgda_addr_t *a) {
  memset(out, 0, MEP_IBGDA_ADDR_LEN);
  mep__rdma_put32(out, ADDR_MAGIC);
  out[4] = ADDR_VERSION;
  out[5] = a->backend;
  memcpy(out + 8, a->boot_id, 16);
  mep__rdma_put64(out + 24, a->pidns);
  mep__rdma_put32(out + 32, a->pid);
  mep__rdma_put64(out + 40, a->keys);
  mep__rdma_boot_addr_encode(out + 48, &a->boot);
}

int mep__ibgda_addr_decode(const void *blob, size_t len, ibgda_addr_t *a,
                           char *why, size_t why_len) {
  const uint8_t *in = blob;
  if (!blob || len != MEP_IBGDA_ADDR_LEN)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                         "ibgda address of %zu bytes (want %d)", len,
                         MEP_IBGDA_ADDR_LEN);
  if (mep__rdma_get32(in) != ADDR_MAGIC || in[4] != ADDR_VERSION)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                         "not an ibgda address of version %d", ADDR_VERSION);
  memset(a, 0, sizeof *a);
  a->backend = in[5];
  memcpy(a->boot_id, in + 8, 16);
  a->pidns = mep__rdma_get64(in + 24);
  a->pid = mep__rdma_get32(in + 32);
  a->keys = mep__rdma_get64(in + 40);
  if (a->backend != IBGDA_BACKEND_MODEL && a->backend != IBGDA_BACKEND_DEVICE)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                         "ibgda address names backend %u", a->backend);
  if (in[6] || in[7] || mep__rdma_get32(in + 36))
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                         "ibgda address has nonzero padding");
  /* the model's peers write into this process: it must be named */
  if (a->backend == IBGDA_BACKEND_MODEL && (a->pid == 0 || a->keys == 0))
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                         "ibgda address names pid %u, key table 0x%llx",
                         a->pid, (unsigned long long)a->keys);
  return mep__rdma_boot_addr_decode(in + 48, &a->boot, why, why_len);
}

/* The kernel's boot id (as 16 bytes) and the PID namespace's inode: two
 * processes reach each other through process_vm_writev only when both
 * agree. */
int mep__ibgda_host_ids(uint8_t boot_id[16], uint64_t *pidns) {
  char s[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return -1;
  int ok = fgets(s, sizeof s, f) != NULL;
  fclose(f);
  if (!ok) return -1;
  memset(boot_id, 0, 16);
  int n = 0;
  for (const char *p = s; *p && n < 32; p++) {
    int v = *p >= '0' && *p <= '9'   ? *p - '0'
            : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
                                     : -1;
    if (v < 0) continue;
    boot_id[n / 2] |= (uint8_t)(v << (n % 2 ? 0 : 4));
    n++;
  }
  struct stat st;
  if (n != 32 || stat("/proc/self/ns/pid", &st)) return -1;
  *pidns = (uint64_t)st.st_ino;
  return 0;
}

void mep__ibgda_rkey_encode(uint8_t out[MEP_IBGDA_RKEY_LEN],
                            const ibgda_rkey_t *k) {
  memset(out, 0, MEP_IBGDA_RKEY_LEN);
  mep__rdma_put32(out, k->rank);
  mep__rdma_put32(out + 4, k->rkey);
  mep__rdma_put64(out + 8, k->addr);
  mep__rdma_put64(out + 16, k->len);
  mep__rdma_put32(out + 24, ADDR_MAGIC);
}

int mep__ibgda_rkey_decode(const void *blob, size_t len, ibgda_rkey_t *k,
                           char *why, size_t why_len) {
  const uint8_t *in = blob;
  if (!blob || len != MEP_IBGDA_RKEY_LEN)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                         "ibgda remote key of %zu bytes (want %d)", len,
                         MEP_IBGDA_RKEY_LEN);
  if (mep__rdma_get32(in + 24) != ADDR_MAGIC || mep__rdma_get32(in + 28))
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                         "not an ibgda remote key");
  k->rank = mep__rdma_get32(in);
  k->rkey = mep__rdma_get32(in + 4);
  k->addr = mep__rdma_get64(in + 8);
  k->len = mep__rdma_get64(in + 16);
  if (k->len && k->addr + k->len < k->addr)
    return mep__rdma_why(why, why_len, MEP_ERR_PROTOCOL,
                         "ibgda remote key: region wraps the address space");
  return 0;
}
