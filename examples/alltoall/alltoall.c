/* alltoall - a small program on mep's public API: every rank writes a block
 * to every other rank with one-sided puts, signals it, waits for everyone's
 * blocks, checks them and reports the exchange's bandwidth.
 *
 *   alltoall --rank R --size N --store HOST:PORT [--bytes B] [--iters I]
 *
 * Rank 0 serves the rendezvous store on PORT (other ranks connect to it);
 * run one process per rank, on one host or several. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mep/mep.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The value rank `src` puts at index i of its block for `dst` in `iter`. */
static uint32_t value(int src, int dst, int iter, size_t i) {
  return (uint32_t)(src * 2654435761u) ^ (uint32_t)(dst * 40503u) ^
         (uint32_t)(iter * 977u) ^ (uint32_t)i;
}

static int die(const char *what, int rc) {
  fprintf(stderr, "alltoall: %s: %s: %s\n", what, mep_strerror(rc),
          mep_last_error());
  return 1;
}

static void usage(FILE *f) {
  fprintf(f, "usage: alltoall --rank R --size N --store HOST:PORT "
             "[--bytes B] [--iters I]\n"
             "  Exchanges B bytes (default 1 MiB) between every pair of N "
             "ranks I times\n  (default 20) with one-sided puts and checks "
             "every word. Rank 0 serves the\n  store on PORT.\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"rank", required_argument, 0, 'r'}, {"size", required_argument, 0, 'n'},
      {"store", required_argument, 0, 's'}, {"bytes", required_argument, 0, 'b'},
      {"iters", required_argument, 0, 'i'}, {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  int rank = -1, size = 0, iters = 20, c;
  size_t bytes = 1 << 20;
  char host[256] = "";
  int port = 0;
  while ((c = getopt_long(argc, argv, "r:n:s:b:i:h", opts, NULL)) != -1) {
    switch (c) {
    case 'r': rank = atoi(optarg); break;
    case 'n': size = atoi(optarg); break;
    case 's': if (sscanf(optarg, "%255[^:]:%d", host, &port) != 2) port = -1;
              break;
    case 'b': bytes = strtoull(optarg, NULL, 0); break;
    case 'i': iters = atoi(optarg); break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (rank < 0 || size < 1 || rank >= size || port <= 0 || iters < 1) {
    usage(stderr);
    return 2;
  }
  bytes = (bytes + 3) & ~(size_t)3;
  size_t words = bytes / 4;

  mep_store_server_t *srv = NULL;
  int rc = rank == 0 ? mep_store_server_start(host, port, &srv) : MEP_OK;
  if (rc) return die("store server", rc);
  mep_store_t *store;
  if ((rc = mep_store_tcp_connect(host, port, 30000, &store)))
    return die("store", rc);
  mep_comm_t *comm;
  if ((rc = mep_comm_create(store, rank, size, NULL, &comm)))
    return die("communicator", rc);

  uint32_t *send = malloc(bytes * (size_t)size);
  uint32_t *recv = malloc(bytes * (size_t)size);
  uint64_t *sig = calloc((size_t)size, sizeof *sig);
  if (!send || !recv || !sig) return die("memory", MEP_ERR_NOMEM);
  mep_region_t *rs, *rr, *rg;
  if ((rc = mep_region_register(comm, send, bytes * (size_t)size,
                                MEP_MEM_HOST, &rs)) ||
      (rc = mep_region_register(comm, recv, bytes * (size_t)size,
                                MEP_MEM_HOST, &rr)) ||
      (rc = mep_region_register(comm, sig, (size_t)size * 8, MEP_MEM_HOST,
                                &rg)))
    return die("register", rc);

  double t0 = 0;
  for (int it = 0; it <= iters; it++) { /* iteration 0 warms up */
    if (it == 1) t0 = now_s();
    for (int d = 0; d < size; d++)
      for (size_t i = 0; i < words; i++)
        send[(size_t)d * words + i] = value(rank, d, it, i);
    /* Block for d goes to slot `rank` of d's receive buffer. The word of
     * each source only grows (two steps per iteration: data, then the
     * barrier), so it never needs resetting. */
    for (int k = 1; k <= size; k++) {
      int d = (rank + k) % size;
      if ((rc = mep_put(comm, d, rs, (size_t)d * bytes, rr,
                        (size_t)rank * bytes, bytes)) ||
          (rc = mep_signal(comm, d, rg, (size_t)rank * 8, 1, MEP_SIGNAL_ADD)))
        return die("put", rc);
    }
    for (int s = 0; s < size; s++)
      if ((rc = mep_wait(rg, (size_t)s * 8, 2 * (uint64_t)it + 1, -1, NULL)))
        return die("wait", rc);
    for (int s = 0; s < size; s++)
      for (size_t i = 0; i < words; i++)
        if (recv[(size_t)s * words + i] != value(s, rank, it, i)) {
          fprintf(stderr, "alltoall: rank %d: word %zu from rank %d is wrong "
                          "in iteration %d\n", rank, i, s, it);
          return 1;
        }
    if ((rc = mep_flush(comm, -1))) return die("flush", rc);
    /* Nobody overwrites a block before its reader checked it: the next
     * iteration's data is only sent after this barrier of signals. */
    for (int d = 0; d < size; d++)
      if ((rc = mep_signal(comm, d, rg, (size_t)rank * 8, 1, MEP_SIGNAL_ADD)))
        return die("barrier", rc);
    for (int s = 0; s < size; s++)
      if ((rc = mep_wait(rg, (size_t)s * 8, 2 * (uint64_t)it + 2, -1, NULL)))
        return die("barrier", rc);
  }
  double dt = now_s() - t0;
  printf("rank %d: %d iterations of %zu bytes to each of %d ranks checked; "
         "%.2f GB/s sent per rank (", rank, iters, bytes, size,
         (double)bytes * (size - 1) * iters / dt / 1e9);
  for (int p = 0; p < size; p++)
    printf("%s%d:%s", p ? " " : "", p, mep_comm_route(comm, p));
  printf(")\n");
  mep_comm_destroy(comm);
  mep_store_destroy(store);
  mep_store_server_stop(srv);
  free(send);
  free(recv);
  free(sig);
  return 0;
}
