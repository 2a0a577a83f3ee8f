/* model_wqe.c - the software NIC carries out one queue pair's WQEs
 * (model.h): doorbell, parsing and checks, the operation, the CQE. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "model.h"

/* Why a WQE failed: the CQE syndrome and the sentence. */
typedef struct fault {
  uint8_t synd;
  char msg[256];
} fault_t;

static int fail(fault_t *f, uint8_t synd, const char *fmt, ...)
    MEP_PRINTF(3, 4);
static int fail(fault_t *f, uint8_t synd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->msg, sizeof f->msg, fmt, ap);
  va_end(ap);
  f->synd = synd;
  return -1;
}

static uint32_t be32_at(const void *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return mep_mlx5_bswap32(v);
}
static uint64_t be64_at(const void *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return mep_mlx5_bswap64(v);
}

/* Whether the target process has exited (its pidfd turned readable). */
static int peer_gone(const m5_qp_t *q) {
  if (q->peer_pidfd < 0) return 0;
  struct pollfd p = {.fd = q->peer_pidfd, .events = POLLIN};
  return poll(&p, 1, 0) > 0;
}

/* Reads or writes the target's memory (this process's directly). */
static int peer_io(const m5_qp_t *q, int wr, uint64_t raddr, void *buf,
                   size_t len) {
  if (peer_gone(q)) return -ESRCH;
  if (q->peer_pid == getpid()) {
    if (wr)
      memcpy((void *)(uintptr_t)raddr, buf, len);
    else
      memcpy(buf, (const void *)(uintptr_t)raddr, len);
    return 0;
  }
  size_t done = 0;
  while (done < len) {
    struct iovec l = {(uint8_t *)buf + done, len - done};
    struct iovec r = {(void *)(uintptr_t)(raddr + done), len - done};
    ssize_t n = wr ? process_vm_writev(q->peer_pid, &l, 1, &r, 1, 0)
                   : process_vm_readv(q->peer_pid, &l, 1, &r, 1, 0);
    if (n <= 0) return n < 0 ? -errno : -EIO;
    done += (size_t)n;
  }
  return 0;
}

/* A consistent copy of the target's key entry for `key`. */
static int peer_key(const m5_t *m, const m5_qp_t *q, uint32_t key,
                    m5_key_t *out) {
  uint32_t i = key >> 8;
  if (i >= M5_MAX_KEYS) return 1;
  for (int tries = 0; tries < 1000; tries++) {
    int rc;
    if (q->peer_pid == getpid()) {
      const m5_key_t *k = &m->keys[i];
      uint64_t s = __atomic_load_n(&k->seq, __ATOMIC_ACQUIRE);
      memcpy(out, k, sizeof *out);
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      rc = (s & 1) || s != __atomic_load_n(&k->seq, __ATOMIC_RELAXED);
      out->seq = s;
      if (!rc) return 0;
      continue;
    }
    uint64_t at = q->peer_keys + (uint64_t)i * sizeof *out;
    rc = peer_io(q, 0, at, out, sizeof *out);
    if (rc) return rc;
    uint64_t s2;
    rc = peer_io(q, 0, at, &s2, sizeof s2);
    if (rc) return rc;
    if (!(out->seq & 1) && s2 == out->seq) return 0;
  }
  return -EAGAIN;
}

static int local_check(const m5_t *m, uint32_t lkey, uint64_t addr,
                       uint64_t len, fault_t *f) {
  uint32_t i = lkey >> 8;
  const m5_key_t *k = i < M5_MAX_KEYS ? &m->keys[i] : NULL;
  if (!k || !k->live || k->key != lkey)
    return fail(f, MEP_MLX5_SYND_LOCAL_PROT_ERR,
                "lkey 0x%x is not a registration of this rank (key "
                "mismatch)", lkey);
  if (addr < k->base || len > k->len || addr - k->base > k->len - len)
    return fail(f, MEP_MLX5_SYND_LOCAL_PROT_ERR,
                "local range 0x%llx+%llu is outside lkey 0x%x's region "
                "0x%llx+%llu (out-of-range address)",
                (unsigned long long)addr, (unsigned long long)len, lkey,
                (unsigned long long)k->base, (unsigned long long)k->len);
  return 0;
}

