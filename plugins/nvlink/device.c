/* device.c - the context's GPU: making it current, naming it, and waiting
 * for its stream with a deadline. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "nvlink.h"

/* The core calls in from several threads, each with its own current
 * device; the caller's is put back afterwards (*saved = -1: none known). */
int mep__nvl_enter(nvl_ctx_t *ctx, int *saved) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) {
    (void)cudaGetLastError();
    cur = -1;
  }
  *saved = cur;
  if (cur == ctx->dev) return 0;
  cudaError_t e = cudaSetDevice(ctx->dev);
  if (e != cudaSuccess)
    return NVL_ERR(ctx, MEP_ERR_SYSTEM, "nvlink: rank %d: cudaSetDevice(%d): "
                   "%s", ctx->rank, ctx->dev, cudaGetErrorString(e));
  return 0;
}

void mep__nvl_leave(nvl_ctx_t *ctx, int saved) {
  if (saved >= 0 && saved != ctx->dev) (void)cudaSetDevice(saved);
}

/* Without the driver API: the UUID is in the device's properties. */
static cudaError_t dev_uuid(int dev, uint8_t out[16]) {
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, dev);
  if (e == cudaSuccess) memcpy(out, p.uuid.bytes, 16);
  return e;
}

/* FNV-1a, continued from h. */
uint64_t mep__nvl_hash(const void *p, size_t n, uint64_t h) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Two processes that see the same GPUs (in any order) get the same digest:
 * only then can each tell by itself whether the other's GPU can access
 * its own, and both reach the same answer in reachable(). */
static int visible_digest(uint64_t *out, char *why, size_t why_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(why, why_len, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
    return -1;
  }
  uint64_t sum = 0;
  for (int d = 0; d < n; d++) {
    uint8_t u[16];
    if ((e = dev_uuid(d, u)) != cudaSuccess) {
      snprintf(why, why_len, "cudaGetDeviceProperties(%d): %s", d,
               cudaGetErrorString(e));
      return -1;
    }
    sum += mix(mep__nvl_hash(u, sizeof u, 0xcbf29ce484222325ull));
  }
  *out = mix(sum ^ (uint64_t)n);
  return 0;
}

int mep__nvl_identity(int dev, nvl_addr_t *a, char *why, size_t why_len) {
  cudaError_t e = dev_uuid(dev, a->uuid);
  if (e != cudaSuccess) {
    snprintf(why, why_len, "cudaGetDeviceProperties(%d): %s", dev,
             cudaGetErrorString(e));
    return -1;
  }
  memset(a->busid, 0, sizeof a->busid);
  e = cudaDeviceGetPCIBusId(a->busid, (int)sizeof a->busid - 1, dev);
  if (e != cudaSuccess) {
    snprintf(why, why_len, "cudaDeviceGetPCIBusId(%d): %s", dev,
             cudaGetErrorString(e));
    return -1;
  }
  a->dev = (uint32_t)dev;
  return visible_digest(&a->visible, why, why_len);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits, at most ctx->timeout_ms, until everything enqueued on the stream
 * so far has run (before a mapping it may use is closed). The caller has
 * made the device current and does not hold ctx->mu. -1 on timeout or
 * error, logged naming `what`. */
int mep__nvl_drain(nvl_ctx_t *ctx, const char *what) {
  int64_t start = now_ms(), deadline = start + ctx->timeout_ms;
  cudaEvent_t ev = NULL;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    pthread_mutex_lock(&ctx->mu);
    e = cudaEventRecord(ev, ctx->stream);
    pthread_mutex_unlock(&ctx->mu);
  }
  while (e == cudaSuccess && (e = cudaEventQuery(ev)) == cudaErrorNotReady &&
         now_ms() < deadline) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
    e = cudaSuccess;
  }
  if (ev) (void)cudaEventDestroy(ev);
  if (e == cudaSuccess) return 0;
  (void)cudaGetLastError();
  NVL_LOG(ctx, MEP_LOG_WARN, "nvlink: rank %d: %s: waiting %lld ms for the "
          "copies queued before it: %s", ctx->rank, what,
          (long long)(now_ms() - start),
          e == cudaErrorNotReady ? "they did not finish in time"
                                 : cudaGetErrorString(e));
  return -1;
}
