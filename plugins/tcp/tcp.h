/*
 * tcp.h - the tcp transport's internal objects, shared by its files.
 *
 * Threads and locks. poll() runs on one thread (the "poll thread"); every
 * other entry point may run on any thread at the same time. Locks, always
 * taken in this order and never held across a blocking call:
 *   the fork handlers' list of live contexts (fork_watch.h); around
 *               fork() they hold it and every context's poll_mu and mu
 *   ctx->poll_mu held by poll() throughout, and by whoever frees a peer's
 *               fds or memory (close, connect, see "Lifetime" below), so
 *               nothing is freed under the poll thread's feet
 *   ctx->mu     the peers table, the tombstones, the shut flags, the
 *               pending handshakes and the sockets being dialled
 *   peer->mu    a peer's state, its sockets' fds and send queues
 *   ctx->tx.mu, ctx->rx.mu  a pool's lists and the sockets' states with
 *               it (pool.c); never both
 *   ctx->cq_mu  the completion queue (a leaf)
 *   ctx->lazy_mu the list of peers with deferred small writes (a leaf)
 *   ctx->rx_lock the region table, a read-write lock; its read side is
 *               held while a payload is read into region memory (by the
 *               poll thread or a receiver thread) or a signal applied, so
 *               dereg cannot return while bytes still land in the region
 *               (a leaf)
 * One exception: close() holds peer->mu across its goodbye (sending it and
 * waiting for its acknowledgement, at most TCP_BYE_MS), so nothing can be
 * queued behind it meanwhile.
 * A socket's receive state and a peer's pending signals belong to the poll
 * thread alone, but for the rest of a payload it handed to a receiver
 * thread (receiver.c). File descriptors of a dead peer are shut down by
 * whoever finds it dead but closed only under poll_mu (by the poll thread,
 * close() or connect()) or by fini, so the poll thread never reads from a
 * number that was closed and reused meanwhile.
 *
 * Lifetime of a peer (ABI 1.1: ranks are dropped and replaced). A peer
 * object is made by connect(), or by an accepted hello that comes before
 * connect() (a "stash", adopted by connect() only if it comes from the
 * incarnation the address blob names). close() releases everything the
 * connection holds (fds, queues, buffers) and leaves a small tombstone in
 * ctx->tombs[rank], so that a second close() of the same ep stays harmless;
 * the tombstone is freed when connect() is called for that rank again (the
 * core never uses an ep after close) or at fini, so nothing grows over
 * cycles. After close() the rank is "shut": a hello claiming it is refused
 * (MEP_TCP_NAK_UNEXPECTED) until connect() is called for it again.
 *
 * Orderly close (bye.c). close() sends a BYE on every socket when nothing
 * is left to send; a receiver that got the BYE of every socket, and could
 * apply every signal, reports the peer MEP_ERR_CLOSED instead of
 * MEP_ERR_PEER_FAILED. A failed send does not fail the peer at once: the
 * socket is shut down and its receive side, which reads what the peer sent
 * up to the end (its BYE, maybe), decides between the two.
 */
#ifndef MEP_TCP_TCP_H
#define MEP_TCP_TCP_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "fork_watch.h"
#include "mep/transport.h"
#include "wire.h"

#define TCP_LOG(ctx, lvl, ...) ((ctx)->env->log((lvl), __VA_ARGS__))
#define TCP_ERR(ctx, code, ...) ((ctx)->env->set_error(__VA_ARGS__), (code))

/* A write this short that finds its socket's queue empty is not sent at
 * once but deferred: a signal() that follows sends both in one sendmsg
 * (one TCP segment). Deferred writes leave with the next signal on the
 * peer, the next poll() or close(), whichever comes first; at most
 * TCP_LAZY_MAX bytes wait so. */
#define TCP_LAZY_WRITE (16u * 1024u)
#define TCP_LAZY_MAX (64u * 1024u)
/* Each socket reads into a buffer of this size and parses every message
 * it holds; a payload at least TCP_RX_DIRECT long that finds the buffer
 * empty is read straight into its region instead. */
#define TCP_RXBUF_LEN (32u * 1024u)
#define TCP_RX_DIRECT (8u * 1024u)
/* A socket's queue this long (or one the kernel took only part of) is
 * handed to the sender thread, where there is one (sender.c). */
