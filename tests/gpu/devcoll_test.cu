// Compile: nvcc -std=c++17 -O2 -arch=sm_90 -Icore/include -Icore/src tests/gpu/devcoll_test.cu core/src/cuda/*.cu -o devcoll_test
//
// devcoll_test - the device collectives of core/src/cuda against a CPU
// reference. One process and one GPU simulate N ranks (N = 1, 2, 3, 4, 8):
// N workspaces in one allocation, a pointer table, an active array and a
// status word per simulated rank, and one stream per rank so the ranks'
// kernels run concurrently. Exits 77 without a GPU.
//
// Usage: devcoll_test [seed [N...]]  (N: the simulated rank counts to run)
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <random>
#include <vector>

#include "cuda/devcoll.h"

#define CK(call)                                                          \
  do {                                                                    \
    cudaError_t e_ = (call);                                              \
    if (e_ != cudaSuccess) {                                              \
      fprintf(stderr, "devcoll_test: %s:%d: %s: %s\n", __FILE__, __LINE__, \
              #call, cudaGetErrorString(e_));                             \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static int g_pass, g_fail, g_group_pass, g_group_fail;
static std::mt19937_64 g_rng;

static void check(bool ok, const char *fmt, ...) {
  if (ok) {
    ++g_pass, ++g_group_pass;
    return;
  }
  ++g_fail, ++g_group_fail;
  if (g_fail > 40) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static void group_line(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf(": %d ok, %d failed\n", g_group_pass, g_group_fail);
  fflush(stdout);
  g_group_pass = g_group_fail = 0;
}

/* ------------------------------------------------------------ host types */

static const char *dt_name[] = {"float16", "bfloat16", "float32", "float64",
                                "int8",    "uint8",    "int32",   "int64",
                                "bool"};
static const char *op_name[] = {"sum", "prod", "min", "max", "avg"};
static const size_t dt_size[] = {2, 2, 4, 8, 1, 1, 4, 8, 1};

static float h16_ld(uint16_t v) {
  __half_raw r;
  r.x = v;
  return __half2float(__half(r));
}
static uint16_t h16_st(float f) {
  __half_raw r = (__half_raw)__float2half_rn(f);
  return r.x;
}
static float bf_ld(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t bf_st(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

template <typename A> static A fmin_ref(A a, A b) {
  if (a != a || b != b) return a + b;
  return b < a ? b : a;
}
template <typename A> static A fmax_ref(A a, A b) {
  if (a != a || b != b) return a + b;
  return b > a ? b : a;
}

struct HF16 {
  typedef uint16_t S;
  typedef float A;
  static A ld(S v) { return h16_ld(v); }
  static S st(A a) { return h16_st(a); }
  static S avg(A a, int n) { return st(a / (float)n); }
  static A add(A a, A b) { return a + b; }
  static A mul(A a, A b) { return a * b; }
  static A mn(A a, A b) { return fmin_ref(a, b); }
  static A mx(A a, A b) { return fmax_ref(a, b); }
};
struct HBF16 : HF16 {
  static A ld(S v) { return bf_ld(v); }
  static S st(A a) { return bf_st(a); }
  static S avg(A a, int n) { return st(a / (float)n); }
};
template <typename F> struct HFP {
  typedef F S;
  typedef F A;
  static A ld(S v) { return v; }
  static S st(A a) { return a; }
  static S avg(A a, int n) { return a / (F)n; }
  static A add(A a, A b) { return a + b; }
  static A mul(A a, A b) { return a * b; }
  static A mn(A a, A b) { return fmin_ref(a, b); }
  static A mx(A a, A b) { return fmax_ref(a, b); }
};
/* Integers: accumulate in 64-bit unsigned (wraps), the type's width at
 * the end; min/max compare the signed/unsigned values themselves. */
template <typename T> struct HInt {
  typedef T S;
  typedef int64_t A;
  static A ld(S v) { return (A)v; }
  static S st(A a) { return (S)(uint64_t)a; }
  static S avg(A a, int n) { return (S)(st(a) / (int64_t)n); }
  static A add(A a, A b) { return (A)((uint64_t)a + (uint64_t)b); }
  static A mul(A a, A b) { return (A)((uint64_t)a * (uint64_t)b); }
  static A mn(A a, A b) { return b < a ? b : a; }
  static A mx(A a, A b) { return b > a ? b : a; }
};
struct HBool {
  typedef uint8_t S;
  typedef int A;
  static A ld(S v) { return v != 0; }
  static S st(A a) { return a != 0; }
  static S avg(A a, int) { return st(a); }
  static A add(A a, A b) { return a | b; }
  static A mul(A a, A b) { return a & b; }
  static A mn(A a, A b) { return a & b; }
  static A mx(A a, A b) { return a | b; }
};

template <class H> static typename H::A h_comb(int op, typename H::A a,
                                              typename H::A b) {
  switch (op) {
  case MEP_PROD: return H::mul(a, b);
  case MEP_MIN: return H::mn(a, b);
  case MEP_MAX: return H::mx(a, b);
  default: return H::add(a, b);
  }
}

/* out = reduction of in[0..k) in that order (elements n). */
template <class H>
static void ref_t(int op, const std::vector<const uint8_t *> &in, size_t n,
                  uint8_t *out) {
  typedef typename H::S S;
  int k = (int)in.size();
  for (size_t i = 0; i < n; ++i) {
    S v;
    memcpy(&v, in[0] + i * sizeof(S), sizeof(S));
    typename H::A acc = H::ld(v);
    for (int j = 1; j < k; ++j) {
      memcpy(&v, in[j] + i * sizeof(S), sizeof(S));
      acc = h_comb<H>(op, acc, H::ld(v));
    }
    S r = op == MEP_AVG ? H::avg(acc, k) : H::st(acc);
    memcpy(out + i * sizeof(S), &r, sizeof(S));
  }
}

static void ref_reduce(int dt, int op, const std::vector<const uint8_t *> &in,
                       size_t n, uint8_t *out) {
  switch (dt) {
  case MEP_FLOAT16: ref_t<HF16>(op, in, n, out); break;
  case MEP_BFLOAT16: ref_t<HBF16>(op, in, n, out); break;
  case MEP_FLOAT32: ref_t<HFP<float>>(op, in, n, out); break;
  case MEP_FLOAT64: ref_t<HFP<double>>(op, in, n, out); break;
  case MEP_INT8: ref_t<HInt<int8_t>>(op, in, n, out); break;
  case MEP_UINT8: ref_t<HInt<uint8_t>>(op, in, n, out); break;
  case MEP_INT32: ref_t<HInt<int32_t>>(op, in, n, out); break;
  case MEP_INT64: ref_t<HInt<int64_t>>(op, in, n, out); break;
  case MEP_BOOL: ref_t<HBool>(op, in, n, out); break;
  }
}

/* avg of one buffer by div (the scale_avg reference). */
template <class H> static void ref_scale_t(uint8_t *b, size_t n, int div) {
  typedef typename H::S S;
  for (size_t i = 0; i < n; ++i) {
    S v;
    memcpy(&v, b + i * sizeof(S), sizeof(S));
    v = H::avg(H::ld(v), div);
    memcpy(b + i * sizeof(S), &v, sizeof(S));
  }
}
static void ref_scale(int dt, uint8_t *b, size_t n, int div) {
  switch (dt) {
  case MEP_FLOAT16: ref_scale_t<HF16>(b, n, div); break;
  case MEP_BFLOAT16: ref_scale_t<HBF16>(b, n, div); break;
  case MEP_FLOAT32: ref_scale_t<HFP<float>>(b, n, div); break;
  case MEP_FLOAT64: ref_scale_t<HFP<double>>(b, n, div); break;
  case MEP_INT8: ref_scale_t<HInt<int8_t>>(b, n, div); break;
  case MEP_UINT8: ref_scale_t<HInt<uint8_t>>(b, n, div); break;
  case MEP_INT32: ref_scale_t<HInt<int32_t>>(b, n, div); break;
  case MEP_INT64: ref_scale_t<HInt<int64_t>>(b, n, div); break;
  }
}

/* Random values every op can take: floats in [0.5, 1.5] (products of 8
 * stay tame), small integers, bool bytes 0..2 (nonzero is true). */
static void fill_random(int dt, uint8_t *p, size_t n) {
  std::uniform_real_distribution<double> fd(0.5, 1.5);
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = g_rng();
    switch (dt) {
    case MEP_FLOAT16: {
      uint16_t v = h16_st((float)fd(g_rng));
      memcpy(p + 2 * i, &v, 2);
    } break;
    case MEP_BFLOAT16: {
      uint16_t v = bf_st((float)fd(g_rng));
      memcpy(p + 2 * i, &v, 2);
    } break;
    case MEP_FLOAT32: {
      float v = (float)fd(g_rng);
      memcpy(p + 4 * i, &v, 4);
    } break;
    case MEP_FLOAT64: {
      double v = fd(g_rng);
      memcpy(p + 8 * i, &v, 8);
    } break;
    case MEP_INT8: p[i] = (uint8_t)(int8_t)((int)(r % 9) - 4); break;
    case MEP_UINT8: p[i] = (uint8_t)(r % 7); break;
    case MEP_INT32: {
      int32_t v = (int32_t)(r % 4001) - 2000;
      memcpy(p + 4 * i, &v, 4);
    } break;
    case MEP_INT64: {
      int64_t v = (int64_t)(r % 2000001) - 1000000;
      memcpy(p + 8 * i, &v, 8);
    } break;
    case MEP_BOOL: p[i] = (uint8_t)(r % 3); break;
    }
  }
}

static void fill_bytes(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = (uint8_t)g_rng();
}

/* ------------------------------------------------------- simulated ranks */

#define GUARD 64
#define PATTERN 0xA5

struct Sim {
  int n = 0;
  size_t ws_bytes = 0, cap = 0;
  char *ws_all = nullptr;
  std::vector<void **> table;
  std::vector<int32_t *> active;
  std::vector<uint32_t *> status;
  std::vector<cudaStream_t> st;
  std::vector<mep__dc_group_t> g;
  std::vector<uint8_t *> din, dout; /* cap + GUARD bytes each */
};

static void sim_reset(Sim &s) {
  CK(cudaDeviceSynchronize());
  for (int r = 0; r < s.n; ++r) {
    for (int q = 0; q < s.n; ++q) s.active[r][q] = 1;
    *s.status[r] = 0;
    if (mep__dc_init_ws(s.ws_all + r * s.ws_bytes, s.ws_bytes, s.st[r]))
      fprintf(stderr, "init_ws: %s\n", mep__dc_last_error());
  }
  CK(cudaDeviceSynchronize());
}

static void sim_open(Sim &s, int n, int sms, size_t cap) {
  s.n = n;
  s.ws_bytes = mep__dc_ws_min(n) + 4 * 64 * 1024;
  s.cap = cap;
  CK(cudaMalloc(&s.ws_all, n * s.ws_bytes));
  std::vector<void *> ptrs(n);
  for (int r = 0; r < n; ++r) ptrs[r] = s.ws_all + r * s.ws_bytes;
  s.table.resize(n), s.active.resize(n), s.status.resize(n), s.st.resize(n);
  s.g.resize(n), s.din.resize(n), s.dout.resize(n);
  for (int r = 0; r < n; ++r) {
    CK(cudaMalloc(&s.table[r], n * sizeof(void *)));
    CK(cudaMemcpy(s.table[r], ptrs.data(), n * sizeof(void *),
                  cudaMemcpyHostToDevice));
    CK(cudaHostAlloc(&s.active[r], n * sizeof(int32_t), cudaHostAllocMapped));
    CK(cudaHostAlloc(&s.status[r], sizeof(uint32_t), cudaHostAllocMapped));
    CK(cudaStreamCreateWithFlags(&s.st[r], cudaStreamNonBlocking));
    CK(cudaMalloc(&s.din[r], cap + GUARD));
    CK(cudaMalloc(&s.dout[r], cap + GUARD));
    int32_t *dact;
    uint32_t *dstat;
    CK(cudaHostGetDevicePointer((void **)&dact, s.active[r], 0));
    CK(cudaHostGetDevicePointer((void **)&dstat, s.status[r], 0));
    mep__dc_group_t &g = s.g[r];
    g.rank = r;
    g.nranks = n;
    g.peer_ws = s.table[r];
    g.ws_bytes = s.ws_bytes;
    g.active = dact;
    g.status = dstat;
    g.timeout_ns = 5000000000ull; /* a hang shows as a failure, not forever */
    g.sms = sms;
  }
  sim_reset(s);
}

static void sim_close(Sim &s) {
  CK(cudaDeviceSynchronize());
  for (int r = 0; r < s.n; ++r) {
    CK(cudaFree(s.table[r]));
    CK(cudaFreeHost(s.active[r]));
    CK(cudaFreeHost(s.status[r]));
    CK(cudaStreamDestroy(s.st[r]));
    CK(cudaFree(s.din[r]));
    CK(cudaFree(s.dout[r]));
  }
  CK(cudaFree(s.ws_all));
  s = Sim();
}

/* Every rank's status word must be `want`; resets the group if not, so
 * one timeout does not poison the later checks. */
static void check_status(Sim &s, uint32_t want, const char *what) {
  CK(cudaDeviceSynchronize());
  bool ok = true;
  for (int r = 0; r < s.n; ++r) ok = ok && *s.status[r] == want;
  check(ok, "%s: N=%d: status words not 0x%x (rank 0: 0x%x)", what, s.n,
        want, *s.status[0]);
  if (!ok) sim_reset(s);
}

static void upload(uint8_t *d, const std::vector<uint8_t> &h) {
  CK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
}
static std::vector<uint8_t> download(const uint8_t *d, size_t n) {
  std::vector<uint8_t> h(n);
  CK(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost));
  return h;
}

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return i;
  return n;
}

/* Output check: `got` (bytes+GUARD downloaded) equals want, then GUARD
 * bytes of PATTERN. */
static void check_out(const std::vector<uint8_t> &got,
                      const std::vector<uint8_t> &want, const char *what,
                      int n, int rank, const char *dt, size_t size) {
  size_t d = first_diff(got.data(), want.data(), want.size());
  bool guard_ok = true;
  for (size_t i = want.size(); i < got.size(); ++i)
    guard_ok = guard_ok && got[i] == PATTERN;
  check(d == want.size() && guard_ok,
        "%s N=%d rank %d %s size %zu: first difference at byte %zu of %zu "
        "(got 0x%02x want 0x%02x), guard %s",
        what, n, rank, dt, size, d, want.size(),
        d < want.size() ? got[d] : 0, d < want.size() ? want[d] : 0,
        guard_ok ? "intact" : "overwritten");
}

static std::vector<size_t> sizes_for(size_t chunk_units, size_t big) {
  return {0,
          1,
          7,
          1000,
          4099,
          chunk_units - 1,
          chunk_units + 3,
          3 * chunk_units + 5,
          big};
}

/* ------------------------------------------------------------ allreduce */

static void test_allreduce(Sim &s) {
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  for (int dt = 0; dt < MEP_DTYPE_COUNT; ++dt) {
    size_t es = dt_size[dt];
    for (size_t count : sizes_for(cm / es, (8u << 20) / es + 5)) {
      size_t bytes = count * es;
      /* Odd sizes also get misaligned (element-aligned) buffers. */
      size_t soff = (count & 1) ? es : 0, roff = (count % 3 == 1) ? 3 * es : 0;
      std::vector<std::vector<uint8_t>> in(s.n, std::vector<uint8_t>(bytes));
      std::vector<const uint8_t *> ptr(s.n);
      for (int r = 0; r < s.n; ++r) {
        fill_random(dt, in[r].data(), count);
        upload(s.din[r] + soff, in[r]);
        ptr[r] = in[r].data();
      }
      std::vector<uint8_t> want(bytes);
      for (int op = 0; op < MEP_OP_COUNT; ++op) {
        if (dt == MEP_BOOL && op == MEP_AVG) {
          int rc = mep__dc_allreduce(&s.g[0], s.din[0], s.dout[0], count,
                                     (mep_dtype_t)dt, (mep_op_t)op, 0, s.st[0]);
          check(rc == MEP_ERR_INVALID, "allreduce avg on bool returned %d", rc);
          continue;
        }
        ref_reduce(dt, op, ptr, count, want.data());
        for (int algo = 1; algo <= 3; ++algo) {
          for (int r = 0; r < s.n; ++r)
            CK(cudaMemset(s.dout[r], PATTERN, bytes + roff + GUARD));
          CK(cudaDeviceSynchronize());
          for (int r = 0; r < s.n; ++r) {
            int rc = mep__dc_allreduce(&s.g[r], s.din[r] + soff,
                                       s.dout[r] + roff, count, (mep_dtype_t)dt,
                                       (mep_op_t)op, algo, s.st[r]);
            check(rc == 0, "allreduce rank %d returned %d: %s", r, rc,
                  mep__dc_last_error());
          }
          CK(cudaDeviceSynchronize());
          for (int r = 0; r < s.n; ++r) {
            char what[64];
            snprintf(what, sizeof what, "allreduce %s algo %d", op_name[op],
                     algo);
            check_out(download(s.dout[r] + roff, bytes + GUARD), want, what,
                      s.n, r, dt_name[dt], count);
          }
        }
      }
      /* In place, auto algorithm, one op per size. */
      int op = (int)(count % 4);
      ref_reduce(dt, op, ptr, count, want.data());
      for (int r = 0; r < s.n; ++r) {
        CK(cudaMemset(s.din[r] + soff + bytes, PATTERN, GUARD));
        upload(s.din[r] + soff, in[r]);
      }
      CK(cudaDeviceSynchronize());
      for (int r = 0; r < s.n; ++r) {
        int rc = mep__dc_allreduce(&s.g[r], s.din[r] + soff, s.din[r] + soff,
                                   count, (mep_dtype_t)dt, (mep_op_t)op, 0,
                                   s.st[r]);
        check(rc == 0, "in-place allreduce rank %d returned %d: %s", r, rc,
              mep__dc_last_error());
      }
      CK(cudaDeviceSynchronize());
      for (int r = 0; r < s.n; ++r)
        check_out(download(s.din[r] + soff, bytes + GUARD), want,
                  "in-place allreduce", s.n, r, dt_name[dt], count);
    }
    check_status(s, 0, "allreduce");
    group_line("N=%d allreduce %s (ops x algos x sizes, in place)", s.n,
               dt_name[dt]);
  }
}

/* ------------------------------------------------------- reduce_scatter */

static void test_reduce_scatter(Sim &s) {
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  for (int dt = 0; dt < MEP_DTYPE_COUNT; ++dt) {
    size_t es = dt_size[dt];
    for (size_t cpr : sizes_for(cm / es / s.n, (8u << 20) / es / s.n + 3)) {
      size_t bytes = cpr * es;
      size_t soff = (cpr & 1) ? es : 0, roff = (cpr % 3 == 1) ? es : 0;
      std::vector<std::vector<uint8_t>> in(s.n,
                                           std::vector<uint8_t>(bytes * s.n));
      for (int r = 0; r < s.n; ++r) {
        fill_random(dt, in[r].data(), cpr * s.n);
        upload(s.din[r] + soff, in[r]);
      }
      for (int op = 0; op < MEP_OP_COUNT; ++op) {
        if (dt == MEP_BOOL && op == MEP_AVG) continue;
        for (int r = 0; r < s.n; ++r)
          CK(cudaMemset(s.dout[r], PATTERN, bytes + roff + GUARD));
        CK(cudaDeviceSynchronize());
        for (int r = 0; r < s.n; ++r) {
          int rc = mep__dc_reduce_scatter(&s.g[r], s.din[r] + soff,
                                          s.dout[r] + roff, cpr,
                                          (mep_dtype_t)dt, (mep_op_t)op,
                                          s.st[r]);
          check(rc == 0, "reduce_scatter rank %d returned %d: %s", r, rc,
                mep__dc_last_error());
        }
        CK(cudaDeviceSynchronize());
        for (int r = 0; r < s.n; ++r) {
          std::vector<const uint8_t *> ptr(s.n);
          for (int q = 0; q < s.n; ++q) ptr[q] = in[q].data() + r * bytes;
          std::vector<uint8_t> want(bytes);
          ref_reduce(dt, op, ptr, cpr, want.data());
          char what[64];
          snprintf(what, sizeof what, "reduce_scatter %s", op_name[op]);
          check_out(download(s.dout[r] + roff, bytes + GUARD), want, what,
                    s.n, r, dt_name[dt], cpr);
        }
      }
    }
    check_status(s, 0, "reduce_scatter");
    group_line("N=%d reduce_scatter %s (ops x sizes)", s.n, dt_name[dt]);
  }
}

/* ------------------------------------------- allgather, alltoall, bcast */

static void test_allgather(Sim &s) {
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  for (size_t bpr : sizes_for(cm, (8u << 20) / s.n + 5)) {
    for (int inplace = 0; inplace < 2; ++inplace) {
      size_t soff = (bpr & 1) ? 1 : 0, roff = (bpr % 3 == 1) ? 3 : 0;
      std::vector<std::vector<uint8_t>> in(s.n, std::vector<uint8_t>(bpr));
      std::vector<uint8_t> want(bpr * s.n);
      for (int r = 0; r < s.n; ++r) {
        fill_bytes(in[r].data(), bpr);
        if (bpr) memcpy(want.data() + r * bpr, in[r].data(), bpr);
        CK(cudaMemset(s.dout[r], PATTERN, bpr * s.n + roff + GUARD));
        if (inplace)
          upload(s.dout[r] + roff + r * bpr, in[r]);
        else
          upload(s.din[r] + soff, in[r]);
      }
      CK(cudaDeviceSynchronize());
      for (int r = 0; r < s.n; ++r) {
        const uint8_t *send =
            inplace ? s.dout[r] + roff + r * bpr : s.din[r] + soff;
        int rc = mep__dc_allgather(&s.g[r], send, s.dout[r] + roff, bpr,
                                   s.st[r]);
        check(rc == 0, "allgather rank %d returned %d: %s", r, rc,
              mep__dc_last_error());
      }
      CK(cudaDeviceSynchronize());
      for (int r = 0; r < s.n; ++r)
        check_out(download(s.dout[r] + roff, bpr * s.n + GUARD), want,
                  inplace ? "allgather in place" : "allgather", s.n, r,
                  "bytes", bpr);
    }
  }
  check_status(s, 0, "allgather");
  group_line("N=%d allgather (sizes, in place)", s.n);
}

static void test_alltoall(Sim &s) {
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  for (size_t bpr : sizes_for(cm / s.n, (8u << 20) / s.n + 5)) {
    for (int inplace = 0; inplace < 2; ++inplace) {
      size_t soff = (bpr & 1) ? 1 : 0, roff = (bpr % 3 == 1) ? 3 : 0;
      if (inplace) soff = roff;
      std::vector<std::vector<uint8_t>> in(s.n,
                                           std::vector<uint8_t>(bpr * s.n));
      for (int r = 0; r < s.n; ++r) {
        fill_bytes(in[r].data(), bpr * s.n);
        CK(cudaMemset(s.dout[r], PATTERN, bpr * s.n + roff + GUARD));
        upload((inplace ? s.dout[r] : s.din[r]) + soff, in[r]);
      }
      CK(cudaDeviceSynchronize());
      for (int r = 0; r < s.n; ++r) {
        const uint8_t *send = (inplace ? s.dout[r] : s.din[r]) + soff;
        int rc =
            mep__dc_alltoall(&s.g[r], send, s.dout[r] + roff, bpr, s.st[r]);
        check(rc == 0, "alltoall rank %d returned %d: %s", r, rc,
              mep__dc_last_error());
      }
      CK(cudaDeviceSynchronize());
      for (int r = 0; r < s.n; ++r) {
        std::vector<uint8_t> want(bpr * s.n);
        for (int q = 0; q < s.n && bpr; ++q)
          memcpy(want.data() + q * bpr, in[q].data() + r * bpr, bpr);
        check_out(download(s.dout[r] + roff, bpr * s.n + GUARD), want,
                  inplace ? "alltoall in place" : "alltoall", s.n, r, "bytes",
                  bpr);
      }
    }
  }
  check_status(s, 0, "alltoall");
  group_line("N=%d alltoall (sizes, in place)", s.n);
}

/* algo 0 (auto), 1 (direct) and 2 (split: the takers' pieces), every
 * size with another root. */
static void test_broadcast(Sim &s, int algo) {
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  int i = algo;
  for (size_t bytes : sizes_for(cm, (8u << 20) + 5)) {
    int root = i++ % s.n;
    size_t off = (bytes & 1) ? 1 : 0;
    std::vector<uint8_t> data(bytes);
    fill_bytes(data.data(), bytes);
    for (int r = 0; r < s.n; ++r) {
      CK(cudaMemset(s.dout[r], PATTERN, bytes + off + GUARD));
      if (r == root) upload(s.dout[r] + off, data);
    }
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < s.n; ++r) {
      int rc = mep__dc_broadcast(&s.g[r], s.dout[r] + off, bytes, root, algo,
                                 s.st[r]);
      check(rc == 0, "broadcast algo %d rank %d returned %d: %s", algo, r, rc,
            mep__dc_last_error());
    }
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < s.n; ++r)
      check_out(download(s.dout[r] + off, bytes + GUARD), data,
                algo == 2 ? "broadcast 2" : algo ? "broadcast 1" : "broadcast",
                s.n, r, "bytes", bytes);
  }
  check_status(s, 0, "broadcast");
  group_line("N=%d broadcast algo %d (sizes, roots)", s.n, algo);
}

/* ----------------------------------------------------------------- faults */

/* Rank v never launches: the others finish within the timeout (plus a
 * margin), drop v, report it and reduce over the rest. */
static void test_no_show(Sim &s, int algo) {
  if (s.n < 2) return;
  int v = s.n - 1;
  const uint64_t tmo = 200000000ull;
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  size_t count = 3 * cm / 4 + 5; /* floats: several rounds */
  size_t bytes = count * 4;
  std::vector<std::vector<uint8_t>> in(s.n, std::vector<uint8_t>(bytes));
  std::vector<const uint8_t *> ptr;
  for (int r = 0; r < s.n; ++r) {
    fill_random(MEP_FLOAT32, in[r].data(), count);
    upload(s.din[r], in[r]);
    if (r != v) ptr.push_back(in[r].data());
    s.g[r].timeout_ns = tmo;
  }
  std::vector<uint8_t> want(bytes);
  ref_reduce(MEP_FLOAT32, MEP_AVG, ptr, count, want.data());
  CK(cudaDeviceSynchronize());
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < s.n; ++r) {
    if (r == v) continue;
    int rc = mep__dc_allreduce(&s.g[r], s.din[r], s.dout[r], count,
                               MEP_FLOAT32, MEP_AVG, algo, s.st[r]);
    check(rc == 0, "no-show allreduce rank %d returned %d: %s", r, rc,
          mep__dc_last_error());
  }
  CK(cudaDeviceSynchronize());
  double secs = std::chrono::duration<double>(
                    std::chrono::steady_clock::now() - t0).count();
  check(secs < tmo * 1e-9 + 2.0, "no-show N=%d: took %.3f s (timeout %.3f s)",
        s.n, secs, tmo * 1e-9);
  for (int r = 0; r < s.n; ++r) {
    if (r == v) continue;
    check(*s.status[r] == (1u << v), "no-show N=%d rank %d: status 0x%x, want 0x%x",
          s.n, r, *s.status[r], 1u << v);
    check(s.active[r][v] == 0, "no-show N=%d rank %d: rank %d still active",
          s.n, r, v);
    std::vector<uint8_t> got = download(s.dout[r], bytes);
    size_t d = first_diff(got.data(), want.data(), bytes);
    check(d == bytes, "no-show N=%d algo %d rank %d: result differs at byte %zu",
          s.n, algo, r, d);
  }
  for (int r = 0; r < s.n; ++r) s.g[r].timeout_ns = 5000000000ull;
  sim_reset(s);
  group_line("N=%d rank %d never launches, algo %d (%.3f s)", s.n, v, algo,
             secs);
}

