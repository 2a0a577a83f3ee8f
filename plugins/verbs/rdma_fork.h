/*
 * rdma_fork.h - a child made by fork() lets go of its parent's sockets,
 * for the verbs and ibgda plugins (tcp has its own, plugins/tcp/fork.c,
 * for the same reason).
 *
 * Why: a forked child (a PyTorch DataLoader worker, a helper process)
 * holds a copy of each socket of its parent. A rank's peers learn of its
 * death from the end of its liveness socket (handshake.h); a child that
 * outlives the rank would keep that socket up, and its peers would see the
 * loss only when a wait runs out. So, in the child, the bootstrap
 * listener, the connections pending on it and every endpoint's socket are
 * replaced by an unconnected socket under the same number (the numbers
 * stay taken: a stray use of the copy, which cannot run without its
 * parent's threads, fails instead of reaching a file the child opens
 * later). The device's own files are left alone: the peers' detection does
 * not depend on them.
 */
#ifndef MEP_VERBS_RDMA_FORK_H
#define MEP_VERBS_RDMA_FORK_H

#include <pthread.h>

#include "handshake.h"

typedef struct mep__rdma_forkwatch {
  /* set by the owner before watch */
  pthread_mutex_t *locks[2]; /* the context's, in its lock order; NULL:
                                fewer. Held around fork, with boot->mu
                                taken last, so the child finds the tables
                                as no thread is changing them. */
  mep__rdma_boot_t *boot;
  /* In the child, every lock held: mep__rdma_fork_let_go on the socket of
   * each endpoint of arg. Async-signal-safe calls only. */
  void (*endpoints)(void *arg, int dead);
  void *arg;
  /* the watch's own */
  struct mep__rdma_forkwatch *next;
  int watched;
} mep__rdma_forkwatch_t;

/* init, last: from now on a forked child lets go of w's sockets. 0, or
 * MEP_ERR_SYSTEM with the error set (through boot->env). */
int mep__rdma_fork_watch(mep__rdma_forkwatch_t *w);
/* fini, first (harmless for a w never watched). */
void mep__rdma_fork_unwatch(mep__rdma_forkwatch_t *w);
/* In the child: fd (if >= 0) becomes a copy of the unconnected socket
 * `dead`, or is closed when there is none. */
void mep__rdma_fork_let_go(int fd, int dead);

#endif
