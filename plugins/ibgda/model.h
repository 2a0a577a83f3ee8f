/*
 * model.h - a software model of an mlx5 NIC's queues, for testing the
 * ibgda plugin and GPU kernels without a ConnectX.
 *
 * The model owns "queue pairs" laid out as mlx5 lays them out (mep/device/
 * mlx5.h): a send queue of 64-byte building blocks, a doorbell record of
 * two big-endian words, a doorbell "register" (a 64-bit word in memory,
 * where the hardware has a UAR page) and a completion queue of 64-byte
 * CQEs with owner bits. Its thread watches each doorbell register; when
 * it changes (a producer rang), it reads the doorbell record's producer
 * index and carries out every WQE up to it, in order, as the NIC would:
 * it parses the segments, checks them (opcode, DS count, WQE index, QP
 * number, keys, bounds, atomic alignment), performs them, and writes a
 * CQE for each WQE that asked for one (MLX5_WQE_CTRL_CQ_UPDATE). A
 * malformed WQE is never forgiven: it completes with an error CQE (the
 * syndrome mlx5 would give) and a logged sentence naming the fault; the
 * queue pair then goes to the error state and every later WQE is flushed
 * (MLX5_CQE_SYNDROME_WR_FLUSH_ERR), as on the hardware.
 *
 * Across processes. Each rank has its own model, which serves the queue
 * pairs of that rank only (the send side, like a NIC). The target of a
 * WQE is another process of the same host: the model writes into it with
 * process_vm_writev and reads its key table with process_vm_readv (the
 * table's address comes with the peer's address blob). So keys are
 * checked where a NIC checks them, against the responder's live
 * registrations: a region the peer deregistered is refused. A FETCH_AND_
 * ADD is a read and a write of the peer's word through the same calls:
 * exact for one adder per word, not atomic against others (the plugin
 * declares props.atomics 0 for the model). Registered memory is host
 * memory of the process.
 */
#ifndef MEP_IBGDA_MODEL_H
#define MEP_IBGDA_MODEL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "mep/device/mlx5.h"
#include "mep/transport.h"

/* Registrations: key = slot << 8 | generation (1..255), so a key of a
 * freed slot never matches its next use until 255 reuses later. */
#define M5_MAX_KEYS 1024

/* One entry of a model's key table. Readable by other processes while it
 * changes: `seq` is odd during an update (a seqlock). */
typedef struct m5_key {
  uint64_t seq;
  uint64_t base, len;
  uint32_t key;
  uint32_t live;
} m5_key_t;

typedef struct m5_qp {
  /* One page-aligned block holds all of the queue pair's memory, so that
   * it is mapped for a GPU with one registration: the send queue, the
   * CQ, then a 64-byte line each for the doorbell record, the doorbell
   * register, the CQ's doorbell record and the producers' own counters
   * (`user`: what mep_dev_mlx5_peer_t's pi, ready, ci... point to). */
  void *mem;
  size_t mem_len;
  uint64_t *user; /* 8 words, zeroed */
  /* the queue pair as mlx5 lays it out (producers write these) */
  uint8_t *sq;
  uint32_t sq_bbs; /* power of two */
  uint32_t qpn;
  uint32_t *dbrec;  /* [2], big-endian; [MEP_MLX5_SND_DBR] the producer */
  uint64_t *db;     /* the doorbell register */
  mep_mlx5_cqe_t *cq;
  uint32_t cq_n;
  uint32_t *cq_dbrec; /* [2]; [0] the consumer index, big-endian */
  /* the target */
  pid_t peer_pid; /* == getpid(): this process */
  uint64_t peer_keys; /* address of the peer model's key table there */
  int peer;           /* its rank, for messages */
  int peer_pidfd;     /* a pidfd of the target, -1 for this process: a
                       * pid that exited is never written to, even once
                       * the kernel gave the number to another process */
  /* the model's own state (its thread's) */
  uint64_t last_db;
  uint64_t ci;     /* building blocks consumed */
  uint32_t cq_pi;  /* CQEs written */
  int error;       /* in the error state: later WQEs are flushed */
  uint64_t wqes;   /* carried out */
  struct m5_qp *next;
} m5_qp_t;

typedef struct m5 {
  const mep_tp_env_t *env;
  int rank;
  m5_key_t *keys; /* [M5_MAX_KEYS] */
  uint32_t next_qpn;
  pthread_mutex_t mu; /* the qp list, key allocation */
  m5_qp_t *qps;
  pthread_t th;
  int running;
  int stop;
  /* the last error the model reported, for tests and poll() messages */
  pthread_mutex_t err_mu;
  char err[320];
  uint64_t nerr;
} m5_t;

/* Whether v is a power of two (queue and CQ sizes, the model's and a
 * NIC's). */
static inline int mep__m5_pow2(uint32_t v) { return v && !(v & (v - 1)); }

/* Starts a model (its thread). 0 or MEP_ERR_SYSTEM / MEP_ERR_NOMEM. */
int mep__m5_open(m5_t *m, const mep_tp_env_t *env, int rank);
void mep__m5_close(m5_t *m);

/* Registers [base, base+len) of this process: its key (lkey = rkey). */
int mep__m5_reg(m5_t *m, void *base, uint64_t len, uint32_t *key);
void mep__m5_dereg(m5_t *m, uint32_t key);

/* Makes a queue pair: sq_bbs and cq_n powers of two. Its memory is
 * zeroed (CQEs invalid, owned by the NIC); the model serves it from now
 * until mep__m5_qp_destroy. The target is set before the first doorbell
 * (mep__m5_qp_target). */
int mep__m5_qp_create(m5_t *m, uint32_t sq_bbs, uint32_t cq_n, m5_qp_t **out);
void mep__m5_qp_target(m5_t *m, m5_qp_t *qp, int peer, pid_t pid,
                       uint64_t peer_keys);
/* Stops serving it (waits for the model's pass over it) and frees it. */
void mep__m5_qp_destroy(m5_t *m, m5_qp_t *qp);

/* Carries out the WQEs of one queue pair that a doorbell announced (the
 * model thread's step; exposed so a test can drive a queue pair without
 * the thread's timing). m->mu held. */
void mep__m5_serve(m5_t *m, m5_qp_t *qp);

/* The model's last error sentence ("" if none) and how many it has met. */
uint64_t mep__m5_last_error(m5_t *m, char *buf, size_t len);

#endif
