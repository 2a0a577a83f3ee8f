/*
 * verbs_floor - the raw libibverbs floor of an 8-byte ping-pong, for
 * scripts/bench-verbs.sh: two threads, each with an RC queue pair on one
 * device, answer each other by RDMA WRITE and spin on the word in memory,
 * as ib_write_lat does. `1`: one inline WRITE per message (what
 * ib_write_lat does); `2`: an inline 8-byte WRITE then an inline 8-byte
 * WRITE of the flag word, in one post (what a one-sided put+signal must
 * do: two remote words, two work requests); `3`: one inline 8-byte WRITE
 * with immediate, whose receive completion the peer takes from its
 * completion queue before it stores the flag word itself (what the verbs
 * plugin does with fuse_signals: the signal rides in the put's immediate
 * and the receiver's poll() applies it). Prints the median round trip in
 * microseconds. Usage: verbs_floor 1|2|3 [ITERS] [DEVICE] [GID_INDEX]
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WARMUP 100

#define DIE(...) (fprintf(stderr, "verbs_floor: " __VA_ARGS__), exit(1))

#define RECVS 64

typedef struct side {
  struct ibv_cq *cq, *rcq; /* sends; receives (mode 3) */
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  volatile uint64_t *buf; /* [0] the flag word, [1] the data */
  struct side *peer;
  int id;
  double *rtt;
} side_t;

static struct ibv_context *dev;
static struct ibv_pd *pd;
static int gid_index = 1, wrs, iters;

static void make(side_t *s) {
  s->cq = ibv_create_cq(dev, 1024, NULL, NULL, 0);
  s->rcq = ibv_create_cq(dev, 1024, NULL, NULL, 0);
  struct ibv_qp_init_attr a = {
      .send_cq = s->cq, .recv_cq = s->rcq, .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 256, .max_recv_wr = RECVS, .max_send_sge = 1,
              .max_recv_sge = 1, .max_inline_data = 64}};
  s->qp = s->cq && s->rcq ? ibv_create_qp(pd, &a) : NULL;
  void *p = NULL;
  if (!s->qp || posix_memalign(&p, 4096, 4096)) DIE("queue pair\n");
  memset(p, 0, 4096);
  s->buf = p;
  s->mr = ibv_reg_mr(pd, p, 4096,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!s->mr) DIE("registration\n");
}

static void connect_to(side_t *s, const side_t *r, const union ibv_gid *gid) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                          .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
                                   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    DIE("INIT\n");
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
                           .dest_qp_num = r->qp->qp_num,
                           .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = *gid;
  a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                   IBV_QP_MAX_DEST_RD_ATOMIC |
                                   IBV_QP_MIN_RNR_TIMER))
    DIE("RTR\n");
  a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14,
                           .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
                                   IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    DIE("RTS\n");
}

static void post_recv(side_t *s) {
  struct ibv_recv_wr r = {.wr_id = 1}, *bad;
  if (ibv_post_recv(s->qp, &r, &bad)) DIE("post_recv\n");
}

/* Mode 3: the receive completion brings the signal; applied here. */
static void wait_imm(side_t *s, uint64_t i) {
  struct ibv_wc wc[4];
  while (s->buf[0] < i) {
    int n = ibv_poll_cq(s->rcq, 4, wc);
    for (int k = 0; k < n; k++) {
      if (wc[k].status) DIE("receive: %s\n", ibv_wc_status_str(wc[k].status));
      __atomic_store_n(&s->buf[0], (uint64_t)ntohl(wc[k].imm_data),
                       __ATOMIC_RELEASE);
      post_recv(s);
    }
  }
}

/* Every 16th message asks for a completion, so the send queue drains. */
static void ping(side_t *s, uint64_t i) {
  uint64_t data = i, flag = i;
  struct ibv_sge d = {.addr = (uintptr_t)&data, .length = 8},
                 f = {.addr = (uintptr_t)&flag, .length = 8};
  struct ibv_send_wr wf = {.sg_list = &f, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_INLINE |
                                         (i % 16 ? 0 : IBV_SEND_SIGNALED)};
  struct ibv_send_wr wd = {.sg_list = &d, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_INLINE, .next = &wf};
  wf.wr.rdma.remote_addr = (uintptr_t)s->peer->buf;
  wd.wr.rdma.remote_addr = (uintptr_t)(s->peer->buf + 1);
  wf.wr.rdma.rkey = wd.wr.rdma.rkey = s->peer->mr->rkey;
  if (wrs == 3) {
    wd.next = NULL;
    wd.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wd.imm_data = htonl((uint32_t)i);
    wd.send_flags |= wf.send_flags;
  }
  struct ibv_send_wr *bad;
  if (ibv_post_send(s->qp, wrs >= 2 ? &wd : &wf, &bad)) DIE("post\n");
  struct ibv_wc wc;
  while (ibv_poll_cq(s->cq, 1, &wc) > 0)
    if (wc.status) DIE("completion: %s\n", ibv_wc_status_str(wc.status));
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void *run(void *arg) {
  side_t *s = arg;
  for (uint64_t i = 1; i <= (uint64_t)(WARMUP + iters); i++) {
    double t0 = now_us();
    if (s->id == 0) ping(s, i);
    if (wrs == 3) wait_imm(s, i);
    while (s->buf[0] < i) {
    }
    if (s->id == 1) ping(s, i);
    if (i > WARMUP) s->rtt[i - WARMUP - 1] = now_us() - t0;
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  wrs = argc > 1 ? atoi(argv[1]) : 0;
  iters = argc > 2 ? atoi(argv[2]) : 5000;
  const char *name = argc > 3 ? argv[3] : NULL;
  if (argc > 4) gid_index = atoi(argv[4]);
  if (wrs < 1 || wrs > 3 || iters < 1)
    DIE("usage: verbs_floor 1|2|3 [ITERS] [DEVICE] [GID_INDEX]\n");
  int n;
  struct ibv_device **l = ibv_get_device_list(&n);
  for (int i = 0; l && i < n && !dev; i++)
    if (!name || !strcmp(ibv_get_device_name(l[i]), name))
      dev = ibv_open_device(l[i]);
  if (!dev) DIE("no device %s\n", name ? name : "");
  union ibv_gid gid;
  if (ibv_query_gid(dev, 1, gid_index, &gid)) DIE("GID %d\n", gid_index);
  pd = ibv_alloc_pd(dev);
  side_t a = {.id = 0}, b = {.id = 1};
  make(&a);
  make(&b);
  a.peer = &b;
  b.peer = &a;
  connect_to(&a, &b, &gid);
  connect_to(&b, &a, &gid);
  for (int k = 0; k < RECVS; k++) post_recv(&a), post_recv(&b);
  a.rtt = calloc((size_t)iters, sizeof *a.rtt);
  b.rtt = calloc((size_t)iters, sizeof *b.rtt);
  pthread_t ta, tb;
  pthread_create(&ta, NULL, run, &a);
  pthread_create(&tb, NULL, run, &b);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  qsort(a.rtt, (size_t)iters, sizeof *a.rtt, cmp);
  printf("%.2f\n", a.rtt[iters / 2]);
  return 0;
}