/* The same for a broadcast from rank 0 (the split algorithm: the pieces
 * are dealt among the takers that came), and (one_round) a taker that
 * leaves after its first round: rank v's call is one round long (chunk
 * bytes), the others' four. v answers the barriers of rounds 0 and 1, so
 * it is dealt a piece of round 1 that it never pulls; the others time out
 * on it at round 2's barrier and read that piece from the root instead. */
static void test_broadcast_lost(Sim &s, bool one_round) {
  if (s.n < (one_round ? 3 : 2)) return;
  int v = s.n - 1;
  const uint64_t tmo = 200000000ull;
  const char *what = one_round ? "taker-leaves broadcast" : "no-show broadcast";
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  size_t bytes = 3 * cm + 7;
  std::vector<uint8_t> data(bytes);
  fill_bytes(data.data(), bytes);
  for (int r = 0; r < s.n; ++r) {
    CK(cudaMemset(s.dout[r], PATTERN, bytes + GUARD));
    s.g[r].timeout_ns = tmo;
  }
  upload(s.dout[0], data);
  CK(cudaDeviceSynchronize());
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < (one_round ? s.n : v); ++r) {
    int rc = mep__dc_broadcast(&s.g[r], s.dout[r], r == v ? cm : bytes, 0, 2,
                               s.st[r]);
    check(rc == 0, "%s rank %d returned %d: %s", what, r, rc,
          mep__dc_last_error());
  }
  CK(cudaDeviceSynchronize());
  double secs = std::chrono::duration<double>(
                    std::chrono::steady_clock::now() - t0).count();
  check(secs < tmo * 1e-9 + 2.0, "%s N=%d: took %.3f s (timeout %.3f s)",
        what, s.n, secs, tmo * 1e-9);
  for (int r = 0; r < v; ++r) {
    check(*s.status[r] == (1u << v), "%s N=%d rank %d: status 0x%x, want 0x%x",
          what, s.n, r, *s.status[r], 1u << v);
    check_out(download(s.dout[r], bytes + GUARD), data, what, s.n, r, "bytes",
              bytes);
  }
  if (one_round) {
    std::vector<uint8_t> first(data.begin(), data.begin() + cm);
    check_out(download(s.dout[v], cm), first,
              "taker-leaves broadcast (its round)", s.n, v, "bytes", cm);
  }
  for (int r = 0; r < s.n; ++r) s.g[r].timeout_ns = 5000000000ull;
  sim_reset(s);
  group_line(one_round ? "N=%d rank %d leaves the split broadcast after a "
                         "round (%.3f s)"
                       : "N=%d rank %d never launches, broadcast algo 2 "
                         "(%.3f s)",
             s.n, v, secs);
}

