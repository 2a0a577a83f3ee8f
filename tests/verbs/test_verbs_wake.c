/*
 * test_verbs_wake - a rank asleep on the verbs plugin's event fd wakes for
 * a put+signal (needs an RDMA device: run-vm.sh runs it in the VM).
 *
 * Two processes, as the core drives the plugin: rank 1 polls until idle,
 * then sleeps on props.event_fd as the core does. Rank 0 waits half a
 * second, polling or itself asleep on its event fd by turns, then puts 8
 * bytes and signals, and then stays still (no poll(): rank 1 is to be
 * woken by the signal alone) until rank 1 answers. Rank 1 must really
 * have slept (a wait on the fd that blocked) and must see the signal, with
 * the put's bytes before it, well before its wait's own timeout: a lost
 * wake-up shows as that timeout (a plugin whose signals do not complete on
 * the sleeper's queues fails here).
 * Then a ping-pong of put+signal checks the polling path with the same
 * ordering check.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "vpair.h"
#include <mep/transport.h>

#define ROUNDS 6
#define DELAY_MS 500
#define SLEEP_MS 10000 /* a wait on the fd longer than any round */
#define PINGS 200


typedef struct side {
  const mep_transport_t *vt;
  mep_tp_ctx_t *ctx;
  mep_tp_ep_t *ep;
  mep_tp_mr_t *mr;
  mep_tp_rmr_t *rmr;
  volatile uint64_t *buf; /* [0] the signal word, [1] the put's bytes */
  int efd, sock, rank;
  uint64_t token;
} side_t;

static void poll_tp(side_t *s, int n) {
  mep_tp_completion_t c[16];
  for (int i = 0; i < n; i++) {
    int got = s->vt->poll(s->ctx, c, 16);
    CHECK(got >= 0, "poll: %d", got);
    for (int j = 0; j < got; j++)
      CHECK(c[j].status == 0, "completion of token %llu: %d",
            (unsigned long long)c[j].token, c[j].status);
  }
}

/* The core's idle loop, for ms: polls, and once idle sleeps on the event
 * fd. How many of its waits on the fd blocked for at least 100 ms. */
static int idle_for(side_t *s, int ms, volatile uint64_t *word,
                    uint64_t until) {
  int64_t end = vpair_now_ms() + ms;
  int slept = 0;
  while (vpair_now_ms() < end && !(word && *word >= until)) {
    poll_tp(s, 600);
    if (word && *word >= until) break;
    struct pollfd p = {.fd = s->efd, .events = POLLIN};
    int64_t t = vpair_now_ms();
    int left = (int)(end - t);
    poll(&p, 1, left > 0 ? left : 0);
    slept += vpair_now_ms() - t >= 100;
  }
  return slept;
}

static void busy_for(side_t *s, int ms) {
  int64_t end = vpair_now_ms() + ms;
  while (vpair_now_ms() < end) poll_tp(s, 100);
}

/* A byte from the peer's socket, polling the plugin meanwhile (its peer
 * may wait for an acknowledgement only poll() sends). */
/* A byte from the peer, polling the plugin meanwhile. */
static void idle_poll(void *s) { poll_tp(s, 50); }
static uint8_t recv_byte(side_t *s) {
  return vpair_recv_byte(s->sock, s->rank, 20000, idle_poll, s);
}

/* A byte from the peer's socket, without polling the plugin: nothing of
 * this side's (a wake-up word of its own) may wake the peer meanwhile. */
static uint8_t recv_byte_quiet(side_t *s) {
  struct pollfd p = {.fd = s->sock, .events = POLLIN};
  CHECK(poll(&p, 1, 20000) == 1, "rank %d: no word from the peer in 20 s",
        s->rank);
  uint8_t b;
  CHECK(recv(s->sock, &b, 1, 0) == 1, "the peer's socket closed");
  return b;
}

static void send_byte(side_t *s, uint8_t b) { vpair_send_byte(s->sock, b); }

static void put_signal(side_t *s, uint64_t v) {
  s->buf[2] = v; /* the source: the put's bytes */
  CHECK_OK(s->vt->write(s->ep, s->mr, 16, s->rmr, 8, 8, s->token++));
  CHECK_OK(s->vt->signal(s->ep, s->rmr, 0, v, MEP_SIGNAL_SET));
}

static void xchg(side_t *s, const void *mine, void *theirs, size_t len) {
  vpair_xchg(s->sock, mine, theirs, len);
}

