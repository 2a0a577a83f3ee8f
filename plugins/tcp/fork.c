/*
 * fork.c - a child made by fork() lets go of its parent's connections.
 *
 * Why: a forked child (a PyTorch DataLoader worker, a helper process)
 * holds a copy of every socket of its parent's contexts. Should the
 * parent die, its connections would stay up for as long as the child
 * lives: its peers would see no end of stream, and would learn of the
 * failure only when a wait runs out (timeout_ms, 30 s by default) instead
 * of at once. The child's copy of a context cannot run anyway (fork
 * copies no threads), so in the child every socket of every context is
 * replaced by an unconnected socket of its own (dup3 over the same number):
 * the connections end with the parent, and the numbers stay taken, so a
 * mistaken use of the copy fails on a dead socket instead of reaching a
 * file the child opens later.
 *
 * Consistency: the prepare handler takes each context's poll_mu and mu,
 * under which sockets are made, adopted and closed, so the child finds
 * every table as no thread is changing it (a dialled socket not yet
 * adopted is the exception: a connect() in progress in another thread
 * holds it alone, and the child keeps that one).
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static tcp_ctx_t *g_head; /* the live contexts, by ctx->fork_next */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_installed;

static void lock_all(void) {
  pthread_mutex_lock(&g_mu);
  for (tcp_ctx_t *c = g_head; c; c = c->fork_next) {
    pthread_mutex_lock(&c->poll_mu);
    pthread_mutex_lock(&c->mu);
  }
}

static void unlock_all(void) {
  for (tcp_ctx_t *c = g_head; c; c = c->fork_next) {
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->poll_mu);
  }
  pthread_mutex_unlock(&g_mu);
}

/* In the child: fd becomes a copy of `dead`, or is closed if there is no
 * such socket. Async-signal-safe calls only, as after any fork. */
static void let_go(int fd, int dead) {
  if (fd < 0) return;
  if (dead < 0 || dup3(dead, fd, O_CLOEXEC) < 0) close(fd);
}

static void let_go_peer(const tcp_peer_t *p, int dead) {
  if (!p) return;
  for (int i = 0; i < p->ctx->cfg.nsock; i++) let_go(p->socks[i].fd, dead);
}

static void in_child(void) {
  int dead = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  for (tcp_ctx_t *c = g_head; c; c = c->fork_next) {
    let_go(c->lfd, dead);
    for (const tcp_hs_t *hs = c->hs; hs; hs = hs->next) let_go(hs->fd, dead);
    for (int r = 0; r < c->size; r++) let_go_peer(c->peers[r], dead);
  }
  if (dead >= 0) close(dead);
  unlock_all();
}

static void install(void) {
  g_installed = !pthread_atfork(lock_all, unlock_all, in_child);
}

int mep__tcp_fork_watch(tcp_ctx_t *ctx) {
  pthread_once(&g_once, install);
  if (!g_installed)
    return TCP_ERR(ctx, MEP_ERR_SYSTEM, "tcp: installing the fork handlers "
                   "failed (out of memory)");
  pthread_mutex_lock(&g_mu);
  ctx->fork_next = g_head;
  g_head = ctx;
  ctx->fork_watched = 1;
  pthread_mutex_unlock(&g_mu);
  return 0;
}

void mep__tcp_fork_unwatch(tcp_ctx_t *ctx) {
  if (!ctx->fork_watched) return;
  pthread_mutex_lock(&g_mu);
  for (tcp_ctx_t **pp = &g_head; *pp; pp = &(*pp)->fork_next)
    if (*pp == ctx) {
      *pp = ctx->fork_next;
      break;
    }
  ctx->fork_watched = 0;
  pthread_mutex_unlock(&g_mu);
}