/* Rank k is inactive from the start in every rank's view. */
static void test_inactive(Sim &s) {
  if (s.n < 2) return;
  int k = 1;
  for (int r = 0; r < s.n; ++r) s.active[r][k] = 0;
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  size_t count = cm / 4 + 3;
  size_t bytes = count * 4;
  std::vector<std::vector<uint8_t>> in(s.n, std::vector<uint8_t>(bytes * s.n));
  for (int r = 0; r < s.n; ++r) {
    fill_random(MEP_FLOAT32, in[r].data(), count * s.n);
    upload(s.din[r], in[r]);
  }
  auto run_all = [&](const char *what, auto fn) {
    for (int r = 0; r < s.n; ++r)
      CK(cudaMemset(s.dout[r], PATTERN, bytes * s.n + GUARD));
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < s.n; ++r) {
      int rc = fn(r);
      int want = r == k ? MEP_ERR_EXCLUDED : 0;
      check(rc == want, "inactive %s N=%d rank %d returned %d, want %d: %s",
            what, s.n, r, rc, want, rc ? mep__dc_last_error() : "");
    }
    CK(cudaDeviceSynchronize());
  };
  for (int algo = 1; algo <= 2; ++algo) {
    run_all("allreduce", [&](int r) {
      return mep__dc_allreduce(&s.g[r], s.din[r], s.dout[r], count,
                               MEP_FLOAT32, MEP_AVG, algo, s.st[r]);
    });
    std::vector<const uint8_t *> ptr;
    for (int r = 0; r < s.n; ++r)
      if (r != k) ptr.push_back(in[r].data());
    std::vector<uint8_t> want(bytes);
    ref_reduce(MEP_FLOAT32, MEP_AVG, ptr, count, want.data());
    for (int r = 0; r < s.n; ++r)
      if (r != k)
        check_out(download(s.dout[r], bytes + GUARD), want,
                  algo == 1 ? "inactive allreduce 1" : "inactive allreduce 2",
                  s.n, r, "float32", count);
  }
  run_all("reduce_scatter", [&](int r) {
    return mep__dc_reduce_scatter(&s.g[r], s.din[r], s.dout[r], count,
                                  MEP_FLOAT32, MEP_SUM, s.st[r]);
  });
  for (int r = 0; r < s.n; ++r) {
    if (r == k) continue;
    std::vector<const uint8_t *> ptr;
    for (int q = 0; q < s.n; ++q)
      if (q != k) ptr.push_back(in[q].data() + r * bytes);
    std::vector<uint8_t> want(bytes);
    ref_reduce(MEP_FLOAT32, MEP_SUM, ptr, count, want.data());
    check_out(download(s.dout[r], bytes + GUARD), want,
              "inactive reduce_scatter", s.n, r, "float32", count);
  }
  /* Byte movers: blocks from k stay PATTERN. */
  run_all("allgather", [&](int r) {
    return mep__dc_allgather(&s.g[r], s.din[r], s.dout[r], bytes, s.st[r]);
  });
  for (int r = 0; r < s.n; ++r) {
    if (r == k) continue;
    std::vector<uint8_t> want(bytes * s.n, PATTERN);
    for (int q = 0; q < s.n; ++q)
      if (q != k) memcpy(want.data() + q * bytes, in[q].data(), bytes);
    check_out(download(s.dout[r], bytes * s.n + GUARD), want,
              "inactive allgather", s.n, r, "bytes", bytes);
  }
  run_all("alltoall", [&](int r) {
    return mep__dc_alltoall(&s.g[r], s.din[r], s.dout[r], bytes, s.st[r]);
  });
  for (int r = 0; r < s.n; ++r) {
    if (r == k) continue;
    std::vector<uint8_t> want(bytes * s.n, PATTERN);
    for (int q = 0; q < s.n; ++q)
      if (q != k)
        memcpy(want.data() + q * bytes, in[q].data() + r * bytes, bytes);
    check_out(download(s.dout[r], bytes * s.n + GUARD), want,
              "inactive alltoall", s.n, r, "bytes", bytes);
  }
  for (int algo = 1; algo <= 2; ++algo) {
    for (int r = 0; r < s.n; ++r) upload(s.dout[r], in[r]);
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < s.n; ++r) {
      int rc = mep__dc_broadcast(&s.g[r], s.dout[r], bytes, 0, algo, s.st[r]);
      check(rc == (r == k ? MEP_ERR_EXCLUDED : 0),
            "inactive broadcast %d rank %d returned %d", algo, r, rc);
    }
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < s.n; ++r) {
      std::vector<uint8_t> want(in[r == k ? k : 0].begin(),
                                in[r == k ? k : 0].begin() + bytes);
      check_out(download(s.dout[r], bytes), want,
                algo == 1 ? "inactive broadcast 1" : "inactive broadcast 2",
                s.n, r, "bytes", bytes);
    }
  }
  check_status(s, 0, "inactive");
  sim_reset(s);
  group_line("N=%d rank %d inactive from the start", s.n, k);
}

