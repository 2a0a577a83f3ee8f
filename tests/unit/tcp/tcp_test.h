/* tcp_test.h - what the tcp plugin's multi-process tests share: loading
 * the plugin through libmep's host helpers, framed messages over a
 * socketpair, deterministic data, deadlines. */
#ifndef MEP_TEST_TCP_TEST_H
#define MEP_TEST_TCP_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mep/transport.h"

#define TT_FAIL(...)                                                          \
  do {                                                                        \
    fprintf(stderr, "FAIL [pid %d] %s:%d: ", (int)getpid(), __FILE__,         \
            __LINE__);                                                        \
    fprintf(stderr, __VA_ARGS__);                                             \
    fprintf(stderr, "\n");                                                    \
    exit(1);                                                                  \
  } while (0)
#define TT_CHECK(cond, ...)                                                   \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "(%s) ", #cond);                                        \
      TT_FAIL(__VA_ARGS__);                                                   \
    }                                                                         \
  } while (0)
#define TT_OK(call)                                                           \
  do {                                                                        \
    int tt_rc_ = (call);                                                      \
    if (tt_rc_)                                                               \
      TT_FAIL("%s returned %d: %s", #call, tt_rc_, mep_last_error());         \
  } while (0)

typedef struct tt_host {
  mep_plugin_t *plugin;
  const mep_transport_t *vt;
  mep_tp_env_t env;
  mep_tp_ctx_t *ctx;
  /* the host's [tcp] section, with the test's overrides on top */
  const void *base_cfg;
  const char *(*base_get)(const void *cfg, const char *key);
  char nsock[8];
  const char *ifname; /* NULL: the plugin's default choice */
  const char *extra_key, *extra_val; /* one more [tcp] key, or NULL */
} tt_host_t;

/* Loads the tcp plugin (or the one MEP_TT_PLUGIN names, for a test that
 * holds for every plugin) and creates a context of `rank` in `size`.
 * Exits with status 77 (skip) when the plugin cannot be found. */
void tt_open(tt_host_t *h, int rank, int size, const uint8_t *secret,
             size_t secret_len, int nsock, const char *ifname,
             int timeout_ms);
void tt_close(tt_host_t *h);
/* Like tt_open (1 socket per peer, ifname lo, no secret) with
 * [tcp] key = val, but returns what init returned; h->ctx is NULL on
 * failure. tt_close releases either way. */
int tt_try_open(tt_host_t *h, const char *key, const char *val);

/* The two processes of a pair over the control socket cfd: exchange
 * address blobs, check that `peer` is reachable and connect to it; then
 * register src (slen bytes, *smr) and dst (dlen bytes, *dmr), exchange
 * dst's key and import the peer's (*rmr). Both sides call them in the
 * same order. */
void tt_connect(tt_host_t *h, int cfd, int peer, mep_tp_ep_t **ep);
void tt_regions(tt_host_t *h, int cfd, mep_tp_ep_t *ep, void *src,
                size_t slen, void *dst, size_t dlen, mep_tp_mr_t **smr,
                mep_tp_mr_t **dmr, mep_tp_rmr_t **rmr);

/* Framed messages over a stream socket; the receive waits up to
 * timeout_ms and exits the process on failure. */
void tt_send(int fd, const void *buf, size_t len);
size_t tt_recv(int fd, void *buf, size_t cap, int timeout_ms);

/* Both processes of a pair meet here over the control socket cfd, with
 * pump(arg) called meanwhile so the plugin keeps being polled (a side may
 * still await completions). The other side may start its next phase, and
 * its writes land, before this returns: check data before. */
void tt_barrier(int cfd, void (*pump)(void *arg), void *arg);

double tt_now(void);
/* Open file descriptors of this process (a leak check). */
int tt_count_fds(void);
uint64_t tt_seed(void);
/* Byte j of the data stream named by seed: deterministic, so a receiver
 * regenerates what a sender wrote. */
void tt_fill(uint8_t *dst, uint64_t seed, uint64_t start, size_t len);
/* The first index where dst differs from the stream, or -1. */
long long tt_verify(const uint8_t *dst, uint64_t seed, uint64_t start,
                    size_t len);

/* Waits for the child to exit within timeout_ms (killing it after) and
 * returns its wait status. */
int tt_reap(pid_t pid, int timeout_ms);

#endif
