/* store_tcp.c - the built-in TCP store server: one background thread runs
 * epoll over the listening socket, an eventfd that stop() writes, and any
 * number of client connections; keys live in a chained hash map.
 *
 * Each connection handles one request at a time: it reads a request,
 * answers it (or parks, for a GET of an absent key) and only then reads
 * the next one, so replies stay in order and a client cannot make the
 * server queue unbounded replies. Values are reference-counted so a GET
 * reply streams the stored bytes without copying them, even if a SET
 * replaces them meanwhile.
 *
 * A child forked from the server's process (a DataLoader worker of rank
 * 0) lets go of the listener and the connections (fork handlers below):
 * otherwise, should the process die, its clients would see their
 * connections stay up as long as the child lives, and wait out their
 * deadlines instead of failing at once. */
#include "error.h"
#include "fork_watch.h"
#include "log.h"
#include "store_proto.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* Bytes one connection may read per wake-up before others get a turn. */
#define READ_BUDGET (16u << 20)
/* How long the listener rests after running out of file descriptors. */
#define ACCEPT_PAUSE_MS 100

typedef struct blob {
  size_t refs;
  size_t len;
  uint8_t data[];
} blob_t;

typedef struct conn conn_t;

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  blob_t *val;      /* NULL: not set yet; the entry only holds waiters */
  conn_t *waiters;  /* connections parked in a GET of this key */
  uint32_t key_len;
  uint8_t key[];
} entry_t;

typedef struct map {
  entry_t **buckets;
  size_t nbuckets; /* a power of two */
  size_t count;
} map_t;

typedef enum {
  RD_HDR,  /* reading a header */
  RD_KEY,  /* reading the key */
  RD_VAL,  /* reading the value */
  RD_SKIP, /* dropping the body of a refused request */
  PARKED,  /* GET waiting for its key */
  WRITING, /* sending a reply */
  CLOSED,  /* closed; freed at the end of the event batch */
} conn_state_t;

struct conn {
  int fd;
  conn_state_t state;
  uint32_t events;
  conn_t *prev, *next; /* the server's list of live connections */
  char peer[80];
  /* the request being read */
  uint8_t hdr_buf[MEP__STORE_HDR_LEN];
  size_t hdr_have;
  mep__store_hdr_t hdr;
  uint8_t *key;
  blob_t *val;
  uint8_t delta[8];
  uint8_t *rd_ptr;
  size_t rd_left;
  uint64_t skip_left;
  int skip_code; /* the error to answer once the body is skipped */
  char skip_msg[160];
  /* a parked GET */
  entry_t *wait_entry;
  conn_t *wait_prev, *wait_next;
  /* the reply being written: out[] then out_blob */
  uint8_t out[MEP__STORE_HDR_LEN + 4 + MEP__STORE_ERRMSG_MAX];
  size_t out_len, out_off;
  blob_t *out_blob;
  size_t blob_off;
};

struct mep_store_server {
  int listen_fd, wake_fd, ep_fd;
  int port;
  pthread_t thread;
  /* Held where a connection's fd is set or closed and the list changes,
   * and by the fork handlers, so that a child finds them consistent. */
  pthread_mutex_t fork_mu;
  mep__fork_watch_t fork;
  conn_t *conns;
  conn_t *dead; /* closed during the current batch, freed after it */
  map_t map;
  int64_t accept_resume_ms; /* 0: listener armed */
  char tag_listen, tag_wake; /* epoll cookies (their addresses) */
};

/* ------------------------------------------------------------ helpers */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static blob_t *blob_new(size_t len) {
  blob_t *b = malloc(sizeof *b + len);
  if (!b) return NULL;
  b->refs = 1;
  b->len = len;
  return b;
}

static void blob_unref(blob_t *b) {
  if (b && --b->refs == 0) free(b);
}