/* ------------------------------------------------------------ graphs */

/* Three allreduce calls captured per rank, replayed 5 times with fresh
 * inputs copied in outside the graph. */
static void test_graph(Sim &s) {
  size_t cm = mep__dc_chunk_max(&s.g[0]);
  struct Call {
    int dt, op, algo;
    size_t count;
    bool inplace;
  } calls[3] = {{MEP_FLOAT32, MEP_SUM, 0, 3 * cm / 4 + 5, false},
                {MEP_BFLOAT16, MEP_MAX, 1, 1000, true},
                {MEP_INT32, MEP_AVG, 2, cm / 4 + 3, false}};
  /* Call c of rank r: input at din[r] + c * slot, output at dout[r] + ...
   * (in place: both in dout). */
  size_t slot = 4 * cm + 256;
  std::vector<cudaGraphExec_t> exec(s.n);
  for (int r = 0; r < s.n; ++r) {
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s.st[r], cudaStreamCaptureModeGlobal));
    for (int c = 0; c < 3; ++c) {
      uint8_t *out = s.dout[r] + c * slot;
      const uint8_t *inp = calls[c].inplace ? out : s.din[r] + c * slot;
      int rc = mep__dc_allreduce(&s.g[r], inp, out, calls[c].count,
                                 (mep_dtype_t)calls[c].dt,
                                 (mep_op_t)calls[c].op, calls[c].algo, s.st[r]);
      check(rc == 0, "graph capture rank %d call %d returned %d: %s", r, c, rc,
            mep__dc_last_error());
    }
    CK(cudaStreamEndCapture(s.st[r], &graph));
    CK(cudaGraphInstantiate(&exec[r], graph, 0));
    CK(cudaGraphDestroy(graph));
  }
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<std::vector<std::vector<uint8_t>>> in(3);
    for (int c = 0; c < 3; ++c) {
      size_t bytes = calls[c].count * dt_size[calls[c].dt];
      in[c].assign(s.n, std::vector<uint8_t>(bytes));
      for (int r = 0; r < s.n; ++r) {
        fill_random(calls[c].dt, in[c][r].data(), calls[c].count);
        upload((calls[c].inplace ? s.dout[r] : s.din[r]) + c * slot,
               in[c][r]);
      }
    }
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < s.n; ++r) CK(cudaGraphLaunch(exec[r], s.st[r]));
    CK(cudaDeviceSynchronize());
    for (int c = 0; c < 3; ++c) {
      size_t bytes = calls[c].count * dt_size[calls[c].dt];
      std::vector<const uint8_t *> ptr(s.n);
      for (int r = 0; r < s.n; ++r) ptr[r] = in[c][r].data();
      std::vector<uint8_t> want(bytes);
      ref_reduce(calls[c].dt, calls[c].op, ptr, calls[c].count, want.data());
      for (int r = 0; r < s.n; ++r) {
        std::vector<uint8_t> got = download(s.dout[r] + c * slot, bytes);
        size_t d = first_diff(got.data(), want.data(), bytes);
        check(d == bytes, "graph N=%d replay %d call %d rank %d: differs at byte %zu",
              s.n, rep, c, r, d);
      }
    }
  }
  for (int r = 0; r < s.n; ++r) CK(cudaGraphExecDestroy(exec[r]));
  check_status(s, 0, "graph");
  group_line("N=%d CUDA graph, 3 allreduce calls x 5 replays", s.n);
}