#define TCP_TX_HANDOFF (64u * 1024u)
/* The rest of a payload this long is read by a receiver thread, where
 * there is one (receiver.c): a stripe of a chunk (512 KiB by default)
 * less what the poll thread read ahead, not the 256 KiB pieces of a
 * 1 MiB collective on 4 ranks, where waking the thread cost more than it
 * saved (docs/perf.md, "Receiver threads"). */
#define TCP_RX_HANDOFF (256u * 1024u)
/* How long a pool's thread watches for work before it sleeps: about the
 * time between a chunk's write and the next (docs/perf.md). */
#define TCP_POOL_SPIN_US 1000
/* Most iovec entries of one sendmsg. */
#define TCP_MAX_IOV 64
/* [tcp] sockets_per_peer = 0 (auto) is 2 in groups of at most this many
 * ranks: on a 16-core host 2 streams took 0.66-0.98 of the time of one
 * on 2 and 4 ranks from 4 MiB (docs/perf.md, "Two streams per peer"); in
 * larger groups the threads would outnumber the CPUs. */
#define TCP_AUTO_SOCKS_RANKS 4
/* Writes at least twice this long are striped over the peer's sockets. */
#define TCP_STRIPE_MIN (256u * 1024u)
/* A signal waits on the receiver until the writes before it arrived; past
 * this many waiting signals the receiver stops reading the signal socket
 * (back-pressure) instead of growing without bound. */
#define TCP_MAX_PENDING_SIGNALS 65536
/* How long close() may spend on its goodbyes, all sockets together. */
#define TCP_BYE_MS 200
/* Accepted connections that have not finished their hello. */
#define TCP_MAX_HANDSHAKES 256
/* A dialler whose hello was refused for now tries again after a backoff
 * that doubles from the first to the last value, until its deadline. */
#define TCP_NAK_BACKOFF_MS 5
#define TCP_NAK_BACKOFF_MAX_MS 100

typedef struct tcp_cfg {
  char ifname[64];
  int port_lo, port_hi; /* 0, 0: ephemeral */
  int nsock;            /* sockets_per_peer */
  int retries;          /* connect_retries: dial attempts */
  int nodelay;
  int send_thread;  /* TCP_THREADS_* */
  int send_threads; /* 0: auto */
  int recv_thread;  /* TCP_THREADS_* */
} tcp_cfg_t;

/* [tcp] send_thread and recv_thread, in the order of their choices */
enum { TCP_THREADS_AUTO, TCP_THREADS_OFF, TCP_THREADS_ON };
/* The pools (pool.c): which direction of a socket they serve */
enum { TCP_TX, TCP_RX };
/* A socket's state with a pool (pool.c) */
enum { TCP_HAND_NONE, TCP_HAND_LISTED, TCP_HAND_BUSY, TCP_HAND_DONE };
/* What one step of a pool's thread on a socket did */
enum { TCP_STEP_DONE, TCP_STEP_MOVED, TCP_STEP_WAIT };
/* How a receiver thread's payload ended, but for an errno (receiver.c) */
enum { TCP_RX_OK = 0, TCP_RX_EOF = -1, TCP_RX_GONE = -2 };

/* What an epoll event points to; the kind says which object it is. */
enum { TCP_SRC_LISTEN, TCP_SRC_HANDSHAKE, TCP_SRC_SOCK, TCP_SRC_CQ,
       TCP_SRC_RX };
typedef struct tcp_src {
  int kind;
} tcp_src_t;

/* A striped write: its token completes when every stripe went out. */
typedef struct tcp_op {
  uint64_t token;
  int left;
  int status;
} tcp_op_t;

/* One message waiting in a socket's send queue. */
typedef struct tcp_item {
  struct tcp_item *next;
  const uint8_t *payload;
  uint64_t payload_len;
  uint64_t sent; /* bytes of header + payload already sent */
  tcp_op_t *op;  /* a stripe of a striped write, else NULL */
  uint64_t token;
  int is_write;
  uint32_t hdr_len;
  uint8_t hdr[MEP_TCP_HDR_LEN + MEP_TCP_MAX_TRAILER];
} tcp_item_t;

enum { TCP_RX_HDR, TCP_RX_TRAILER, TCP_RX_PAYLOAD };

struct tcp_peer;
struct tcp_sock;

/* A socket's hand-over to a pool (pool.c). */
typedef struct tcp_hand {
  int state;             /* TCP_HAND_*, under the pool's mu */
  struct tcp_sock *next; /* on a list of the pool's, under its mu */
} tcp_hand_t;

