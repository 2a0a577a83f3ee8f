/* fork_watch.c - the fork handlers of fork_watch.h. */
#include "fork_watch.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static mep__fork_watch_t *g_head;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_installed;

static void lock_all(void) {
  pthread_mutex_lock(&g_mu);
  for (mep__fork_watch_t *w = g_head; w; w = w->next)
    for (int i = 0; i < 3; i++)
      if (w->locks[i]) pthread_mutex_lock(w->locks[i]);
}

static void unlock_all(void) {
  for (mep__fork_watch_t *w = g_head; w; w = w->next)
    for (int i = 2; i >= 0; i--)
      if (w->locks[i]) pthread_mutex_unlock(w->locks[i]);
  pthread_mutex_unlock(&g_mu);
}

void mep__fork_let_go(int fd, int dead) {
  if (fd < 0) return;
  if (dead < 0 || dup3(dead, fd, O_CLOEXEC) < 0) close(fd);
}

static void in_child(void) {
  int dead = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  for (mep__fork_watch_t *w = g_head; w; w = w->next)
    w->let_go_all(w->arg, dead);
  if (dead >= 0) close(dead);
  unlock_all();
}

/* glibc drops these handlers when the module is unloaded (dlclose). */
static void install(void) {
  g_installed = !pthread_atfork(lock_all, unlock_all, in_child);
}

int mep__fork_watch(mep__fork_watch_t *w) {
  pthread_once(&g_once, install);
  if (!g_installed) return -1;
  pthread_mutex_lock(&g_mu);
  w->next = g_head;
  g_head = w;
  w->watched = 1;
  pthread_mutex_unlock(&g_mu);
  return 0;
}

void mep__fork_unwatch(mep__fork_watch_t *w) {
  if (!w->watched) return;
  pthread_mutex_lock(&g_mu);
  for (mep__fork_watch_t **pp = &g_head; *pp; pp = &(*pp)->next)
    if (*pp == w) {
      *pp = w->next;
      break;
    }
  w->watched = 0;
  pthread_mutex_unlock(&g_mu);
}
