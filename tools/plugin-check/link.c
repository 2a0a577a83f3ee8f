/* link.c - framed messages over the socketpair between the two ranks. */
#include "link.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "worker.h"

typedef struct frame_hdr {
  uint32_t tag;
  uint32_t len;
} frame_hdr_t;

#define PC_LINK_MAX 4096

static void (*g_progress)(void *);
static void *g_progress_arg;

void pc_link_set_progress(void (*fn)(void *arg), void *arg) {
  g_progress = fn;
  g_progress_arg = arg;
}

static int peer_rank(void) { return 1 - pc_self()->rank; }

/* Longer than the waits inside a check, so that when the other rank is
 * stuck its own deadline (the real cause) is reported first; this one is
 * only a consequence. */
static int link_timeout_ms(void) { return pc_self()->opts->timeout_ms + 2000; }

void pc_link_send(int tag, const void *buf, size_t len) {
  unsigned char frame[sizeof(frame_hdr_t) + PC_LINK_MAX];
  if (len > PC_LINK_MAX) pc_fail("internal: link message of %zu bytes", len);
  frame_hdr_t h = {(uint32_t)tag, (uint32_t)len};
  memcpy(frame, &h, sizeof h);
  if (len) memcpy(frame + sizeof h, buf, len);
  size_t left = sizeof h + len;
  const unsigned char *p = frame;
  /* One frame is far below the socket buffer: this never blocks for long. */
  while (left > 0) {
    ssize_t n = send(pc_self()->link_fd, p, left, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      pc_peer_gone("rank %d's process went away (sending to it: %s)",
                   peer_rank(), strerror(errno));
    p += n;
    left -= (size_t)n;
  }
}

/* Reads exactly len bytes that are known to be on their way (the peer sent
 * the frame with one send), still under the deadline. */
static void read_exact(void *buf, size_t len, int64_t deadline_ms,
                       const char *what) {
  unsigned char *p = buf;
  while (len > 0) {
    int64_t left = deadline_ms - pc_now_ms();
    if (left <= 0)
      pc_peer_gone("timed out after %d ms reading %s from rank %d",
                   link_timeout_ms(), what, peer_rank());
    struct pollfd pfd = {pc_self()->link_fd, POLLIN, 0};
    int r = poll(&pfd, 1, (int)(left > 100 ? 100 : left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t n = recv(pc_self()->link_fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      pc_peer_gone("rank %d's process went away while %s was expected",
                   peer_rank(), what);
    p += n;
    len -= (size_t)n;
  }
}

/* Waits until the link is readable, keeping the plugin progressing. */
static void wait_readable(int64_t deadline_ms, const char *what) {
  for (;;) {
    struct pollfd pfd = {pc_self()->link_fd, POLLIN, 0};
    int r = poll(&pfd, 1, 0);
    if (r > 0) return;
    if (r < 0 && errno != EINTR)
      pc_fail("poll() on the link to rank %d: %s", peer_rank(),
              strerror(errno));
    if (pc_now_ms() > deadline_ms)
      pc_peer_gone("timed out after %d ms waiting for %s from rank %d",
                   link_timeout_ms(), what, peer_rank());
    if (g_progress)
      g_progress(g_progress_arg);
    else
      poll(&pfd, 1, 1);
    sched_yield();
  }
}

size_t pc_link_recv(int tag, void *buf, size_t cap, const char *what) {
  int64_t deadline = pc_now_ms() + link_timeout_ms();
  wait_readable(deadline, what);
  frame_hdr_t h;
  read_exact(&h, sizeof h, deadline, what);
  if ((int)h.tag != tag)
    pc_fail("internal: rank %d sent message kind %u where %s (kind %d) was "
            "expected; the two processes are out of step",
            peer_rank(), h.tag, what, tag);
  if (h.len > cap || h.len > PC_LINK_MAX)
    pc_fail("internal: %s from rank %d is %u bytes, room for %zu", what,
            peer_rank(), h.len, cap);
  read_exact(buf, h.len, deadline, what);
  return h.len;
}

void pc_link_send_u64(int tag, uint64_t v) { pc_link_send(tag, &v, sizeof v); }

uint64_t pc_link_recv_u64(int tag, const char *what) {
  uint64_t v = 0;
  if (pc_link_recv(tag, &v, sizeof v, what) != sizeof v)
    pc_fail("internal: %s from rank %d has the wrong size", what,
            peer_rank());
  return v;
}

void pc_link_barrier(int progress, const char *what) {
  void (*saved)(void *) = g_progress;
  if (!progress) g_progress = NULL;
  pc_link_send(PC_TAG_BARRIER, NULL, 0);
  char dummy;
  pc_link_recv(PC_TAG_BARRIER, &dummy, 0, what);
  g_progress = saved;
}