typedef struct tcp_sock {
  tcp_src_t src; /* first: epoll events point here */
  struct tcp_peer *peer;
  uint32_t index;
  int fd;   /* -1 until connected and after the poll thread closed it */
  int used; /* was ever connected: a second connection is a duplicate */
  /* send side, under peer->mu */
  tcp_item_t *head, *tail;
  uint64_t queued;   /* bytes not yet handed to the kernel */
  uint64_t tx_seq;   /* messages queued on this socket so far */
  int out_armed;     /* EPOLLOUT is on */
  int lazy;          /* the queue holds deferred writes nobody tried to
                        send yet (TCP_LAZY_WRITE) */
  int tx_err;        /* a send failed with this errno: nothing more is
                        sent here, the socket is shut down */
  tcp_hand_t hand[2]; /* [TCP_TX]: its queue, [TCP_RX]: its payload */
  /* receive side, poll thread only */
  int rx_state;
  size_t rx_have, rx_need;
  mep__tcp_msg_t rx_msg;
  uint64_t rx_left; /* payload bytes still to come */
  int rx_res;       /* TCP_RX_* or an errno: how a receiver thread's read
                       of the payload ended */
  uint64_t rx_seq;  /* messages received completely */
  int rx_bye;       /* the peer's BYE arrived here */
  int rx_ended;     /* and then the end of the stream: no longer watched */
  int rx_stalled;   /* back-pressure stopped it with bytes in rb */
  uint8_t *rb;      /* TCP_RXBUF_LEN bytes read ahead, made on first use */
  size_t rb_off, rb_len; /* the unparsed bytes: rb[rb_off..+rb_len) */
  uint8_t rx_buf[MEP_TCP_HDR_LEN + MEP_TCP_MAX_TRAILER];
} tcp_sock_t;

typedef struct tcp_rmr {
  struct tcp_peer *peer;
  struct tcp_rmr *prev, *next;
  uint32_t region;
  uint64_t len;
} tcp_rmr_t;

typedef struct tcp_peer {
  struct tcp_ctx *ctx;
  int rank;
  pthread_mutex_t mu;
  /* The process at the other end: from the blob given to connect()
   * (inc_known), or from the first stashed hello. */
  uint64_t inc;
  int inc_known;
  int connecting; /* inside connect() */
  int nup;        /* sockets connected */
  int connected;  /* connect() succeeded: the core holds this ep */
  int dead;       /* failed or closed: sockets shut down */
  int dead_status; /* MEP_ERR_PEER_FAILED, _PROTOCOL, _BOUNDS or _CLOSED */
  int fds_open;    /* dead with fds the poll thread has yet to close */
  int closing;     /* a BYE arrived: the peer is closing, nothing more is
                      sent to it */
  int nbye;        /* sockets whose BYE arrived, poll thread only */
  uint32_t rr;
  tcp_rmr_t *rmrs; /* imported regions, freed at fini if still there */
  int lazy_listed;  /* on ctx->lazy_head (under mu) */
  struct tcp_peer *lazy_next; /* under ctx->lazy_mu */
  /* pending signals, poll thread only: a ring of entries of
   * (4 + nsock) u64: region, op, offset, value, counts... */
  uint64_t *psig;
  size_t psig_head, psig_n, psig_cap;
  tcp_sock_t socks[]; /* nsock */
} tcp_peer_t;

/* An accepted connection whose hello is not complete yet. */
typedef struct tcp_hs {
  struct tcp_hs *next;
  int fd;
  struct sockaddr_in from;
  int64_t deadline_ms;
  size_t have;
  uint8_t buf[MEP_TCP_HELLO_LEN + MEP_TCP_MAX_SECRET];
} tcp_hs_t;

/* A socket connect() is dialling, not yet a peer's: listed so that a
 * forked child lets go of it too (fork.c). */
typedef struct tcp_dialing {
  int fd; /* -1: none at the moment */
  struct tcp_dialing *next;
} tcp_dialing_t;

typedef struct tcp_mr {
  struct tcp_ctx *ctx;
  uint32_t id;
  uint8_t *base;
  uint64_t len;
} tcp_mr_t;

/* One thread of a pool. The sockets it serves (TCP_HAND_BUSY) are its
 * alone; they are kept here, not on its stack, so that they stay
 * reachable however the process ends. */