/* ----------------------------------------------------------- local ops */

static void test_local(uint8_t *da, uint8_t *db) {
  const size_t sizes[] = {0, 1, 7, 4099, 100003};
  for (int dt = 0; dt < MEP_DTYPE_COUNT; ++dt) {
    size_t es = dt_size[dt];
    for (size_t n : sizes) {
      size_t off = (n & 1) ? es : 0, bytes = n * es;
      std::vector<uint8_t> a(bytes), b(bytes);
      for (int op = 0; op < MEP_OP_COUNT; ++op) {
        fill_random(dt, a.data(), n);
        fill_random(dt, b.data(), n);
        upload(da + off, a);
        upload(db, b);
        int rc = mep__dc_reduce_local(da + off, db, n, (mep_dtype_t)dt,
                                      (mep_op_t)op, nullptr);
        check(rc == 0, "reduce_local returned %d: %s", rc, mep__dc_last_error());
        CK(cudaDeviceSynchronize());
        std::vector<uint8_t> want(bytes);
        ref_reduce(dt, op == MEP_AVG ? MEP_SUM : op, {a.data(), b.data()}, n,
                   want.data());
        std::vector<uint8_t> got = download(da + off, bytes);
        size_t d = first_diff(got.data(), want.data(), bytes);
        check(d == bytes, "reduce_local %s %s n=%zu differs at byte %zu",
              dt_name[dt], op_name[op], n, d);
      }
      fill_random(dt, a.data(), n);
      upload(da + off, a);
      int rc = mep__dc_scale_avg(da + off, n, (mep_dtype_t)dt, 3, nullptr);
      if (dt == MEP_BOOL) {
        check(rc == MEP_ERR_INVALID, "scale_avg on bool returned %d", rc);
        continue;
      }
      check(rc == 0, "scale_avg returned %d: %s", rc, mep__dc_last_error());
      CK(cudaDeviceSynchronize());
      ref_scale(dt, a.data(), n, 3);
      std::vector<uint8_t> got = download(da + off, bytes);
      size_t d = first_diff(got.data(), a.data(), bytes);
      check(d == bytes, "scale_avg %s n=%zu differs at byte %zu", dt_name[dt],
            n, d);
    }
  }
  group_line("reduce_local and scale_avg (dtypes x ops x sizes)");
}