static int remote_check(const m5_t *m, const m5_qp_t *q, uint32_t rkey,
                        uint64_t raddr, uint64_t len, fault_t *f) {
  m5_key_t k;
  int rc = peer_key(m, q, rkey, &k);
  if (rc < 0)
    return fail(f, MEP_MLX5_SYND_TRANSPORT_RETRY_EXC_ERR,
                "rank %d (pid %d) does not answer: %s", q->peer,
                (int)q->peer_pid, strerror(-rc));
  if (rc > 0 || !k.live || k.key != rkey)
    return fail(f, MEP_MLX5_SYND_REMOTE_ACCESS_ERR,
                "rkey 0x%x is not a registration of rank %d (key "
                "mismatch)", rkey, q->peer);
  if (raddr < k.base || len > k.len || raddr - k.base > k.len - len)
    return fail(f, MEP_MLX5_SYND_REMOTE_ACCESS_ERR,
                "remote range 0x%llx+%llu is outside rkey 0x%x's region "
                "0x%llx+%llu of rank %d (out-of-range address)",
                (unsigned long long)raddr, (unsigned long long)len, rkey,
                (unsigned long long)k.base, (unsigned long long)k.len,
                q->peer);
  return 0;
}

static int io_fail(const m5_qp_t *q, int rc, fault_t *f) {
  return fail(f, MEP_MLX5_SYND_TRANSPORT_RETRY_EXC_ERR,
              "writing to rank %d (pid %d) failed: %s", q->peer,
              (int)q->peer_pid, strerror(-rc));
}

static const char *op_name(uint8_t op) {
  switch (op) {
  case MEP_MLX5_OPCODE_NOP: return "NOP";
  case MEP_MLX5_OPCODE_RDMA_WRITE: return "RDMA_WRITE";
  case MEP_MLX5_OPCODE_RDMA_WRITE_IMM: return "RDMA_WRITE_IMM";
  case MEP_MLX5_OPCODE_ATOMIC_FA: return "ATOMIC_FA";
  default: return "?";
  }
}

/* RDMA WRITE (and with immediate): data segment or inline data. */
static int do_write(m5_t *m, m5_qp_t *q, uint32_t pi, uint8_t ds,
                    uint32_t *bytes, fault_t *f) {
  uint32_t mask = q->sq_bbs - 1;
  if (ds < 3)
    return fail(f, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
                "DS %u is too small for an RDMA write (control, remote "
                "address and data segments: 3)", ds);
  const uint8_t *ra = mep_mlx5_seg(q->sq, mask, pi, 1);
  uint64_t raddr = be64_at(ra);
  uint32_t rkey = be32_at(ra + 8);
  const uint8_t *d = mep_mlx5_seg(q->sq, mask, pi, 2);
  uint32_t bc = be32_at(d);
  if (bc & MEP_MLX5_INLINE_SEG) {
    uint32_t len = bc & ~MEP_MLX5_INLINE_SEG;
    if (len > MEP_MLX5_MAX_INLINE || ds != mep_mlx5_ds_inline(len))
      return fail(f, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
                  "DS %u does not fit %u bytes of inline data (want %u)", ds,
                  len, len > MEP_MLX5_MAX_INLINE ? 0
                                                 : mep_mlx5_ds_inline(len));
    if (remote_check(m, q, rkey, raddr, len, f)) return -1;
    uint8_t buf[MEP_MLX5_MAX_INLINE];
    uint32_t at = 4, seg = 2;
    const uint8_t *u = d;
    for (uint32_t i = 0; i < len; i++) {
      if (at == MEP_MLX5_SEG) {
        u = mep_mlx5_seg(q->sq, mask, pi, ++seg);
        at = 0;
      }
      buf[i] = u[at++];
    }
    int rc = peer_io(q, 1, raddr, buf, len);
    if (rc) return io_fail(q, rc, f);
    *bytes = len;
    return 0;
  }
  if (ds != 3)
    return fail(f, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
                "DS %u for an RDMA write with one data segment (want 3)",
                ds);
  uint32_t lkey = be32_at(d + 4);
  uint64_t laddr = be64_at(d + 8);
  /* byte_count 0 means 2^31 on mlx5; the plugin never posts it */
  if (bc == 0)
    return fail(f, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
                "data segment byte count 0 (2 GiB) is not supported");
  if (local_check(m, lkey, laddr, bc, f)) return -1;
  if (remote_check(m, q, rkey, raddr, bc, f)) return -1;
  int rc = peer_io(q, 1, raddr, (void *)(uintptr_t)laddr, bc);
  if (rc) return io_fail(q, rc, f);
  *bytes = bc;
  return 0;
}