struct pollfd;
struct tcp_pool;
typedef struct tcp_worker {
  struct tcp_pool *pool;
  pthread_t thread;
  int evfd;                /* wakes it */
  /* under pool->mu */
  tcp_sock_t *head, *tail; /* sockets handed over, TCP_HAND_LISTED */
  int sleeping;
  /* the thread's own */
  tcp_sock_t **s;
  struct pollfd *pf; /* pf[0]: evfd; pf[1 + i]: s[i] */
  size_t n, cap;
} tcp_worker_t;

/* Threads that serve one direction of the sockets handed to them. */
typedef struct tcp_pool {
  struct tcp_ctx *ctx;
  int dir;          /* TCP_TX or TCP_RX: which hand of a socket */
  short events;     /* what a thread waits for on a socket: POLLOUT, POLLIN */
  const char *name; /* of the threads */
  const char *what; /* "sender", in messages */
  /* The thread's work on s, one step; *fd: what to wait on for
   * TCP_STEP_WAIT. A step that returns TCP_STEP_DONE gave s back. */
  int (*step)(tcp_sock_t *s, int *fd);
  int started;          /* mu and idle exist: fini calls pool_stop */
  pthread_mutex_t mu;
  pthread_cond_t idle;  /* a socket stopped being TCP_HAND_BUSY */
  int stop;
  int n;                /* threads started */
  tcp_worker_t *w;      /* n of them */
  /* a pool whose sockets go back to the poll thread (donefd >= 0) lists
   * them here and writes donefd, which is in the epoll set */
  tcp_sock_t *done_head, *done_tail;
  int donefd;
} tcp_pool_t;

typedef struct tcp_ctx {
  const mep_tp_env_t *env;
  tcp_cfg_t cfg;
  int rank, size, timeout_ms;
  int epfd, lfd, cqfd;
  tcp_src_t lsrc, hssrc, cqsrc, rxsrc;
  struct sockaddr_in addr; /* where lfd listens */

  uint64_t inc; /* this context's incarnation, in its address blob */

  pthread_mutex_t poll_mu;
  pthread_mutex_t mu;
  tcp_peer_t **peers; /* size entries, created on first use */
  tcp_peer_t **tombs; /* size entries: the last closed ep of each rank */
  uint8_t *shut;      /* size entries: closed, no connect() since */
  tcp_hs_t *hs;
  struct tcp_dialing *dialing; /* connect()s dialling now (dial.c) */
  int nhs;                    /* atomic reads outside mu */
  int64_t hs_next_deadline;   /* atomic reads outside mu */
  int reap;                   /* atomic: some dead peer has open fds */

  pthread_rwlock_t rx_lock;
  tcp_mr_t **regions; /* regions[id - 1]; NULL once deregistered */
  uint32_t nregions, regions_cap;

  pthread_mutex_t cq_mu;
  mep_tp_completion_t *cq;
  size_t cq_head, cq_n, cq_cap;
  int cq_armed; /* the eventfd is readable */

  pthread_mutex_t lazy_mu;
  tcp_peer_t *lazy_head; /* peers with deferred writes; atomic reads */

  tcp_pool_t tx; /* the sender threads (sender.c), if any */
  tcp_pool_t rx; /* the receiver threads (receiver.c), if any */

  mep__fork_watch_t fork; /* a forked child lets go of the sockets */
} tcp_ctx_t;

/* config.c */
int mep__tcp_cfg_read(const mep_tp_env_t *env, tcp_cfg_t *cfg);
/* The [tcp] keys this plugin declares (config.c). */
#define MEP_TCP_NKEYS 8
extern const mep_tp_cfg_key_t mep__tcp_keys[MEP_TCP_NKEYS];

/* util.c: leaf helpers, calling nothing else of the plugin */
int64_t mep__tcp_now_ms(void);
int64_t mep__tcp_now_us(void);
/* The CPUs this process may run on. */
int mep__tcp_cpus(void);
void mep__tcp_fmt_addr(const struct sockaddr_in *a, char *buf, size_t len);
void mep__tcp_sockopts(tcp_ctx_t *ctx, int fd);

/* net.c */
int mep__tcp_listen(tcp_ctx_t *ctx);
/* Waits up to 5 ms (never past deadline) for `events` on fd (-1: none),
 * serving incoming connections meanwhile. 1 ready, 0 not yet, -1 past
 * the deadline. */
int mep__tcp_wait(tcp_ctx_t *ctx, int fd, short events, int64_t deadline);