/* Bad arguments are refused without launching. */
static void test_args(Sim &s) {
  mep__dc_group_t g = s.g[0];
  int dummy;
  check(mep__dc_allreduce(nullptr, &dummy, &dummy, 1, MEP_FLOAT32, MEP_SUM, 0,
                          nullptr) == MEP_ERR_INVALID,
        "NULL group accepted");
  g.nranks = MEP__DC_MAX_RANKS + 1;
  check(mep__dc_allgather(&g, &dummy, &dummy, 1, nullptr) == MEP_ERR_INVALID,
        "too many ranks accepted");
  g = s.g[0];
  g.ws_bytes = 1024;
  check(mep__dc_alltoall(&g, &dummy, &dummy, 1, nullptr) == MEP_ERR_INVALID,
        "small workspace accepted");
  g = s.g[0];
  check(mep__dc_allreduce(&g, &dummy, &dummy, 1, (mep_dtype_t)42, MEP_SUM, 0,
                          nullptr) == MEP_ERR_INVALID,
        "unknown dtype accepted");
  check(mep__dc_allreduce(&g, &dummy, &dummy, 1, MEP_FLOAT32, MEP_SUM, 7,
                          nullptr) == MEP_ERR_INVALID,
        "unknown algorithm accepted");
  check(mep__dc_broadcast(&g, &dummy, 4, s.n, 0, nullptr) == MEP_ERR_INVALID,
        "root out of range accepted");
  check(mep__dc_broadcast(&g, &dummy, 4, 0, 3, nullptr) == MEP_ERR_INVALID,
        "unknown broadcast algorithm accepted");
  check(mep__dc_reduce_scatter(&g, nullptr, nullptr, 5, MEP_FLOAT32, MEP_SUM,
                               nullptr) == MEP_ERR_INVALID,
        "NULL buffers accepted");
  check(strlen(mep__dc_last_error()) > 0, "no error message");
  check(mep__dc_allreduce(&g, nullptr, nullptr, 0, MEP_FLOAT32, MEP_SUM, 0,
                          nullptr) == 0,
        "count 0 refused");
  group_line("N=%d argument checks", s.n);
}

