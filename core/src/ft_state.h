/* ft_state.h - the fault-tolerance state, shared by ft.c (the engine
 * side) and ft_api.c (the public queries). */
#ifndef MEP_SRC_FT_STATE_H
#define MEP_SRC_FT_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "comm.h"

/* A snapshot's header; the sender's active set and its view (active and
 * not suspected), max_size bytes each, follow it. */
typedef struct mep__ctl_hdr {
  uint64_t seq;       /* per directed pair, from 1; equals the signal */
  uint64_t sum;       /* of the slot after this field */
  uint32_t magic, sender;
  uint32_t flags;     /* CTL_AGREE: the sender runs an agreement */
  uint32_t n;         /* max_size */
  uint64_t epoch;
  uint64_t decided;   /* highest collective found committed at the
                         sender's latest agreement */
  uint64_t committed; /* highest collective the sender committed */
  uint64_t ping;      /* echo this, please */
  uint64_t pong;      /* the receiver's latest ping, echoed */
  uint64_t query;     /* a coordinator's query id */
  uint64_t answer;    /* the receiver's query this view answers */
} mep__ctl_hdr_t;

typedef struct mep__ft_peer {
  uint64_t tx_seq, rx_seq;
  int have;                /* msg and view hold its latest snapshot */
  mep__ctl_hdr_t msg;
  uint8_t *view;           /* max_size bytes */
  uint64_t ping_sent, ping_at, pong_seen;
  uint64_t peer_ping;      /* its latest ping, to echo */
} mep__ft_peer_t;

/* A decision being claimed in the store (ft.c, on a thread of its own). */
typedef struct mep__ft_claim {
  pthread_t thread;
  _Atomic int state;       /* 0 none, 1 running, 2 finished (join it) */
  atomic_int cancel;       /* set: its store requests give up (store.h) */
  uint64_t epoch;          /* 0: no decision pending */
  uint64_t decided, mine_decided, since;
  uint8_t *set;            /* the winner's set (the thread writes it) */
  uint8_t *mine;           /* this coordinator's own decision */
  int rc, lost;            /* the store's answer; another claim won */
} mep__ft_claim_t;

typedef struct mep__ft {
  /* engine side (engine_lock) */
  uint64_t epoch, decided, committed;
  uint8_t *act;            /* active set of the epoch */
  uint8_t *last;           /* the set of the last commit */
  uint8_t *suspect, *dirty;
  mep__ft_peer_t *ps;
  uint8_t *views;          /* backing of ps[].view */
  int excluded, agreeing, coord, agreement;
  int proposed;            /* told the running agreement what it committed */
  uint64_t query, queries, probe_until, probe_ms;
  mep__ft_claim_t cl;
  /* the control channel */
  size_t slot;
  uint8_t *in, *out, *scratch;
  uint64_t *sig;
  mep_region_t *rin, *rout, *rsig;
  /* what the public queries read (mu) */
  pthread_mutex_t mu;
  int32_t *arr;            /* page-aligned, max_size words */
  uint64_t pub_epoch;
  int *dropped;
  int ndropped;
} mep__ft_t;

/* What a claim settled on, for ft.c to adopt: the epoch, its active set
 * (max_size bytes, valid until the next claim starts) and the highest
 * collective found committed. */
typedef struct mep__ft_decision {
  uint64_t epoch, decided;
  const uint8_t *set;
} mep__ft_decision_t;

/* ft_claim.c (below ft.c, which alone calls it): claims `epoch` for `set`
 * in the store; settle returns 1 with the outcome in *d once it is known
 * (or after two probe periods), else 0; join reaps the thread; cancel
 * makes a claim still waiting for the built-in store give up, and reaps
 * it. */
void mep__ft_claim_start(mep_comm_t *comm, uint64_t epoch, const uint8_t *set,
                         uint64_t decided);
int mep__ft_claim_settle(mep_comm_t *comm, uint64_t now,
                         mep__ft_decision_t *d);
void mep__ft_claim_join(mep__ft_t *ft);
void mep__ft_claim_cancel(mep__ft_t *ft);

#endif