static int do_fetch_add(m5_t *m, m5_qp_t *q, uint32_t pi, uint8_t ds,
                        uint32_t *bytes, fault_t *f) {
  uint32_t mask = q->sq_bbs - 1;
  if (ds != 4)
    return fail(f, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
                "DS %u for ATOMIC_FA (control, remote address, atomic and "
                "data segments: 4)", ds);
  const uint8_t *ra = mep_mlx5_seg(q->sq, mask, pi, 1);
  uint64_t raddr = be64_at(ra);
  uint32_t rkey = be32_at(ra + 8);
  uint64_t add = be64_at(mep_mlx5_seg(q->sq, mask, pi, 2));
  const uint8_t *d = mep_mlx5_seg(q->sq, mask, pi, 3);
  uint32_t bc = be32_at(d), lkey = be32_at(d + 4);
  uint64_t laddr = be64_at(d + 8);
  if (bc != 8)
    return fail(f, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
                "ATOMIC_FA with a data segment of %u bytes (want 8)", bc);
  if (local_check(m, lkey, laddr, 8, f)) return -1;
  if (raddr % 8)
    return fail(f, MEP_MLX5_SYND_REMOTE_INVAL_REQ_ERR,
                "ATOMIC_FA at 0x%llx, not 8-byte aligned (misaligned "
                "atomic)", (unsigned long long)raddr);
  if (remote_check(m, q, rkey, raddr, 8, f)) return -1;
  uint64_t old, nv;
  int rc = peer_io(q, 0, raddr, &old, 8);
  nv = old + add;
  if (!rc) rc = peer_io(q, 1, raddr, &nv, 8);
  if (rc) return io_fail(q, rc, f);
  memcpy((void *)(uintptr_t)laddr, &old, 8);
  *bytes = 8;
  return 0;
}

/* Writes one CQE; 0, or -1 when the CQ has no room (an overrun). */
static int cqe(m5_t *m, m5_qp_t *q, uint8_t opcode, uint8_t wqe_op,
               uint16_t idx, uint32_t bytes, uint8_t synd) {
  uint32_t ci = mep_mlx5_bswap32(
      __atomic_load_n(&q->cq_dbrec[0], __ATOMIC_ACQUIRE)) & 0xffffff;
  if (((q->cq_pi - ci) & 0xffffff) >= q->cq_n) return -1;
  mep_mlx5_cqe_t *c = &q->cq[q->cq_pi & (q->cq_n - 1)];
  mep_mlx5_cqe_fill(c, opcode, wqe_op, q->qpn, idx, bytes, 0, synd, 0);
  __atomic_store_n(&c->b[MEP_MLX5_CQE_OFF_OP_OWN],
                   mep_mlx5_cqe_op_own(opcode, q->cq_pi, q->cq_n),
                   __ATOMIC_RELEASE);
  q->cq_pi++;
  (void)m;
  return 0;
}

static void report(m5_t *m, m5_qp_t *q, const char *fmt, ...)
    MEP_PRINTF(3, 4);
static void report(m5_t *m, m5_qp_t *q, const char *fmt, ...) {
  char msg[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&m->err_mu);
  snprintf(m->err, sizeof m->err, "%s", msg);
  m->nerr++;
  pthread_mutex_unlock(&m->err_mu);
  m->env->log(MEP_LOG_ERROR, "ibgda: model: rank %d QP 0x%x: %s", m->rank,
              q->qpn, msg);
}