/* ------------------------------------------------------ several GPUs */

/* With two or more GPUs: ranks on different devices, peer access on, so
 * the flags and data cross NVLink/PCIe as in a real job. allreduce (both
 * algorithms) and alltoall over a few sizes. */
static void test_multi_gpu(int ndev) {
  int n = ndev < 4 ? ndev : 4;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      int ok = a == b;
      if (!ok) CK(cudaDeviceCanAccessPeer(&ok, a, b));
      if (!ok) {
        printf("multi-GPU: device %d cannot access device %d; skipped\n", a,
               b);
        return;
      }
    }
  for (int a = 0; a < n; ++a) {
    CK(cudaSetDevice(a));
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
      else CK(e);
    }
  }
  size_t ws_bytes = mep__dc_ws_min(n) + 4 * 64 * 1024, cap = (4u << 20) + 4096;
  std::vector<void *> ws(n);
  std::vector<void **> table(n);
  std::vector<int32_t *> active(n);
  std::vector<uint32_t *> status(n);
  std::vector<cudaStream_t> st(n);
  std::vector<uint8_t *> din(n), dout(n);
  std::vector<mep__dc_group_t> g(n);
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMalloc(&ws[r], ws_bytes));
    CK(cudaMalloc(&din[r], cap));
    CK(cudaMalloc(&dout[r], cap));
    CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    CK(cudaHostAlloc(&active[r], n * sizeof(int32_t), cudaHostAllocMapped |
                                                          cudaHostAllocPortable));
    CK(cudaHostAlloc(&status[r], sizeof(uint32_t), cudaHostAllocMapped |
                                                       cudaHostAllocPortable));
    for (int q = 0; q < n; ++q) active[r][q] = 1;
    *status[r] = 0;
    CK(mep__dc_init_ws(ws[r], ws_bytes, st[r]) ? cudaErrorUnknown : cudaSuccess);
  }
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMalloc(&table[r], n * sizeof(void *)));
    CK(cudaMemcpy(table[r], ws.data(), n * sizeof(void *),
                  cudaMemcpyHostToDevice));
    g[r] = mep__dc_group_t{r, n, table[r], ws_bytes, active[r], status[r],
                           5000000000ull, 8};
    CK(cudaDeviceSynchronize());
  }
  auto sync_all = [&]() {
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaDeviceSynchronize());
    }
  };
  size_t cm = mep__dc_chunk_max(&g[0]);
  for (int dt : {MEP_FLOAT32, MEP_BFLOAT16, MEP_INT64}) {
    size_t es = dt_size[dt];
    for (size_t count : {(size_t)1, (size_t)4099, cm / es + 3,
                         (size_t)(4u << 20) / es - 7}) {
      size_t bytes = count * es;
      std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(bytes));
      std::vector<const uint8_t *> ptr(n);
      for (int r = 0; r < n; ++r) {
        fill_random(dt, in[r].data(), count);
        CK(cudaSetDevice(r));
        upload(din[r], in[r]);
        ptr[r] = in[r].data();
      }
      for (int op : {MEP_SUM, MEP_AVG, MEP_MIN}) {
        std::vector<uint8_t> want(bytes);
        ref_reduce(dt, op, ptr, count, want.data());
        for (int algo = 1; algo <= 3; ++algo) {
          sync_all();
          for (int r = 0; r < n; ++r) {
            CK(cudaSetDevice(r));
            int rc = mep__dc_allreduce(&g[r], din[r], dout[r], count,
                                       (mep_dtype_t)dt, (mep_op_t)op, algo,
                                       st[r]);
            check(rc == 0, "multi-GPU allreduce rank %d returned %d: %s", r,
                  rc, mep__dc_last_error());
          }
          sync_all();
          for (int r = 0; r < n; ++r) {
            CK(cudaSetDevice(r));
            std::vector<uint8_t> got = download(dout[r], bytes);
            size_t d = first_diff(got.data(), want.data(), bytes);
            check(d == bytes,
                  "multi-GPU allreduce %s %s algo %d count %zu rank %d: "
                  "differs at byte %zu",
                  dt_name[dt], op_name[op], algo, count, r, d);
          }
        }
      }
    }
  }
  for (size_t bpr : {(size_t)5, cm / n + 1, (size_t)(4u << 20) / n - 9}) {
    std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(bpr * n));
    for (int r = 0; r < n; ++r) {
      fill_bytes(in[r].data(), bpr * n);
      CK(cudaSetDevice(r));
      upload(din[r], in[r]);
    }
    sync_all();
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      int rc = mep__dc_alltoall(&g[r], din[r], dout[r], bpr, st[r]);
      check(rc == 0, "multi-GPU alltoall rank %d returned %d", r, rc);
    }
    sync_all();
    for (int r = 0; r < n; ++r) {
      std::vector<uint8_t> want(bpr * n);
      for (int q = 0; q < n; ++q)
        memcpy(want.data() + q * bpr, in[q].data() + r * bpr, bpr);
      CK(cudaSetDevice(r));
      std::vector<uint8_t> got = download(dout[r], bpr * n);
      size_t d = first_diff(got.data(), want.data(), bpr * n);
      check(d == bpr * n, "multi-GPU alltoall %zu rank %d: differs at byte %zu",
            bpr, r, d);
    }
  }
  bool st_ok = true;
  for (int r = 0; r < n; ++r) st_ok = st_ok && *status[r] == 0;
  check(st_ok, "multi-GPU: a status word is not 0");
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaFree(ws[r]));
    CK(cudaFree(din[r]));
    CK(cudaFree(dout[r]));
    CK(cudaFree(table[r]));
    CK(cudaStreamDestroy(st[r]));
    CK(cudaFreeHost(active[r]));
    CK(cudaFreeHost(status[r]));
  }
  CK(cudaSetDevice(0));
  group_line("%d GPUs, one rank each: allreduce and alltoall", n);
}