/* cq.c */
void mep__tcp_cq_push(tcp_ctx_t *ctx, uint64_t token, int status, int peer);
int mep__tcp_cq_pop(tcp_ctx_t *ctx, mep_tp_completion_t *out, int max);
/* Drops the queued peer reports ({MEP_TP_TOKEN_NONE, status, rank}) of
 * `rank`: its connection was closed, they must not name a successor. */
void mep__tcp_cq_forget(tcp_ctx_t *ctx, int rank);

/* peer.c */
/* ctx->mu held: a new peer object in slot `rank` (which must be empty),
 * or NULL when out of memory. */
tcp_peer_t *mep__tcp_peer_new(tcp_ctx_t *ctx, int rank);
int mep__tcp_peer_install(tcp_peer_t *p, uint32_t index, int fd, int add);
/* peer->mu held: tells epoll what the poll thread waits for on s: its
 * bytes, unless a receiver thread reads them, and room to send while
 * out_armed. 0, or -1 (errno) when epoll refused. */
int mep__tcp_sock_watch(tcp_sock_t *s);
void mep__tcp_peer_fail_locked(tcp_peer_t *p, int status, int report);
/* What the writes still queued to a peer that died with `status`
 * complete with: MEP_ERR_CLOSED after a close, else MEP_ERR_PEER_FAILED. */
static inline int mep__tcp_lost_status(int status) {
  return status == MEP_ERR_CLOSED ? MEP_ERR_CLOSED : MEP_ERR_PEER_FAILED;
}
void mep__tcp_peer_fail(tcp_peer_t *p, int status, int report);
void mep__tcp_reap(tcp_ctx_t *ctx);
/* poll_mu and ctx->mu held, p dead: takes p out of its slot and releases
 * its fds, queues and buffers; then keeps it as the rank's tombstone
 * (tomb: an ep the core holds) or frees it. */
void mep__tcp_peer_retire(tcp_peer_t *p, int tomb);
/* poll_mu and ctx->mu held: frees rank's tombstone, if any. */
void mep__tcp_tomb_free(tcp_ctx_t *ctx, int rank);
void mep__tcp_peer_free(tcp_peer_t *p);

/* accept.c */
void mep__tcp_accept_pump(tcp_ctx_t *ctx);
void mep__tcp_hs_free_all(tcp_ctx_t *ctx);

/* dial.c */
int mep__tcp_dial(tcp_ctx_t *ctx, tcp_peer_t *p, const mep__tcp_addr_t *a,
                  int64_t deadline);

/* send.c */
int mep__tcp_write(mep_tp_ep_t *ep, mep_tp_mr_t *mr, uint64_t loff,
                   mep_tp_rmr_t *rmr, uint64_t roff, uint64_t len,
                   uint64_t token);
int mep__tcp_signal(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr, uint64_t roff,
                    uint64_t value, mep_signal_op_t op);
void mep__tcp_on_writable(tcp_sock_t *s);
/* Sends the deferred writes of every peer (poll thread). */
void mep__tcp_flush_lazy(tcp_ctx_t *ctx);
/* peer->mu held: sends p's deferred writes. */
void mep__tcp_flush_lazy_peer(tcp_peer_t *p);
/* peer->mu held: fails every queue of p but those the sender thread is
 * sending (it drops them itself when it finds p dead). */
void mep__tcp_drop_queues(tcp_peer_t *p, int status, int report);
/* peer->mu held: fails s's queued messages; report: their completions. */
void mep__tcp_drop_sock(tcp_sock_t *s, int status, int report);
/* peer->mu held, for the sender thread: s's queue as an iovec (the
 * count), the first n bytes of it sent, the socket broken by errno err. */
struct iovec;
int mep__tcp_gather(const tcp_sock_t *s, struct iovec *iov);
void mep__tcp_advance(tcp_sock_t *s, uint64_t n);
void mep__tcp_broke(tcp_sock_t *s, int err);

/* pool.c */
/* init: the pool of direction dir (TCP_TX, TCP_RX) whose threads run
 * step; its locks, no threads yet. */
void mep__tcp_pool_init(tcp_pool_t *pool, tcp_ctx_t *ctx, int dir,
                        int (*step)(tcp_sock_t *s, int *fd));
/* Starts n threads. */
int mep__tcp_pool_start(tcp_pool_t *pool, int n);
/* fini, before the peers are freed: stops the threads. */
void mep__tcp_pool_stop(tcp_pool_t *pool);
/* How many threads a [tcp] *_thread choice and count ask for (0: none):
 * where the process may run on 4 CPUs or more, with 3 ranks or more or 2
 * sockets per peer or more, one per socket of a peer, at most one per 4
 * CPUs (sender.c says why). */
