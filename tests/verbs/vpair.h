/* vpair.h - what the two-process verbs tests (test_verbs_wake.c,
 * test_verbs_inband.c) share: the job secret both ranks give the plugin, a
 * clock, and the socket pair between the two ranks, over which they take
 * turns (a byte) and exchange blobs. Static functions: each test is one
 * file. */
#ifndef MEP_TESTS_VERBS_VPAIR_H
#define MEP_TESTS_VERBS_VPAIR_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include <mep/transport.h>

static const uint8_t vpair_secret[16] = "0123456789abcdef";

static inline int64_t vpair_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void vpair_send_byte(int sock, uint8_t b) {
  CHECK(send(sock, &b, 1, 0) == 1, "send: %s", strerror(errno));
}

/* A byte from the peer within limit_ms, calling idle(arg) (which polls
 * the plugin) while none is there. */
static inline uint8_t vpair_recv_byte(int sock, int rank, int limit_ms,
                                      void (*idle)(void *), void *arg) {
  uint8_t b;
  int64_t end = vpair_now_ms() + limit_ms;
  for (;;) {
    ssize_t n = recv(sock, &b, 1, MSG_DONTWAIT);
    if (n == 1) return b;
    CHECK(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
          "rank %d: the peer's socket closed", rank);
    CHECK(vpair_now_ms() < end, "rank %d: no word from the peer in %d s",
          rank, limit_ms / 1000);
    idle(arg);
  }
}

static inline void vpair_xchg(int sock, const void *mine, void *theirs,
                              size_t len) {
  CHECK(send(sock, mine, len, 0) == (ssize_t)len, "send");
  CHECK(recv(sock, theirs, len, MSG_WAITALL) == (ssize_t)len, "recv");
}

/* 0 where this host has an RDMA device and the verbs plugin is built;
 * else the SKIP line printed and 77 (meson's skip) to return. */
static inline int vpair_skip(void) {
  if (access("/sys/class/infiniband", F_OK) != 0) {
    printf("SKIP: no RDMA device\n");
    return 77;
  }
  mep_plugin_t *p = NULL;
  if (mep_plugin_find("verbs", &p)) {
    printf("SKIP: the verbs plugin is not built here: %s\n",
           mep_last_error());
    return 77;
  }
  mep_plugin_close(p);
  return 0;
}

#endif /* MEP_TESTS_VERBS_VPAIR_H */
