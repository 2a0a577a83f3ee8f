/* tcp_test.c - helpers of the tcp plugin's multi-process tests. */
#include "tcp_test.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *cfg_get(const void *cfg, const char *key) {
  const tt_host_t *h = cfg;
  if (h->extra_key && !strcmp(key, h->extra_key)) return h->extra_val;
  if (!strcmp(key, "sockets_per_peer")) return h->nsock;
  if (!strcmp(key, "ifname") && h->ifname) return h->ifname;
  return h->base_get ? h->base_get(h->base_cfg, key) : NULL;
}

static int start(tt_host_t *h, int rank, int size, const uint8_t *secret,
                 size_t secret_len, int nsock, const char *ifname,
                 int timeout_ms) {
  const char *name = getenv("MEP_TT_PLUGIN");
  if (!name || !*name) name = "tcp";
  int rc = mep_plugin_find(name, &h->plugin);
  if (rc) {
    printf("SKIP: the %s plugin is not found: %s\n", name, mep_last_error());
    exit(77);
  }
  h->vt = mep_plugin_vtable(h->plugin);
  TT_OK(mep_plugin_env_open(&h->env, NULL, h->plugin));
  h->env.rank = rank;
  h->env.size = size;
  h->env.secret = secret;
  h->env.secret_len = secret_len;
  h->env.timeout_ms = timeout_ms;
  snprintf(h->nsock, sizeof h->nsock, "%d", nsock);
  h->ifname = ifname;
  h->base_cfg = h->env.cfg;
  h->base_get = h->env.cfg_get;
  h->env.cfg = h;
  h->env.cfg_get = cfg_get;
  return h->vt->init(&h->env, &h->ctx);
}

void tt_open(tt_host_t *h, int rank, int size, const uint8_t *secret,
             size_t secret_len, int nsock, const char *ifname,
             int timeout_ms) {
  memset(h, 0, sizeof *h);
  TT_OK(start(h, rank, size, secret, secret_len, nsock, ifname, timeout_ms));
}

int tt_try_open(tt_host_t *h, const char *key, const char *val) {
  memset(h, 0, sizeof *h);
  h->extra_key = key;
  h->extra_val = val;
  int rc = start(h, 0, 2, NULL, 0, 1, "lo", 1000);
  if (rc) h->ctx = NULL;
  return rc;
}

void tt_connect(tt_host_t *h, int cfd, int peer, mep_tp_ep_t **ep) {
  uint8_t blob[MEP_TP_MAX_ADDR];
  size_t n = sizeof blob;
  TT_OK(h->vt->address(h->ctx, blob, &n));
  tt_send(cfd, blob, n);
  n = tt_recv(cfd, blob, sizeof blob, 30000);
  char why[128] = "";
  TT_CHECK(h->vt->reachable(h->ctx, peer, blob, n, why, sizeof why) == 1,
           "rank %d unreachable: %s", peer, why);
  TT_OK(h->vt->connect(h->ctx, peer, blob, n, ep));
}

void tt_regions(tt_host_t *h, int cfd, mep_tp_ep_t *ep, void *src,
                size_t slen, void *dst, size_t dlen, mep_tp_mr_t **smr,
                mep_tp_mr_t **dmr, mep_tp_rmr_t **rmr) {
  uint8_t rkey[MEP_TP_MAX_RKEY];
  size_t k = sizeof rkey;
  TT_OK(h->vt->reg(h->ctx, src, slen, MEP_MEM_HOST, smr, rkey, &k));
  k = sizeof rkey;
  TT_OK(h->vt->reg(h->ctx, dst, dlen, MEP_MEM_HOST, dmr, rkey, &k));
  tt_send(cfd, rkey, k);
  k = tt_recv(cfd, rkey, sizeof rkey, 30000);
  TT_OK(h->vt->import(ep, rkey, k, rmr));
}

void tt_close(tt_host_t *h) {
  if (h->ctx) TT_OK(h->vt->fini(h->ctx));
  h->ctx = NULL;
  h->env.cfg = h->base_cfg;
  h->env.cfg_get = h->base_get;
  mep_plugin_env_fini(&h->env);
  mep_plugin_close(h->plugin);
}

static void xfer(int fd, void *buf, size_t len, int out, int timeout_ms) {
  uint8_t *p = buf;
  double deadline = tt_now() + timeout_ms / 1000.0;
  while (len) {
    struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
    int left = (int)((deadline - tt_now()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) <= 0) {
      if (left > 0 && errno == EINTR) continue;
      TT_FAIL("control socket: no %s within %d ms", out ? "send" : "message",
              timeout_ms);
    }
    ssize_t n = out ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      TT_FAIL("control socket: %s", n ? strerror(errno) : "the other side "
              "exited");
    }
    p += n;
    len -= (size_t)n;
  }
}

void tt_send(int fd, const void *buf, size_t len) {
  uint64_t n = len;
  xfer(fd, &n, sizeof n, 1, 60000);
  xfer(fd, (void *)(uintptr_t)buf, len, 1, 60000);
}

void tt_barrier(int cfd, void (*pump)(void *arg), void *arg) {
  uint8_t b = 1;
  tt_send(cfd, &b, 1);
  double deadline = tt_now() + 60;
  for (;;) {
    struct pollfd pf = {.fd = cfd, .events = POLLIN};
    if (poll(&pf, 1, 0) > 0) break;
    pump(arg);
    TT_CHECK(tt_now() < deadline, "barrier: the other side never came");
  }
  tt_recv(cfd, &b, 1, 1000);
}

size_t tt_recv(int fd, void *buf, size_t cap, int timeout_ms) {
  uint64_t n;
  xfer(fd, &n, sizeof n, 0, timeout_ms);
  TT_CHECK(n <= cap, "control message of %llu bytes, room for %zu",
           (unsigned long long)n, cap);
  xfer(fd, buf, (size_t)n, 0, timeout_ms);
  return (size_t)n;
}

double tt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int tt_count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own fd */
}

uint64_t tt_seed(void) {
  uint64_t s = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(&s, sizeof s, 1, f) != 1) s = (uint64_t)time(NULL);
  if (f) fclose(f);
  return s;
}

static uint64_t mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void tt_fill(uint8_t *dst, uint64_t seed, uint64_t start, size_t len) {
  for (size_t i = 0; i < len;) {
    uint64_t j = start + i, w = mix(seed ^ (j / 8 * 0x100000001b3ull));
    for (unsigned b = (unsigned)(j % 8); b < 8 && i < len; b++, i++)
      dst[i] = (uint8_t)(w >> (8 * b));
  }
}

long long tt_verify(const uint8_t *dst, uint64_t seed, uint64_t start,
                    size_t len) {
  uint8_t tmp[65536];
  for (size_t done = 0; done < len;) {
    size_t n = len - done < sizeof tmp ? len - done : sizeof tmp;
    tt_fill(tmp, seed, start + done, n);
    if (memcmp(tmp, dst + done, n))
      for (size_t i = 0; i < n; i++)
        if (tmp[i] != dst[done + i]) return (long long)(done + i);
    done += n;
  }
  return -1;
}

int tt_reap(pid_t pid, int timeout_ms) {
  int status = 0;
  double deadline = tt_now() + timeout_ms / 1000.0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (tt_now() > deadline) {
      fprintf(stderr, "child %d did not exit within %d ms; killing it\n",
              (int)pid, timeout_ms);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    usleep(2000);
  }
}