static void addr_text(const struct sockaddr *sa, socklen_t len, char *buf,
                      size_t size) {
  char host[INET6_ADDRSTRLEN + 1], serv[16];
  if (getnameinfo(sa, len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    snprintf(buf, size, "an unknown address");
    return;
  }
  if (sa->sa_family == AF_INET6)
    snprintf(buf, size, "[%s]:%s", host, serv);
  else
    snprintf(buf, size, "%s:%s", host, serv);
}

/* ---------------------------------------------------------------- map */

static uint64_t key_hash(const uint8_t *key, size_t len) {
  uint64_t h = 14695981039346656037ULL;
  for (size_t i = 0; i < len; i++) {
    h ^= key[i];
    h *= 1099511628211ULL;
  }
  return h;
}

static entry_t *map_find(const map_t *m, const uint8_t *key, size_t len) {
  if (!m->nbuckets) return NULL;
  uint64_t h = key_hash(key, len);
  for (entry_t *e = m->buckets[h & (m->nbuckets - 1)]; e; e = e->next)
    if (e->hash == h && e->key_len == len && !memcmp(e->key, key, len))
      return e;
  return NULL;
}

static int map_grow(map_t *m) {
  size_t n = m->nbuckets ? m->nbuckets * 2 : 64;
  entry_t **b = calloc(n, sizeof *b);
  if (!b) return -1;
  for (size_t i = 0; i < m->nbuckets; i++) {
    for (entry_t *e = m->buckets[i], *next; e; e = next) {
      next = e->next;
      e->next = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
    }
  }
  free(m->buckets);
  m->buckets = b;
  m->nbuckets = n;
  return 0;
}

/* The entry of `key`, created empty when absent; NULL when out of memory. */
static entry_t *map_lookup(map_t *m, const uint8_t *key, size_t len) {
  entry_t *e = map_find(m, key, len);
  if (e) return e;
  if (m->count >= m->nbuckets && map_grow(m) != 0) return NULL;
  e = calloc(1, sizeof *e + len);
  if (!e) return NULL;
  e->hash = key_hash(key, len);
  e->key_len = (uint32_t)len;
  memcpy(e->key, key, len);
  entry_t **head = &m->buckets[e->hash & (m->nbuckets - 1)];
  e->next = *head;
  *head = e;
  m->count++;
  return e;
}

static void map_remove(map_t *m, entry_t *e) {
  entry_t **p = &m->buckets[e->hash & (m->nbuckets - 1)];
  while (*p != e) p = &(*p)->next;
  *p = e->next;
  m->count--;
  blob_unref(e->val);
  free(e);
}

static void map_free(map_t *m) {
  for (size_t i = 0; i < m->nbuckets; i++) {
    for (entry_t *e = m->buckets[i], *next; e; e = next) {
      next = e->next;
      blob_unref(e->val);
      free(e);
    }
  }
  free(m->buckets);
  memset(m, 0, sizeof *m);
}

/* -------------------------------------------------------- connections */

static void conn_close(mep_store_server_t *srv, conn_t *c);

static void set_events(mep_store_server_t *srv, conn_t *c, uint32_t ev) {
  if (c->events == ev) return;
  struct epoll_event e = {.events = ev, .data.ptr = c};
  if (epoll_ctl(srv->ep_fd, EPOLL_CTL_MOD, c->fd, &e) == 0) {
    c->events = ev;
    return;
  }
  mep__warn("store: server dropping client %s: cannot watch it: %s",
            c->peer, strerror(errno));
  conn_close(srv, c);
}

static void unpark(mep_store_server_t *srv, conn_t *c) {
  entry_t *e = c->wait_entry;
  if (!e) return;
  if (c->wait_prev) c->wait_prev->wait_next = c->wait_next;
  else e->waiters = c->wait_next;
  if (c->wait_next) c->wait_next->wait_prev = c->wait_prev;
  c->wait_entry = NULL;
  c->wait_prev = c->wait_next = NULL;
  /* A key nobody set and nobody waits for any more leaves no trace. */
  if (!e->val && !e->waiters) map_remove(&srv->map, e);
}

static void request_reset(conn_t *c) {
  free(c->key);
  c->key = NULL;
  blob_unref(c->val);
  c->val = NULL;
  c->hdr_have = 0;
  c->state = RD_HDR;
}

/* Closes now, frees after the event batch: a later event of the same batch
 * may still name this connection. */
static void conn_close(mep_store_server_t *srv, conn_t *c) {
  if (c->state == CLOSED) return;
  unpark(srv, c);
  request_reset(c);
  blob_unref(c->out_blob);
  c->out_blob = NULL;
  epoll_ctl(srv->ep_fd, EPOLL_CTL_DEL, c->fd, NULL);
  pthread_mutex_lock(&srv->fork_mu);
  close(c->fd);
  c->fd = -1;
  c->state = CLOSED;
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  pthread_mutex_unlock(&srv->fork_mu);
  c->next = srv->dead;
  c->prev = NULL;
  srv->dead = c;
}

static void free_dead(mep_store_server_t *srv) {
  for (conn_t *c = srv->dead, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  srv->dead = NULL;
}

/* ------------------------------------------------------------- replies */

static void reply_flush(mep_store_server_t *srv, conn_t *c) {
  for (;;) {
    struct iovec iov[2];
    int n = 0;
    if (c->out_off < c->out_len)
      iov[n++] = (struct iovec){c->out + c->out_off, c->out_len - c->out_off};
    if (c->out_blob && c->blob_off < c->out_blob->len)
      iov[n++] = (struct iovec){c->out_blob->data + c->blob_off,
                                c->out_blob->len - c->blob_off};
    if (n == 0) break;
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      set_events(srv, c, EPOLLOUT);
      return;
    }
    if (w < 0) {
      mep__debug("store: server dropping client %s: send failed: %s",
                 c->peer, strerror(errno));
      conn_close(srv, c);
      return;
    }
    size_t done = (size_t)w, head = c->out_len - c->out_off;
    if (done <= head) {
      c->out_off += done;
    } else {
      c->out_off = c->out_len;
      c->blob_off += done - head;
    }
  }
  blob_unref(c->out_blob);
  c->out_blob = NULL;
  request_reset(c);
  set_events(srv, c, EPOLLIN);
}

/* Starts the reply to the current request: `small` bytes copied after the
 * header, then `blob` (a new reference is taken). */
static void reply(mep_store_server_t *srv, conn_t *c, uint8_t op,
                  const void *small, size_t small_len, blob_t *blob) {
  mep__store_hdr_t h = {.op = op, .seq = c->hdr.seq,
                        .val_len = small_len + (blob ? blob->len : 0)};
  mep__store_encode_header(c->out, &h);
  if (small_len) memcpy(c->out + MEP__STORE_HDR_LEN, small, small_len);
  c->out_len = MEP__STORE_HDR_LEN + small_len;
  c->out_off = 0;
  if (blob) blob->refs++;
  c->out_blob = blob;
  c->blob_off = 0;
  c->state = WRITING;
  reply_flush(srv, c);
}

static void reply_err(mep_store_server_t *srv, conn_t *c, int code,
                      const char *fmt, ...) MEP_PRINTF(4, 5);

static void reply_err(mep_store_server_t *srv, conn_t *c, int code,
                      const char *fmt, ...) {
  uint8_t body[4 + MEP__STORE_ERRMSG_MAX + 1];
  mep__store_put_u32(body, (uint32_t)code);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf((char *)body + 4, MEP__STORE_ERRMSG_MAX + 1, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if (n > MEP__STORE_ERRMSG_MAX) n = MEP__STORE_ERRMSG_MAX;
  reply(srv, c, MEP__STORE_ERR, body, 4 + (size_t)n, NULL);
}

/* ------------------------------------------------------------ requests */

/* Answers every GET parked on `e`, whose value just appeared. */
static void wake_waiters(mep_store_server_t *srv, entry_t *e) {
  conn_t *w = e->waiters;
  e->waiters = NULL;
  while (w) {
    conn_t *next = w->wait_next;
    w->wait_entry = NULL;
    w->wait_prev = w->wait_next = NULL;
    reply(srv, w, MEP__STORE_OK, NULL, 0, e->val);
    w = next;
  }
}

static void store_value(mep_store_server_t *srv, entry_t *e, blob_t *val) {
  blob_unref(e->val);
  e->val = val;
  wake_waiters(srv, e);
}

static void do_set(mep_store_server_t *srv, conn_t *c) {
  entry_t *e = map_lookup(&srv->map, c->key, c->hdr.key_len);
  if (!e) {
    reply_err(srv, c, MEP_ERR_NOMEM, "the server is out of memory");
    return;
  }
  blob_t *val = c->val;
  c->val = NULL;
  store_value(srv, e, val);
  reply(srv, c, MEP__STORE_OK, NULL, 0, NULL);
}

static void do_get(mep_store_server_t *srv, conn_t *c) {
  entry_t *e = map_find(&srv->map, c->key, c->hdr.key_len);
  if (e && e->val) {
    reply(srv, c, MEP__STORE_OK, NULL, 0, e->val);
    return;
  }
  if (c->hdr.flags & MEP__STORE_NOWAIT) {
    reply_err(srv, c, MEP_ERR_TIMEOUT, "the key is not set");
    return;
  }
  e = map_lookup(&srv->map, c->key, c->hdr.key_len);
  if (!e) {
    reply_err(srv, c, MEP_ERR_NOMEM, "the server is out of memory");
    return;
  }
  c->wait_entry = e;
  c->wait_next = e->waiters;
  if (e->waiters) e->waiters->wait_prev = c;
  e->waiters = c;
  c->state = PARKED;
  /* Only the client going away matters while parked; reading on would
   * let it queue requests behind the parked one. */
  set_events(srv, c, EPOLLRDHUP);
}

static void do_add(mep_store_server_t *srv, conn_t *c) {
  entry_t *e = map_find(&srv->map, c->key, c->hdr.key_len);
  int64_t cur = 0, delta = (int64_t)mep__store_get_u64(c->delta);
  if (e && e->val && mep__store_parse_i64(e->val->data, e->val->len, &cur)) {
    reply_err(srv, c, MEP_ERR_INVALID,
              "its value (%zu bytes) is not a decimal integer", e->val->len);
    return;
  }
  if ((delta > 0 && cur > INT64_MAX - delta) ||
      (delta < 0 && cur < INT64_MIN - delta)) {
    reply_err(srv, c, MEP_ERR_INVALID,
              "adding %lld to %lld overflows a 64-bit integer",
              (long long)delta, (long long)cur);
    return;
  }
  int64_t sum = cur + delta;
  char text[24];
  size_t n = mep__store_format_i64(sum, text);
  blob_t *val = blob_new(n);
  if (!e) e = map_lookup(&srv->map, c->key, c->hdr.key_len);
  if (!val || !e) {
    blob_unref(val);
    reply_err(srv, c, MEP_ERR_NOMEM, "the server is out of memory");
    return;
  }
  memcpy(val->data, text, n);
  store_value(srv, e, val);
  uint8_t out[8];
  mep__store_put_u64(out, (uint64_t)sum);
  reply(srv, c, MEP__STORE_OK, out, sizeof out, NULL);
}

static void do_check(mep_store_server_t *srv, conn_t *c) {
  entry_t *e = map_find(&srv->map, c->key, c->hdr.key_len);
  uint8_t exists = e && e->val;
  reply(srv, c, MEP__STORE_OK, &exists, 1, NULL);
}

static void execute(mep_store_server_t *srv, conn_t *c) {
  switch (c->hdr.op) {
  case MEP__STORE_SET: do_set(srv, c); break;
  case MEP__STORE_GET: do_get(srv, c); break;
  case MEP__STORE_ADD: do_add(srv, c); break;
  default: do_check(srv, c); break;
  }
}

/* ------------------------------------------------------------- reading */

static void start_skip(conn_t *c, int code, const char *fmt, ...)
    MEP_PRINTF(3, 4);

static void start_skip(conn_t *c, int code, const char *fmt, ...) {
  uint64_t k = c->hdr.key_len, v = c->hdr.val_len;
  c->skip_left = v > UINT64_MAX - k ? UINT64_MAX : k + v;
  c->skip_code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->skip_msg, sizeof c->skip_msg, fmt, ap);
  va_end(ap);
  free(c->key);
  c->key = NULL;
  blob_unref(c->val);
  c->val = NULL;
  c->state = RD_SKIP;
}

static void header_done(conn_t *c) {
  const mep__store_hdr_t *h = &c->hdr;
  c->key = malloc(h->key_len);
  if (h->op == MEP__STORE_SET) c->val = blob_new((size_t)h->val_len);
  if (!c->key || (h->op == MEP__STORE_SET && !c->val)) {
    start_skip(c, MEP_ERR_NOMEM, "the server cannot allocate %llu bytes",
               (unsigned long long)(h->key_len + h->val_len));
    return;
  }
  c->rd_ptr = c->key;
  c->rd_left = h->key_len;
  c->state = RD_KEY;
}

/* Moves on after a piece of the request arrived. */
static void advance(mep_store_server_t *srv, conn_t *c) {
  if (c->state == RD_HDR) {
    const char *why = "";
    switch (mep__store_decode_header(c->hdr_buf, c->hdr_have,
                                     MEP__STORE_REQUEST, &c->hdr, &why)) {
    case MEP__STORE_NEED_MORE: return;
    case MEP__STORE_MALFORMED:
      mep__warn("store: server dropping client %s: malformed request: %s",
                c->peer, why);
      conn_close(srv, c);
      return;
    case MEP__STORE_TOO_LARGE:
      start_skip(c, MEP_ERR_INVALID,
                 "a key of %lu bytes or a value of %llu bytes is over the "
                 "limits (%d and %llu bytes)",
                 (unsigned long)c->hdr.key_len,
                 (unsigned long long)c->hdr.val_len, MEP__STORE_KEY_MAX,
                 (unsigned long long)MEP__STORE_VAL_MAX);
      return;
    case MEP__STORE_FRAME_OK: header_done(c); return;
    }
  }
  if (c->state == RD_SKIP) {
    if (c->skip_left == 0)
      reply_err(srv, c, c->skip_code, "%s", c->skip_msg);
    return;
  }
  if (c->rd_left) return;
  if (c->state == RD_KEY && c->hdr.val_len) {
    c->rd_ptr = c->val ? c->val->data : c->delta;
    c->rd_left = (size_t)c->hdr.val_len;
    c->state = RD_VAL;
    return;
  }
  execute(srv, c);
}

static void read_some(mep_store_server_t *srv, conn_t *c) {
  uint8_t sink[4096];
  size_t budget = READ_BUDGET;
  while (budget > 0 && (c->state == RD_HDR || c->state == RD_KEY ||
                        c->state == RD_VAL || c->state == RD_SKIP)) {
    uint8_t *p;
    size_t want;
    if (c->state == RD_HDR) {
      p = c->hdr_buf + c->hdr_have;
      want = MEP__STORE_HDR_LEN - c->hdr_have;
    } else if (c->state == RD_SKIP) {
      p = sink;
      want = c->skip_left < sizeof sink ? (size_t)c->skip_left : sizeof sink;
    } else {
      p = c->rd_ptr;
      want = c->rd_left;
    }
    ssize_t r = recv(c->fd, p, want, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (r <= 0) {
      if (r < 0 || c->state != RD_HDR || c->hdr_have)
        mep__debug("store: server lost client %s mid-request: %s", c->peer,
                   r < 0 ? strerror(errno) : "end of stream");
      conn_close(srv, c);
      return;
    }
    size_t got = (size_t)r;
    budget -= got < budget ? got : budget;
    if (c->state == RD_HDR) c->hdr_have += got;
    else if (c->state == RD_SKIP) c->skip_left -= got;
    else c->rd_ptr += got, c->rd_left -= got;
    advance(srv, c);
  }
}

static void conn_event(mep_store_server_t *srv, conn_t *c, uint32_t ev) {
  if (c->state == CLOSED) return;
  if (ev & (EPOLLERR | EPOLLHUP) ||
      (c->state == PARKED && (ev & EPOLLRDHUP))) {
    mep__debug("store: server closing client %s: it hung up", c->peer);
    conn_close(srv, c);
  } else if (c->state == WRITING && (ev & EPOLLOUT)) {
    reply_flush(srv, c);
  } else if (ev & EPOLLIN) {
    read_some(srv, c);
  }
}

/* ------------------------------------------------------------ accepting */

static void accept_one(mep_store_server_t *srv, int fd,
                       const struct sockaddr_storage *sa, socklen_t len) {
  conn_t *c = calloc(1, sizeof *c);
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
  if (!c || epoll_ctl(srv->ep_fd, EPOLL_CTL_ADD, fd, &e) != 0) {
    mep__warn("store: server refusing a client: %s",
              c ? strerror(errno) : "out of memory");
    free(c);
    close(fd);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->events = EPOLLIN;
  c->state = RD_HDR;
  addr_text((const struct sockaddr *)sa, len, c->peer, sizeof c->peer);
  pthread_mutex_lock(&srv->fork_mu);
  c->fd = fd;
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  pthread_mutex_unlock(&srv->fork_mu);
  mep__debug("store: server accepted client %s", c->peer);
}

static void listener_arm(mep_store_server_t *srv, uint32_t ev) {
  struct epoll_event e = {.events = ev, .data.ptr = &srv->tag_listen};
  epoll_ctl(srv->ep_fd, EPOLL_CTL_MOD, srv->listen_fd, &e);
}

static void accept_all(mep_store_server_t *srv) {
  for (;;) {
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    int fd = accept4(srv->listen_fd, (struct sockaddr *)&sa, &len,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      accept_one(srv, fd, &sa, len);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    /* Out of descriptors: the pending connection stays readable, so
     * rest the listener instead of spinning on it. */
    mep__warn("store: server on port %d cannot accept clients: %s; "
              "retrying in %d ms", srv->port, strerror(errno),
              ACCEPT_PAUSE_MS);
    listener_arm(srv, 0);
    srv->accept_resume_ms = now_ms() + ACCEPT_PAUSE_MS;
    return;
  }
}

/* --------------------------------------------------------------- thread */

static void *serve(void *arg) {
  mep_store_server_t *srv = arg;
  struct epoll_event evs[64];
  for (;;) {
    int timeout = -1;
    if (srv->accept_resume_ms) {
      int64_t left = srv->accept_resume_ms - now_ms();
      if (left <= 0) {
        srv->accept_resume_ms = 0;
        listener_arm(srv, EPOLLIN);
      } else {
        timeout = (int)left;
      }
    }
    int n = epoll_wait(srv->ep_fd, evs, 64, timeout);
    if (n < 0 && errno != EINTR) {
      mep__error("store: server on port %d stops: epoll_wait failed: %s",
                 srv->port, strerror(errno));
      return NULL;
    }
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &srv->tag_wake) return NULL;
      if (p == &srv->tag_listen) accept_all(srv);
      else conn_event(srv, p, evs[i].events);
    }
    free_dead(srv);
  }
}

/* ------------------------------------------------------------ lifecycle */

static int bind_listen(int family, const struct sockaddr *sa, socklen_t len,
                       int *err) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  /* Without a host, one IPv6 socket serves IPv4 clients too. */
  if (family == AF_INET6)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  if (bind(fd, sa, len) != 0 || listen(fd, SOMAXCONN) != 0) {
    *err = errno;
    close(fd);
    return -1;
  }
  return fd;
}

static int open_listener(const char *host, int port, int *fd_out) {
  int err = 0, fd = -1;
  if (!host) {
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6,
                              .sin6_port = htons((uint16_t)port),
                              .sin6_addr = IN6ADDR_ANY_INIT};
    fd = bind_listen(AF_INET6, (struct sockaddr *)&a6, sizeof a6, &err);
    if (fd < 0) {
      struct sockaddr_in a4 = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_ANY)};
      fd = bind_listen(AF_INET, (struct sockaddr *)&a4, sizeof a4, &err);
    }
  } else {
    char serv[16];
    snprintf(serv, sizeof serv, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, serv, &hints, &res);
    if (rc != 0)
      return mep__err(MEP_ERR_INVALID,
                      "store: server cannot resolve host '%s': %s", host,
                      gai_strerror(rc));
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
      fd = bind_listen(ai->ai_family, ai->ai_addr, ai->ai_addrlen, &err);
    freeaddrinfo(res);
  }
  if (fd < 0)
    return mep__err_errno(MEP_ERR_SYSTEM, err,
                          "store: server cannot listen on %s port %d",
                          host ? host : "all interfaces", port);
  *fd_out = fd;
  return MEP_OK;
}