static void setup(side_t *s, mep_plugin_t *p, mep_tp_env_t *env) {
  CHECK_OK(mep_plugin_env_open(env, NULL, p));
  env->rank = s->rank;
  env->size = 2;
  env->secret = vpair_secret;
  env->secret_len = sizeof vpair_secret;
  env->timeout_ms = 20000;
  s->vt = mep_plugin_vtable(p);
  CHECK_OK(s->vt->init(env, &s->ctx));
  mep_tp_props_t pr = {.struct_size = sizeof pr};
  CHECK_OK(s->vt->props(s->ctx, &pr));
  s->efd = pr.event_fd;
  uint8_t a[MEP_TP_MAX_ADDR], b[MEP_TP_MAX_ADDR];
  size_t len = sizeof a;
  CHECK_OK(s->vt->address(s->ctx, a, &len));
  xchg(s, a, b, len);
  CHECK_OK(s->vt->connect(s->ctx, !s->rank, b, len, &s->ep));
  static uint64_t mem[2][512] __attribute__((aligned(4096)));
  s->buf = mem[s->rank];
  uint8_t rk[MEP_TP_MAX_RKEY], prk[MEP_TP_MAX_RKEY];
  size_t rlen = sizeof rk;
  CHECK_OK(s->vt->reg(s->ctx, (void *)s->buf, 4096, MEP_MEM_HOST, &s->mr,
                      rk, &rlen));
  xchg(s, rk, prk, rlen);
  CHECK_OK(s->vt->import(s->ep, prk, rlen, &s->rmr));
}

static void sender(side_t *s) {
  for (uint64_t k = 1; k <= ROUNDS; k++) {
    CHECK(recv_byte(s) == 'r', "expected ready");
    if (k % 2) busy_for(s, DELAY_MS);
    else idle_for(s, DELAY_MS, NULL, 0);
    put_signal(s, k);
    CHECK(recv_byte_quiet(s) == 'd', "expected done");
  }
  for (uint64_t i = 1; i <= PINGS; i++) {
    put_signal(s, 1000 + i);
    while (s->buf[0] < 1000 + i) poll_tp(s, 1);
    CHECK(s->buf[1] == 1000 + i, "ping %llu: the put's bytes read %llu",
          (unsigned long long)i, (unsigned long long)s->buf[1]);
  }
}

static void sleeper(side_t *s) {
  for (uint64_t k = 1; k <= ROUNDS; k++) {
    int64_t t0 = vpair_now_ms();
    send_byte(s, 'r');
    int slept = idle_for(s, SLEEP_MS, &s->buf[0], k);
    int64_t took = vpair_now_ms() - t0;
    CHECK(s->buf[0] == k, "round %llu: the signal word reads %llu after %lld "
          "ms", (unsigned long long)k, (unsigned long long)s->buf[0],
          (long long)took);
    CHECK(s->buf[1] == k, "round %llu: the signal landed before the put "
          "(it reads %llu)", (unsigned long long)k,
          (unsigned long long)s->buf[1]);
    CHECK(took < DELAY_MS + 2000, "round %llu: the signal was seen after %lld "
          "ms (sent after %d): a wake-up was lost", (unsigned long long)k,
          (long long)took, DELAY_MS);
    CHECK(slept > 0, "round %llu: never slept on the event fd (it stayed "
          "readable)", (unsigned long long)k);
    printf("PASS round %llu (peer %s): woken, signal seen after %lld ms\n",
           (unsigned long long)k, k % 2 ? "polling" : "asleep too",
           (long long)took);
    send_byte(s, 'd');
  }
  for (uint64_t i = 1; i <= PINGS; i++) {
    while (s->buf[0] < 1000 + i) poll_tp(s, 1);
    CHECK(s->buf[1] == 1000 + i, "ping %llu: the put's bytes read %llu",
          (unsigned long long)i, (unsigned long long)s->buf[1]);
    put_signal(s, 1000 + i);
  }
  printf("PASS %d put+signal round trips, each signal after its put\n",
         PINGS);
}

static int run(int rank, int sock) {
  mep_plugin_t *p = NULL;
  CHECK_OK(mep_plugin_find("verbs", &p));
  mep_tp_env_t env;
  side_t s = {.rank = rank, .sock = sock, .token = 1};
  setup(&s, p, &env);
  if (rank == 0) sender(&s);
  else sleeper(&s);
  /* both done before either closes */
  send_byte(&s, 'e');
  CHECK(recv_byte(&s) == 'e', "expected the end");
  poll_tp(&s, 100);
  CHECK_OK(s.vt->unimport(s.ep, s.rmr));
  CHECK_OK(s.vt->close(s.ep));
  CHECK_OK(s.vt->dereg(s.ctx, s.mr));
  CHECK_OK(s.vt->fini(s.ctx));
  mep_plugin_env_fini(&env);
  mep_plugin_close(p);
  return 0;
}

int main(void) {
  int skip = vpair_skip();
  if (skip) return skip;
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    close(sv[0]);
    alarm(120);
    _exit(run(1, sv[1]));
  }
  close(sv[1]);
  alarm(120);
  run(0, sv[0]);
  int st;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 failed (status %#x)",
        st);
  printf("PASS a sleeping rank wakes for signals\n");
  return 0;
}
