/* ep_trace.c - MEP_EP_TRACE=1: where the time of a call goes inside the
 * kernels (no profiler reaches kernels that wait on another GPU). Each
 * block stamps %globaltimer at its start, when its wait or work is done,
 * (where a kernel waits first) when its work after the wait is done, and
 * (the last block) at its end, into mapped host memory; the buffer's
 * destruction prints, for the last call of each kernel, the times from
 * the first block's start to the last block's start, to the last "mid"
 * and "work done" stamps and to the end, and where each kernel began
 * against the dispatch (or combine) send of the same call and on the
 * GPU's clock, when its blocks entered it (before any gate or wait), and
 * the median and largest of the blocks' own times from start to mid and
 * from mid to work done. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_cuda.h"

static const char *const kind_name[MEP__EP_KINDS] = {
    "dispatch send", "dispatch recv", "combine send", "combine recv"};

int mep__ep_trace_init(mep__ep_trace_t *t) {
  memset(t, 0, sizeof *t);
  const char *v = getenv("MEP_EP_TRACE");
  if (!v || strcmp(v, "1") != 0) return 0;
  size_t bytes = (size_t)MEP__EP_KINDS * MEP__EP_TRACE_BLOCKS *
                 MEP__EP_T_FIELDS * sizeof(uint64_t);
  void *h = NULL, *d = NULL;
  if (cudaHostAlloc(&h, bytes, cudaHostAllocMapped) != cudaSuccess ||
      cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    if (h) cudaFreeHost(h);
    fprintf(stderr, "mep_ep: MEP_EP_TRACE=1 ignored: no mapped host memory\n");
    return 0;
  }
  memset(h, 0, bytes);
  t->host = h;
  t->dev = d;
  return 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* ", NAME median M, max X" of the n durations d (ns), sorted here. */
static void spread(char *out, size_t len, const char *name, uint64_t *d,
                   int n) {
  if (n <= 0) return;
  qsort(d, (size_t)n, sizeof *d, cmp_u64);
  snprintf(out, len, ", %s median %.1f max %.1f", name, d[n / 2] / 1e3,
           d[n - 1] / 1e3);
}

static double us(uint64_t a, uint64_t b) {
  return ((double)a - (double)b) / 1e3;
}

/* %globaltimer in us, modulo 1000 s: the GPUs of one host keep it in step
 * (to within a microsecond or so), so the ranks' lines can be set side by
 * side. */
static double clock_us(uint64_t ns) {
  return (double)(ns % 1000000000000ull) / 1e3;
}

void mep__ep_trace_report(mep__ep_trace_t *t, int rank) {
  if (!t->host) return;
  uint64_t first[MEP__EP_KINDS] = {0};
  for (int k = 0; k < MEP__EP_KINDS; k++) {
    int n = t->blocks[k] < MEP__EP_TRACE_BLOCKS ? t->blocks[k]
                                                : MEP__EP_TRACE_BLOCKS;
    uint64_t s0 = UINT64_MAX, s1 = 0, mid = 0, end = 0, work = 0;
    uint64_t e0 = UINT64_MAX, e1 = 0;
    /* each block's own phases: the maxima above mix blocks that began
     * at different times */
    uint64_t wait_ns[MEP__EP_TRACE_BLOCKS], work_ns[MEP__EP_TRACE_BLOCKS];
    int nwait = 0, nwork = 0;
    for (int b = 0; b < n; b++) {
      const uint64_t *r = t->host + ((size_t)k * MEP__EP_TRACE_BLOCKS + b) *
                                        MEP__EP_T_FIELDS;
      if (!r[MEP__EP_T_START]) continue;
      if (r[MEP__EP_T_START] < s0) s0 = r[MEP__EP_T_START];
      if (r[MEP__EP_T_START] > s1) s1 = r[MEP__EP_T_START];
      if (r[MEP__EP_T_MID] > mid) mid = r[MEP__EP_T_MID];
      if (r[MEP__EP_T_END] > end) end = r[MEP__EP_T_END];
      if (r[MEP__EP_T_WORK] > work) work = r[MEP__EP_T_WORK];
      if (r[MEP__EP_T_MID] >= r[MEP__EP_T_START])
        wait_ns[nwait++] = r[MEP__EP_T_MID] - r[MEP__EP_T_START];
      if (r[MEP__EP_T_MID] && r[MEP__EP_T_WORK] >= r[MEP__EP_T_MID])
        work_ns[nwork++] = r[MEP__EP_T_WORK] - r[MEP__EP_T_MID];
      uint64_t in = r[MEP__EP_T_ENTRY];
      if (in && in < e0) e0 = in;
      if (in > e1) e1 = in;
    }
    if (!s1) continue;
    first[k] = s0;
    uint64_t ref = first[k & ~1] ? first[k & ~1] : s0; /* the call's send */
    /* one write per line: the ranks share stderr */
    char line[480], wl[48] = "", el[64] = "", sw[64] = "", sk[64] = "";
    spread(sw, sizeof sw, "start to mid", wait_ns, nwait);
    spread(sk, sizeof sk, "mid to work done", work_ns, nwork);
    if (work)
      snprintf(wl, sizeof wl, ", last work done +%.1f", us(work, s0));
    if (e1)
      snprintf(el, sizeof el, "; blocks entered %+.1f to %+.1f", us(e0, s0),
               us(e1, s0));
    snprintf(line, sizeof line,
             "mep_ep trace rank %d %s (%d blocks): begins %+.1f us after "
             "the send began (clock %.1f); last block starts +%.1f, last "
             "mid +%.1f%s, end +%.1f us%s; per block (us)%s%s\n",
             rank, kind_name[k], n, us(s0, ref), clock_us(s0), us(s1, s0),
             mid ? us(mid, s0) : 0.0, wl, end ? us(end, s0) : 0.0, el, sw,
             sk);
    fputs(line, stderr);
  }
  cudaFreeHost(t->host);
  t->host = t->dev = NULL;
}