static int local_port(int fd) {
  struct sockaddr_storage sa;
  socklen_t len = sizeof sa;
  if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0) return -1;
  if (sa.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
  return ntohs(((struct sockaddr_in *)&sa)->sin_port);
}

/* ---------------------------------------------------------------- fork */

/* In a forked child (fork_watch.h), fork_mu held: the listener and every
 * connection. */
static void let_go_all(void *arg, int dead) {
  const mep_store_server_t *srv = arg;
  mep__fork_let_go(srv->listen_fd, dead);
  for (const conn_t *c = srv->conns; c; c = c->next)
    mep__fork_let_go(c->fd, dead);
}

static int fork_watch(mep_store_server_t *srv) {
  srv->fork = (mep__fork_watch_t){.locks = {&srv->fork_mu},
                                  .let_go_all = let_go_all,
                                  .arg = srv};
  if (mep__fork_watch(&srv->fork))
    return mep__err(MEP_ERR_SYSTEM, "store: server start: installing the "
                    "fork handlers failed");
  return MEP_OK;
}

/* ------------------------------------------------------- start and stop */

static void server_free(mep_store_server_t *srv) {
  mep__fork_unwatch(&srv->fork);
  while (srv->conns) conn_close(srv, srv->conns);
  free_dead(srv);
  map_free(&srv->map);
  if (srv->ep_fd >= 0) close(srv->ep_fd);
  if (srv->wake_fd >= 0) close(srv->wake_fd);
  if (srv->listen_fd >= 0) close(srv->listen_fd);
  pthread_mutex_destroy(&srv->fork_mu);
  free(srv);
}

