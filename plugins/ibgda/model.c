/* model.c - the software NIC's thread, its key table and its queue
 * pairs (model.h). The WQEs themselves are carried out in model_wqe.c. */
#include <errno.h>
#include <sys/syscall.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h"

static void *thread_main(void *arg) {
  m5_t *m = arg;
  unsigned idle = 0;
  for (;;) {
    pthread_mutex_lock(&m->mu);
    if (m->stop) {
      pthread_mutex_unlock(&m->mu);
      break;
    }
    uint64_t before = 0, after = 0;
    for (m5_qp_t *q = m->qps; q; q = q->next) {
      before += q->ci;
      mep__m5_serve(m, q);
      after += q->ci;
    }
    pthread_mutex_unlock(&m->mu);
    /* Spin while work comes, then back off: the model shares small
     * machines with the ranks it serves. */
    if (after != before) {
      idle = 0;
    } else if (++idle > 256) {
      struct timespec ts = {0, idle > 4096 ? 200 * 1000 : 20 * 1000};
      nanosleep(&ts, NULL);
    } else {
      sched_yield();
    }
  }
  return NULL;
}

int mep__m5_open(m5_t *m, const mep_tp_env_t *env, int rank) {
  memset(m, 0, sizeof *m);
  m->env = env;
  m->rank = rank;
  m->next_qpn = 0x100 + (uint32_t)(rank & 0xffff) * 0x100;
  m->keys = calloc(M5_MAX_KEYS, sizeof *m->keys);
  if (!m->keys) return MEP_ERR_NOMEM;
  pthread_mutex_init(&m->mu, NULL);
  pthread_mutex_init(&m->err_mu, NULL);
  int e = pthread_create(&m->th, NULL, thread_main, m);
  if (e) {
    free(m->keys);
    env->set_error("ibgda: model: starting its thread failed: %s",
                   strerror(e));
    return MEP_ERR_SYSTEM;
  }
  m->running = 1;
  return 0;
}

void mep__m5_close(m5_t *m) {
  if (m->running) {
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->th, NULL);
    m->running = 0;
  }
  while (m->qps) mep__m5_qp_destroy(m, m->qps);
  free(m->keys);
  m->keys = NULL;
  pthread_mutex_destroy(&m->mu);
  pthread_mutex_destroy(&m->err_mu);
}

/* Entries change under the seqlock: odd while written. Peers read them
 * with process_vm_readv and retry on an odd or changed seq. */
static void key_write(m5_key_t *k, uint64_t base, uint64_t len, uint32_t key,
                      uint32_t live) {
  __atomic_store_n(&k->seq, k->seq + 1, __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  k->base = base;
  k->len = len;
  k->key = key;
  k->live = live;
  __atomic_store_n(&k->seq, k->seq + 1, __ATOMIC_RELEASE);
}

int mep__m5_reg(m5_t *m, void *base, uint64_t len, uint32_t *key) {
  pthread_mutex_lock(&m->mu);
  for (uint32_t i = 0; i < M5_MAX_KEYS; i++) {
    m5_key_t *k = &m->keys[i];
    if (k->live) continue;
    uint32_t gen = ((k->key & 0xff) % 255) + 1; /* 1..255 */
    uint32_t nk = i << 8 | gen;
    key_write(k, (uint64_t)(uintptr_t)base, len, nk, 1);
    pthread_mutex_unlock(&m->mu);
    *key = nk;
    return 0;
  }
  pthread_mutex_unlock(&m->mu);
  m->env->set_error("ibgda: model: all %d registrations are in use",
                    M5_MAX_KEYS);
  return MEP_ERR_NOMEM;
}

void mep__m5_dereg(m5_t *m, uint32_t key) {
  uint32_t i = key >> 8;
  if (i >= M5_MAX_KEYS) return;
  /* under mu: the model thread is between WQEs, so none that uses the key
   * is half done when it goes */
  pthread_mutex_lock(&m->mu);
  m5_key_t *k = &m->keys[i];
  if (k->live && k->key == key) key_write(k, 0, 0, key, 0);
  pthread_mutex_unlock(&m->mu);
}

int mep__m5_qp_create(m5_t *m, uint32_t sq_bbs, uint32_t cq_n,
                      m5_qp_t **out) {
  if (!mep__m5_pow2(sq_bbs) || !mep__m5_pow2(cq_n))
    return MEP_ERR_INVALID;
  m5_qp_t *q = calloc(1, sizeof *q);
  if (!q) return MEP_ERR_NOMEM;
  q->sq_bbs = sq_bbs;
  q->cq_n = cq_n;
  size_t sq = (size_t)sq_bbs * MEP_MLX5_SEND_WQE_BB;
  size_t cq = (size_t)cq_n * MEP_MLX5_CQE_SIZE;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  q->mem_len = (sq + cq + 4 * 64 + page - 1) / page * page;
  if (posix_memalign(&q->mem, page, q->mem_len)) {
    free(q);
    return MEP_ERR_NOMEM;
  }
  uint8_t *b = q->mem;
  memset(b, 0, q->mem_len);
  q->sq = b;
  q->cq = (mep_mlx5_cqe_t *)(b + sq);
  /* doorbell record, register, CQ record, counters: a cache line each,
   * as different agents write them */
  q->dbrec = (uint32_t *)(b + sq + cq);
  q->db = (uint64_t *)(b + sq + cq + 64);
  q->cq_dbrec = (uint32_t *)(b + sq + cq + 128);
  q->user = (uint64_t *)(b + sq + cq + 192);
  for (uint32_t i = 0; i < cq_n; i++) mep_mlx5_cqe_init(&q->cq[i]);
  q->peer_pid = getpid();
  q->peer = -1;
  q->peer_pidfd = -1;
  pthread_mutex_lock(&m->mu);
  q->qpn = m->next_qpn++ & 0xffffff;
  q->next = m->qps;
  m->qps = q;
  pthread_mutex_unlock(&m->mu);
  *out = q;
  return 0;
}

void mep__m5_qp_target(m5_t *m, m5_qp_t *qp, int peer, pid_t pid,
                       uint64_t peer_keys) {
  int fd = -1;
#ifdef SYS_pidfd_open
  if (pid != getpid()) fd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
  if (pid != getpid() && fd < 0)
    m->env->log(MEP_LOG_WARN, "ibgda: model: no pidfd for rank %d (pid %d): "
                "%s; its end is noticed through its connection only", peer,
                (int)pid, strerror(errno));
  pthread_mutex_lock(&m->mu);
  if (qp->peer_pidfd >= 0) close(qp->peer_pidfd);
  qp->peer_pidfd = fd;
  qp->peer = peer;
  qp->peer_pid = pid;
  qp->peer_keys = peer_keys;
  pthread_mutex_unlock(&m->mu);
}

void mep__m5_qp_destroy(m5_t *m, m5_qp_t *qp) {
  pthread_mutex_lock(&m->mu);
  for (m5_qp_t **p = &m->qps; *p; p = &(*p)->next)
    if (*p == qp) {
      *p = qp->next;
      break;
    }
  pthread_mutex_unlock(&m->mu);
  if (qp->peer_pidfd >= 0) close(qp->peer_pidfd);
  free(qp->mem);
  free(qp);
}

uint64_t mep__m5_last_error(m5_t *m, char *buf, size_t len) {
  pthread_mutex_lock(&m->err_mu);
  if (buf && len) snprintf(buf, len, "%s", m->err);
  uint64_t n = m->nerr;
  pthread_mutex_unlock(&m->err_mu);
  return n;
}
