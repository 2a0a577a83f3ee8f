/* Multi-process put/signal: every rank writes random data of odd sizes at
 * odd offsets into every rank's region (itself included), signals, and the
 * receiver checks every byte and the bytes around it.
 * usage: test_putsignal NRANKS MAX_BYTES */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "launch.h"

static size_t max_bytes;

static uint64_t seed_of(int src, int dst, int round) {
  return ((uint64_t)src << 40) ^ ((uint64_t)dst << 20) ^ (uint64_t)round ^
         0x5eedull;
}

static uint8_t fill_of(int round) { return (uint8_t)(0xA5 ^ round * 29); }

static const size_t sizes[] = {0, 1, 7, 4095, 65537, (1u << 20) + 3,
                               (3u << 20) + 5, (size_t)64 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store, (void)arg;
  int me = mep_comm_rank(comm), n = mep_comm_size(comm);
  size_t slot = max_bytes + 128;
  /* Region lengths differ per rank on purpose: bounds are per instance. */
  size_t total = slot * (size_t)n + (size_t)me * 13;
  uint8_t *send = malloc(total), *recv = malloc(total);
  uint64_t *sig = calloc(2 * (size_t)n, sizeof *sig);
  CHECK(send && recv && sig, "out of memory");
  mep_region_t *rs, *rr, *rg;
  CHECK_OK(mep_region_register(comm, send, total, MEP_MEM_HOST, &rs));
  CHECK_OK(mep_region_register(comm, recv, total, MEP_MEM_HOST, &rr));
  CHECK_OK(mep_region_register(comm, sig, 2 * (size_t)n * 8, MEP_MEM_HOST,
                               &rg));
  int round = 0;
  for (size_t si = 0; si < NSIZES; si++) {
    size_t len = sizes[si];
    if (len > max_bytes) continue;
    round++;
    size_t roff = 1 + (size_t)(round * 37 % 61), soff = 3 + (size_t)round;
    memset(recv, fill_of(round), total);
    for (int p = 0; p < n; p++)  /* ready: my region may be written */
      CHECK_OK(mep_signal(comm, p, rg, (size_t)(n + me) * 8, 1,
                          MEP_SIGNAL_ADD));
    for (int p = 0; p < n; p++)
      CHECK_OK(mep_wait(rg, (size_t)(n + p) * 8, (uint64_t)round, 30000,
                        NULL));
    for (int d = 0; d < n; d++) {
      uint8_t *src = send + (size_t)d * slot + soff;
      fill_random(src, len, seed_of(me, d, round));
      CHECK_OK(mep_put(comm, d, rs, (size_t)d * slot + soff, rr,
                       (size_t)me * slot + roff, len));
      CHECK_OK(mep_signal(comm, d, rg, (size_t)me * 8, 1, MEP_SIGNAL_ADD));
    }
    for (int s = 0; s < n; s++) {
      CHECK_OK(mep_wait(rg, (size_t)s * 8, (uint64_t)round, 30000, NULL));
      const uint8_t *got = recv + (size_t)s * slot + roff;
      long long bad = diff_random(got, len, seed_of(s, me, round));
      CHECK(bad < 0, "rank %d: %zu bytes from rank %d: byte %lld differs",
            me, len, s, bad);
      CHECK(got[-1] == fill_of(round) && got[len] == fill_of(round),
            "rank %d: bytes around the %zu written by rank %d changed", me,
            len, s);
    }
    CHECK_OK(mep_flush(comm, 30000));
  }
  /* Nobody may leave (and close connections) before all have checked. */
  for (int p = 0; p < n; p++)
    CHECK_OK(mep_signal(comm, p, rg, (size_t)(n + me) * 8, 1,
                        MEP_SIGNAL_ADD));
  for (int p = 0; p < n; p++)
    CHECK_OK(mep_wait(rg, (size_t)(n + p) * 8, (uint64_t)round + 1, 30000,
                      NULL));
  CHECK_OK(mep_region_deregister(rg));
  CHECK_OK(mep_region_deregister(rr));
  CHECK_OK(mep_region_deregister(rs));
  free(send);
  free(recv);
  free(sig);
  return 0;
}

int main(int argc, char **argv) {
  CHECK(argc == 3, "usage: test_putsignal NRANKS MAX_BYTES");
  int n = atoi(argv[1]);
  max_bytes = strtoull(argv[2], NULL, 0);
  mep_launch_opts_t o = {.size = n, .timeout_ms = 240000,
                         .name = "putsignal"};
  int failed = mep_launch(&o, body, NULL);
  CHECK(failed == 0, "%d of %d ranks failed", failed, n);
  printf("ok: %d ranks, sizes up to %zu bytes\n", n, max_bytes);
  return 0;
}