static int watch(mep_store_server_t *srv, int fd, void *tag) {
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = tag};
  return epoll_ctl(srv->ep_fd, EPOLL_CTL_ADD, fd, &e);
}

int mep_store_server_start(const char *host, int port,
                           mep_store_server_t **out) {
  if (!out || port < 0 || port > 65535)
    return mep__err(MEP_ERR_INVALID,
                    "store: server start: port %d is not in 0..65535 or "
                    "out is NULL", port);
  *out = NULL;
  mep_store_server_t *srv = calloc(1, sizeof *srv);
  if (!srv) return mep__err(MEP_ERR_NOMEM, "store: server start: no memory");
  srv->listen_fd = srv->wake_fd = srv->ep_fd = -1;
  pthread_mutex_init(&srv->fork_mu, NULL);
  int rc = open_listener(host, port, &srv->listen_fd);
  if (rc != MEP_OK) {
    server_free(srv);
    return rc;
  }
  srv->port = local_port(srv->listen_fd);
  srv->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  srv->ep_fd = epoll_create1(EPOLL_CLOEXEC);
  if (srv->wake_fd < 0 || srv->ep_fd < 0 || srv->port < 0 ||
      watch(srv, srv->listen_fd, &srv->tag_listen) != 0 ||
      watch(srv, srv->wake_fd, &srv->tag_wake) != 0) {
    rc = mep__err_errno(MEP_ERR_SYSTEM, errno,
                        "store: server on port %d cannot set up its event "
                        "loop", srv->port);
    server_free(srv);
    return rc;
  }
  if ((rc = fork_watch(srv)) != MEP_OK) {
    server_free(srv);
    return rc;
  }
  int err = pthread_create(&srv->thread, NULL, serve, srv);
  if (err != 0) {
    server_free(srv);
    return mep__err_errno(MEP_ERR_SYSTEM, err,
                          "store: server cannot start its thread");
  }
  mep__debug("store: server listening on %s port %d",
             host ? host : "all interfaces", srv->port);
  *out = srv;
  return MEP_OK;
}

int mep_store_server_port(const mep_store_server_t *srv) {
  return srv ? srv->port : MEP_ERR_INVALID;
}

void mep_store_server_stop(mep_store_server_t *srv) {
  if (!srv) return;
  uint64_t one = 1;
  while (write(srv->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
  pthread_join(srv->thread, NULL);
  server_free(srv);
}