int main(int argc, char **argv) {
  /* One hardware queue per rank's stream: with fewer, a rank's kernel can
   * queue behind a peer's spinning one and the pair waits out the timeout.
   * Must be set before the first CUDA call. */
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    printf("devcoll_test: no CUDA device (%s); skipping\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "count is 0");
    return 77;
  }
  unsigned long long seed =
      argc > 1 ? strtoull(argv[1], nullptr, 0)
               : (unsigned long long)std::chrono::steady_clock::now()
                     .time_since_epoch()
                     .count();
  printf("devcoll_test: seed %llu (rerun with: devcoll_test %llu)\n", seed,
         seed);
  g_rng.seed(seed);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("devcoll_test: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  auto t_start = std::chrono::steady_clock::now();
  std::vector<int> ns = {1, 2, 3, 4, 8};
  if (argc > 2) {
    ns.clear();
    for (int i = 2; i < argc; ++i) ns.push_back(atoi(argv[i]));
  }
  for (int n : ns) {
    if (n < 1 || n > MEP__DC_MAX_RANKS) continue;
    /* Every rank's blocks must be resident at once: a rank's kernel spins
     * until its peers' kernels run. */
    int sms = prop.multiProcessorCount / n;
    if (sms > 16) sms = 16;
    Sim s;
    sim_open(s, n, sms, (9u << 20) + 4096);
    test_args(s);
    test_allreduce(s);
    test_reduce_scatter(s);
    test_allgather(s);
    test_alltoall(s);
    for (int algo = 0; algo <= 2; ++algo) test_broadcast(s, algo);
    test_no_show(s, 1);
    test_no_show(s, 2);
    test_no_show(s, 3);
    test_broadcast_lost(s, false);
    test_broadcast_lost(s, true);
    test_inactive(s);
    test_graph(s);
    sim_close(s);
    printf("N=%d done after %.1f s\n", n,
           std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         t_start).count());
  }
  if (ndev >= 2) test_multi_gpu(ndev);
  else printf("devcoll_test: one GPU; the multi-GPU checks are skipped\n");
  uint8_t *da, *db;
  CK(cudaMalloc(&da, 1 << 20));
  CK(cudaMalloc(&db, 1 << 20));
  test_local(da, db);
  CK(cudaFree(da));
  CK(cudaFree(db));

  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