int mep__tcp_pool_size(const tcp_ctx_t *ctx, int choice, int count);
/* peer->mu held (or pool->mu): 1 when s is the pool's (not NONE). */
int mep__tcp_pool_owned(const tcp_pool_t *pool, const tcp_sock_t *s);
/* peer->mu held: hands s over to its thread. */
void mep__tcp_pool_handoff(tcp_pool_t *pool, tcp_sock_t *s);
/* The pool's thread, done with s: gives it back (NONE), or lists it as
 * done for the poll thread (DONE). The sender threads hold peer->mu. */
void mep__tcp_pool_give_back(tcp_pool_t *pool, tcp_sock_t *s);
/* Poll thread: the next socket listed as done, off the list (still DONE),
 * or NULL. */
tcp_sock_t *mep__tcp_pool_next_done(tcp_pool_t *pool);
/* peer->mu held: takes s back (NONE) unless its thread works on it now:
 * then 1, and it stays the thread's. */
int mep__tcp_pool_detach(tcp_pool_t *pool, tcp_sock_t *s);
/* peer->mu held: 1 when the pool's threads may use an fd of p. */
int mep__tcp_pool_busy(const tcp_pool_t *pool, const tcp_peer_t *p);
/* p dead, its mu not held: returns once the pool holds nothing of p, so
 * p's fds may be closed and its queues freed. */
void mep__tcp_pool_quiesce(tcp_pool_t *pool, tcp_peer_t *p);

/* sender.c */
/* init: starts the sender threads if [tcp] send_thread asks for them. */
int mep__tcp_tx_start(tcp_ctx_t *ctx);
/* peer->mu held: 1 when s's queue should go to its sender thread (there
 * are some, and the queue holds something a healthy socket can send). */
int mep__tcp_tx_wants(const tcp_sock_t *s);

/* receiver.c */
/* init: starts the receiver threads if [tcp] recv_thread asks for them. */
int mep__tcp_rx_start(tcp_ctx_t *ctx);
/* Poll thread: hands the rest of s's payload to its receiver thread when
 * there is one and the rest is long; 1 if it did. */
int mep__tcp_rx_handoff(tcp_sock_t *s);
/* Poll thread: a socket of a live peer whose payload a receiver thread
 * finished (its rx_res says how), taken back and watched again; those of
 * dead peers are only taken back. NULL when none is left. */
tcp_sock_t *mep__tcp_rx_take_back(tcp_ctx_t *ctx);

/* fork.c */
/* init, last: from now on a child forked from this process lets go of
 * ctx's sockets. */
int mep__tcp_fork_watch(tcp_ctx_t *ctx);
/* fini, first (and harmless for a ctx never watched). */
void mep__tcp_fork_unwatch(tcp_ctx_t *ctx);

/* bye.c */
int mep__tcp_close(mep_tp_ep_t *ep);

/* recv.c */
void mep__tcp_on_readable(tcp_sock_t *s);
/* Poll thread, on the receiver threads' eventfd: goes on with the sockets
 * whose payloads they finished. */
void mep__tcp_on_rx_done(tcp_ctx_t *ctx);
/* Reads the next bytes of s's payload into its region: from the
 * read-ahead buffer, else from fd. recv's answer, or -2 when the region
 * was deregistered. */
ssize_t mep__tcp_read_payload(tcp_sock_t *s, int fd);

/* region.c */
int mep__tcp_reg(mep_tp_ctx_t *ctx, void *ptr, size_t len, mep_memkind_t kind,
                 mep_tp_mr_t **mr, void *rkey, size_t *rkey_len);
int mep__tcp_dereg(mep_tp_ctx_t *ctx, mep_tp_mr_t *mr);
int mep__tcp_import(mep_tp_ep_t *ep, const void *rkey, size_t len,
                    mep_tp_rmr_t **rmr);
int mep__tcp_unimport(mep_tp_ep_t *ep, mep_tp_rmr_t *rmr);
/* rx_lock held: the live region with this id, or NULL. */
tcp_mr_t *mep__tcp_region_find(tcp_ctx_t *ctx, uint32_t id);
int mep__tcp_region_len(void *ctx, uint32_t id, uint64_t *len);
void mep__tcp_regions_free(tcp_ctx_t *ctx);

#endif
