/* region.h - registered memory and its peers' instances. */
#ifndef MEP_SRC_REGION_H
#define MEP_SRC_REGION_H

#include <pthread.h>
#include <stdint.h>

#include "comm.h"

typedef struct mep__remote {
  mep_tp_rmr_t *rmr; /* imported through the peer's route, lazily */
  uint64_t len;      /* the peer's length of this region */
} mep__remote_t;

struct mep_region {
  mep_comm_t *comm;
  uint32_t id;         /* equal on every rank for the k-th registration */
  void *ptr;
  size_t len;
  mep_memkind_t kind;
  mep_tp_mr_t **mrs;   /* per transport of the comm (NULL if unused) */
  pthread_mutex_t lock; /* imports */
  mep__remote_t *remote; /* per peer */
  /* A local region's keys per transport (mep__region_local), or a shell's
   * adopted keys per peer (mep__region_adopt): MEP_TP_MAX_RKEY bytes
   * each, key_lens[i] of them used (0: none). NULL for other regions. */
  uint8_t *keys;
  uint32_t *key_lens;
  int shell; /* mep__region_shell: no memory, nothing in the store */
  /* A region of the subsystems' state keeps its published blob here until
   * the state is published as a whole (region_state.c). */
  uint8_t *pub;
  size_t pub_len;
};

/* The peer's instance of `r`, imported on first use (waiting for the
 * peer's key in the store up to the communicator's timeout). */
int mep__region_remote(mep_region_t *r, int peer, mep__remote_t **out);
/* Imports every instance of `r` of the ranks with act[p] != 0 (itself
 * aside) that is not imported yet, so later use never waits on the store. */
int mep__region_import_active(mep_region_t *r, const uint8_t *act);
/* Releases the import of `peer`'s instance (it was dropped, or a new
 * process replaces it); the next use imports afresh. */
void mep__region_forget(mep_region_t *r, int peer);

/* The store key "<ns>/<what>/<rank>.<incarnation>" of something `rank`'s
 * process publishes: naming the process, a replacement of the rank never
 * reads what an earlier process of it published. malloc'ed; NULL when out
 * of memory. */
char *mep__region_store_key(const mep_comm_t *comm, const char *what,
                            int rank);

/* Publishes every region registered so far, the subsystems' state that
 * creation and joining register before anything else (comm_state.c), as
 * one store value: a peer then imports all of them with one store read
 * instead of one per region, which at creation is N (N - 1) reads on one
 * store server instead of 6 N (N - 1) (docs/scaling.md, "Creation").
 * Called once per communicator; regions registered later are published
 * one by one. */
int mep__region_publish_state(mep_comm_t *comm);
/* The published blob of `peer`'s region `id` (an id of the state) from its
 * bundle, waiting for it up to the communicator's timeout: a malloc'ed
 * copy in *val, *len bytes. Thread-safe. */
int mep__region_state_blob(mep_comm_t *comm, uint32_t id, int peer,
                           void **val, size_t *len);
/* Between these, each peer's bundle is read from the store once and kept
 * (mep__comm_import_state imports every region of every peer). */
void mep__region_bundles_keep(mep_comm_t *comm);
void mep__region_bundles_drop(mep_comm_t *comm);

/* Write tokens with this bit are the collective engine's zero-copy sends
 * (coll.c): the progress thread counts their completions per peer in
 * comm->zc_done, so the engine knows exactly when the transport no longer
 * reads the caller's memory. Counters stay far below it. */
#define MEP__TOKEN_ZC (UINT64_C(1) << 62)

/* mep_put whose write token carries `tag` (MEP__TOKEN_ZC or 0). */
int mep__put_tagged(mep_comm_t *comm, int peer, const mep_region_t *src,
                    size_t src_off, const mep_region_t *dst, size_t dst_off,
                    size_t len, uint64_t tag);

/* A registration of [ptr, ptr + len) with the used transports for this
 * rank's own writes only: no id, nothing published, so it is not
 * collective. A transport that refuses it (or carries no host memory)
 * leaves its mrs[] entry NULL: peers routed through it are not written
 * from it. Freed with mep_region_deregister. */
int mep__region_local(mep_comm_t *comm, const void *ptr, size_t len,
                      mep_region_t **out);

/* The remote key of the local registration r (mep__region_local) with
 * transport tp: its length and *key, or 0 when tp did not register r. */
size_t mep__region_key(const mep_region_t *r, int tp, const void **key);

/* A put destination without memory of its own, standing for regions that
 * peers made known by their keys alone (mep__region_adopt), one per peer
 * at a time. It is tracked like a registered region, so a dropped peer's
 * import is released with the others'; a put to a peer whose instance
 * was released fails with MEP_ERR_PEER_FAILED. Freed with
 * mep_region_deregister. */
int mep__region_shell(mep_comm_t *comm, mep_region_t **out);
/* Makes the peer's region of rlen bytes named by `key` (len bytes, for
 * the transport that routes to the peer) the shell's instance for peer,
 * importing it unless the same key is imported already (an earlier
 * instance is released). 0, or the import's error (then the shell has no
 * instance for peer). */
int mep__region_adopt(mep_region_t *shell, int peer, const void *key,
                      size_t len, uint64_t rlen);

#endif
