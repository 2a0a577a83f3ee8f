/* util.c - the leaf helpers the other files share: the clock of every
 * deadline, an address as text, a connected socket's options. It calls
 * nothing else of the plugin, so net.c (waits) -> accept.c -> peer.c can
 * all use it and calls still go one way. */
#include <arpa/inet.h>
#include <sched.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>

#include "tcp.h"

int64_t mep__tcp_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t mep__tcp_now_ms(void) { return mep__tcp_now_us() / 1000; }

int mep__tcp_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set)) return 1;
  return CPU_COUNT(&set);
}

void mep__tcp_fmt_addr(const struct sockaddr_in *a, char *buf, size_t len) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
  snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
}

/* Keepalive probes every second after one idle second, and a user timeout,
 * so a peer whose host vanished (no FIN, no RST) is noticed in seconds
 * whether or not data is in flight. */
void mep__tcp_sockopts(tcp_ctx_t *ctx, int fd) {
  int on = 1, idle = 1, intvl = 1, cnt = 3;
  unsigned user_ms = ctx->timeout_ms > 1000 ? (unsigned)ctx->timeout_ms : 1000;
  int nodelay = ctx->cfg.nodelay;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof nodelay);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
}
