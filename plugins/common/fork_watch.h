/*
 * fork_watch.h - a child made by fork() lets go of its parent's sockets;
 * shared by the plugins that hold connections (tcp, verbs, ibgda) and by
 * libmep's store server, each with its own copy (the symbols stay inside
 * each module).
 *
 * Why: a forked child (a PyTorch DataLoader worker, a helper process)
 * holds a copy of each socket of its parent. Should the parent die, its
 * connections would stay up for as long as the child lives: its peers
 * would see no end of stream and would learn of the failure only when a
 * wait runs out (timeout_ms) instead of at once. A context's copy in the
 * child cannot run anyway (fork copies no threads), so there each of its
 * sockets is replaced by an unconnected socket under the same number:
 * the connections end with the parent, and the numbers stay taken, so a
 * stray use of the copy fails on a dead socket instead of reaching a file
 * the child opens later.
 */
#ifndef MEP_PLUGINS_FORK_WATCH_H
#define MEP_PLUGINS_FORK_WATCH_H

#include <pthread.h>

typedef struct mep__fork_watch {
  /* set by the owner before watch */
  pthread_mutex_t *locks[3]; /* the context's, in its lock order (NULL:
                                fewer), under which its sockets are made,
                                adopted and closed: held around fork, so
                                the child finds its tables consistent */
  /* In the child, every lock held: mep__fork_let_go on each socket of
   * arg. Async-signal-safe calls only, as after any fork. */
  void (*let_go_all)(void *arg, int dead);
  void *arg;
  /* the watch's own */
  struct mep__fork_watch *next;
  int watched;
} mep__fork_watch_t;

/* init, last: from now on a forked child lets go of w's sockets. 0, or -1
 * when the fork handlers could not be installed (out of memory). */
int mep__fork_watch(mep__fork_watch_t *w);
/* fini, first (harmless for a w never watched). */
void mep__fork_unwatch(mep__fork_watch_t *w);
/* In the child: fd (if >= 0) becomes a copy of the unconnected socket
 * `dead`, or is closed when there is none. */
void mep__fork_let_go(int fd, int dead);

#endif
