/* cuda_nogpu.c - on a machine without a usable GPU (or a libmep built
 * without CUDA) the CUDA collectives refuse clearly: bad arguments with
 * MEP_ERR_INVALID, everything else with MEP_ERR_UNSUPPORTED naming why,
 * and the host collectives of the same communicator keep working. Skipped
 * (77) where a GPU is usable: tests/gpu/run.sh covers that side. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <mep/mep.h>

#include "../../tools/common/launch.h"
#include "gpu_probe.h"

static int fails;
#define EXPECT(c, ...)                                            \
  do {                                                            \
    if (!(c)) {                                                   \
      fails++;                                                    \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, "\n");                                      \
    }                                                             \
  } while (0)

static int body(mep_comm_t *comm, mep_store_t *store, void *arg) {
  (void)store;
  (void)arg;
  float x[3] = {1, 2, 3}, y[3] = {0};
  mep_req_t *req = (mep_req_t *)&fails; /* must be reset to NULL */
  EXPECT(mep_allreduce_cuda(NULL, x, y, 3, MEP_FLOAT32, MEP_SUM, NULL,
                            NULL) == MEP_ERR_INVALID, "NULL comm");
  EXPECT(mep_allreduce_cuda(comm, x, y, 3, (mep_dtype_t)99, MEP_SUM, NULL,
                            &req) == MEP_ERR_INVALID && req == NULL,
         "unknown dtype: %s", mep_last_error());
  EXPECT(mep_broadcast_cuda(comm, y, 3, MEP_FLOAT32, 5, NULL, NULL) ==
             MEP_ERR_INVALID, "root out of range");
  int rc = mep_allreduce_cuda(comm, x, y, 3, MEP_FLOAT32, MEP_SUM, NULL, NULL);
  EXPECT(rc == MEP_ERR_UNSUPPORTED && strstr(mep_last_error(), "CUDA"),
         "allreduce_cuda: %d %s", rc, mep_last_error());
  EXPECT(mep_alltoall_cuda(comm, x, y, 1, MEP_FLOAT32, NULL, NULL) ==
             MEP_ERR_UNSUPPORTED, "alltoall_cuda");
  EXPECT(mep_cuda_path(comm) == NULL, "a CUDA path without a GPU");
  /* the communicator is unharmed */
  rc = mep_allreduce(comm, x, y, 3, MEP_FLOAT32, MEP_SUM, NULL);
  int n = mep_comm_size(comm);
  EXPECT(rc == MEP_OK && y[0] == n && y[2] == 3 * n, "host allreduce: %d",
         rc);
  return fails != 0;
}

int main(int argc, char **argv) {
  if (argc > 1) {
    printf("usage: cuda_nogpu (no arguments)\n");
    return strcmp(argv[1], "--help") ? 2 : 0;
  }
  if (gpu_usable()) {
    printf("cuda_nogpu: a GPU is usable here: skipped\n");
    return 77;
  }
  mep_launch_opts_t o = {.size = 2, .timeout_ms = 60000, .name = "nogpu"};
  int bad = mep_launch(&o, body, NULL);
  printf("%d passed, %d failed\n", bad ? 0 : 1, bad ? 1 : 0);
  return bad ? 1 : 0;
}