void mep__m5_serve(m5_t *m, m5_qp_t *q) {
  uint64_t db = __atomic_load_n(q->db, __ATOMIC_ACQUIRE);
  if (db == q->last_db) return; /* nobody rang */
  q->last_db = db;
  /* the register gets the first 8 bytes of a control segment */
  mep_mlx5_ctrl_seg_t rung;
  memcpy(&rung, &db, 8);
  if (mep_mlx5_ctrl_qpn(&rung) != q->qpn && !q->error) {
    report(m, q, "the doorbell register was written with QP 0x%x",
           mep_mlx5_ctrl_qpn(&rung));
    q->error = 1;
  }
  uint16_t pi = (uint16_t)mep_mlx5_bswap32(__atomic_load_n(
      &q->dbrec[MEP_MLX5_SND_DBR], __ATOMIC_ACQUIRE));
  uint32_t mask = q->sq_bbs - 1;
  while ((uint16_t)q->ci != pi) {
    uint32_t at = (uint32_t)q->ci;
    const mep_mlx5_ctrl_seg_t *c = mep_mlx5_seg(q->sq, mask, at, 0);
    uint8_t op = mep_mlx5_ctrl_opcode(c), ds = mep_mlx5_ctrl_ds(c);
    uint8_t flags = c->fm_ce_se;
    uint16_t idx = mep_mlx5_ctrl_idx(c);
    uint32_t nbb = ds ? mep_mlx5_bbs(ds) : 1, bytes = 0;
    fault_t f = {0, ""};
    int bad = 0;
    if (q->error) {
      bad = fail(&f, MEP_MLX5_SYND_WR_FLUSH_ERR, "flushed (QP in error)");
    } else if (idx != (uint16_t)at) {
      bad = fail(&f, MEP_MLX5_SYND_LOCAL_QP_OP_ERR,
                 "WQE at building block %u carries index %u", at & 0xffff,
                 idx);
    } else if (mep_mlx5_ctrl_qpn(c) != q->qpn) {
      bad = fail(&f, MEP_MLX5_SYND_LOCAL_QP_OP_ERR,
                 "WQE names QP 0x%x", mep_mlx5_ctrl_qpn(c));
    } else if (ds == 0 || nbb > MEP_MLX5_MAX_WQE_BB || nbb > q->sq_bbs ||
               (uint16_t)(pi - (uint16_t)at) < nbb) {
      bad = fail(&f, MEP_MLX5_SYND_LOCAL_LENGTH_ERR,
                 "DS %u (%u building blocks) is not a WQE size here (bad "
                 "ds count)", ds, nbb);
      nbb = 1;
    } else {
      switch (op) {
      case MEP_MLX5_OPCODE_NOP:
        break;
      case MEP_MLX5_OPCODE_RDMA_WRITE:
      case MEP_MLX5_OPCODE_RDMA_WRITE_IMM:
        bad = do_write(m, q, at, ds, &bytes, &f);
        break;
      case MEP_MLX5_OPCODE_ATOMIC_FA:
        bad = do_fetch_add(m, q, at, ds, &bytes, &f);
        break;
      default:
        bad = fail(&f, MEP_MLX5_SYND_LOCAL_QP_OP_ERR,
                   "opcode 0x%02x is not one the model carries out (bad "
                   "opcode)", op);
      }
    }
    if (bad && f.synd != MEP_MLX5_SYND_WR_FLUSH_ERR)
      report(m, q, "WQE %u (%s, to rank %d): %s", at & 0xffff, op_name(op),
             q->peer, f.msg);
    if (bad || (flags & MEP_MLX5_CTRL_CQ_UPDATE)) {
      int rc = bad ? cqe(m, q, MEP_MLX5_CQE_REQ_ERR, op, (uint16_t)at, 0,
                         f.synd)
                   : cqe(m, q, MEP_MLX5_CQE_REQ, op, (uint16_t)at, bytes, 0);
      if (rc) {
        if (!q->error)
          report(m, q, "completion queue overrun (%u entries, none "
                 "consumed): the QP stops", q->cq_n);
        q->error = 1;
        return; /* the WQE stays; nothing more can be reported */
      }
    }
    if (bad) q->error = 1;
    else q->wqes++;
    q->ci += nbb;
  }
}
