/* args.c - mep-perf's command line. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "perf.h"

static void usage(FILE *out) {
  fprintf(out,
"usage: mep-perf [-n N | --store HOST:PORT --rank R --size N] [-o OP]\n"
"                [-b MIN] [-e MAX] [-f FACTOR] [-d DTYPE] [-r REDOP]\n"
"                [-w WARMUP] [-i ITERS] [-c] [--root R] [-t TIMEOUT_MS]\n"
"                [--csv] [--seed S]\n"
"\n"
"Measures mep's collectives and point-to-point over a sweep of message\n"
"sizes, in the manner of nccl-tests.\n"
"\n"
"Ranks:\n"
"  -n, --nranks N        fork N local ranks around a built-in store\n"
"                        (default 2)\n"
"      --store HOST:PORT run as one rank of a group spread over hosts: rank 0\n"
"                        serves the store on HOST:PORT, the others connect;\n"
"                        with port 0 rank 0 picks a free port and prints\n"
"                        \"mep-perf: store at HOST:PORT\" to stderr\n"
"      --rank R          this process's rank (with --store)\n"
"      --size N          the number of ranks (with --store)\n"
"\n"
"What to measure:\n"
"  -o, --op OP           allreduce (default), broadcast, reduce, allgather,\n"
"                        reduce_scatter, alltoall, alltoallv, gather,\n"
"                        scatter, barrier, sendrecv (ring: to rank+1, from\n"
"                        rank-1), pingpong (ranks 0 and 1; the time is half\n"
"                        a round trip)\n"
"  -b, --minbytes SIZE   smallest size (default 8); K, M, G suffixes (1024)\n"
"  -e, --maxbytes SIZE   largest size (default 64M)\n"
"  -f, --stepfactor F    multiply the size by F at each step (default 2)\n"
"  -d, --datatype TYPE   float16, bfloat16, float32 (default), float64, int8,\n"
"                        uint8, int32, int64, bool (also half, float, double)\n"
"  -r, --redop OP        sum (default), prod, min, max, avg\n"
"      --root R          root of broadcast, reduce, gather, scatter\n"
"                        (default 0)\n"
"  -w, --warmup N        untimed iterations per size (default 5)\n"
"  -i, --iters N         timed iterations per size (default 20)\n"
"  -c, --check           check every timed iteration's result against a\n"
"                        reference computed independently (inputs differ per\n"
"                        rank and iteration); the check is not timed, but a\n"
"                        barrier precedes each timed iteration\n"
"      --in-place        allreduce into its input buffer, as\n"
"                        torch.distributed calls it (the library keeps a copy\n"
"                        of the input for a retry after a lost rank)\n"
"      --inject-error    (to test mep-perf itself) spoil the first output\n"
"                        element of each rank after each call; -c must\n"
"                        count it\n"
"      --seed S          seed of the inputs (default 1)\n"
"  -t, --timeout MS      deadline of every wait (default 30000); also the\n"
"                        communicator's timeout unless MEP_CORE_TIMEOUT_MS\n"
"                        is set\n"
"      --csv             print the table as CSV\n"
"  -h, --help            this text\n"
"\n"
"Columns: size is the bytes of the larger of a rank's send and receive\n"
"buffers, count the elements passed to the call (alltoallv: the elements a\n"
"rank sends in all, split unevenly), time the average over the timed\n"
"iterations (us) and the maximum over ranks, algbw the bytes of the\n"
"operation over the time, busbw algbw times the bus factor of nccl-tests:\n"
"allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall(v), gather,\n"
"scatter (n-1)/n; broadcast, reduce, sendrecv, pingpong 1. #wrong counts\n"
"the wrong elements over all ranks with -c, N/A without. A float result\n"
"is right within (n+1)*u_acc + u_dtype times the sum (prod: product) of\n"
"the inputs' magnitudes, u_acc being the unit roundoff of float32 (of\n"
"float64 for float64); min, max, integers and bool must be exact.\n"
"\n"
"Exits 0 when every operation succeeded without wrong elements, 1 when one\n"
"failed or was wrong, 2 for a bad argument.\n");
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "mep-perf: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(mep-perf --help lists the options)\n");
  va_end(ap);
  return 2;
}

/* A decimal number with an optional K, M or G (powers of 1024) suffix. */
static int parse_size(const char *s, size_t *out) {
  if (!isdigit((unsigned char)*s)) return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  int shift = 0;
  switch (toupper((unsigned char)*end)) {
  case 'K': shift = 10; end++; break;
  case 'M': shift = 20; end++; break;
  case 'G': shift = 30; end++; break;
  default: break;
  }
  if (*end || v > (SIZE_MAX >> shift)) return -1;
  *out = (size_t)v << shift;
  return 0;
}

static int parse_int(const char *s, int lo, int *out) {
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > INT_MAX) return -1;
  *out = (int)v;
  return 0;
}

static int parse_dtype(const char *s, mep_dtype_t *out) {
  static const struct { const char *alias; mep_dtype_t dt; } aliases[] = {
      {"half", MEP_FLOAT16}, {"float", MEP_FLOAT32}, {"double", MEP_FLOAT64},
      {"bf16", MEP_BFLOAT16}, {"int", MEP_INT32}};
  for (int d = 0; d < MEP_DTYPE_COUNT; d++) {
    const char *name = mep_dtype_name((mep_dtype_t)d);
    if (name && strcasecmp(s, name) == 0) {
      *out = (mep_dtype_t)d;
      return 0;
    }
  }
  for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
    if (strcasecmp(s, aliases[i].alias) == 0) {
      *out = aliases[i].dt;
      return 0;
    }
  return -1;
}

static int parse_redop(const char *s, mep_op_t *out) {
  for (int op = 0; op < MEP_OP_COUNT; op++) {
    const char *name = mep_op_name((mep_op_t)op);
    if (name && strcasecmp(s, name) == 0) {
      *out = (mep_op_t)op;
      return 0;
    }
  }
  return -1;
}

/* HOST:PORT, with HOST in brackets when it is an IPv6 address. */
static int parse_store(char *s, perf_opts_t *o) {
  char *colon = strrchr(s, ':');
  if (!colon || colon == s) return -1;
  *colon = '\0';
  if (s[0] == '[') {
    size_t len = strlen(s);
    if (len < 3 || s[len - 1] != ']') return -1;
    s[len - 1] = '\0';
    s++;
  }
  o->store_host = s;
  return parse_int(colon + 1, 0, &o->store_port) || o->store_port > 65535
             ? -1 : 0;
}

enum {
  OPT_STORE = 256,
  OPT_RANK,
  OPT_SIZE,
  OPT_ROOT,
  OPT_CSV,
  OPT_SEED,
  OPT_INJECT,
  OPT_INPLACE
};

/* Cross-option rules, once every option is known. */
static int validate(perf_opts_t *o, int nset) {
  const perf_opdesc_t *d = perf_op(o->kind);
  if (o->store_host) {
    if (nset) return bad("-n cannot be combined with --store");
    if (o->rank < 0 || o->size < 1)
      return bad("--store needs --rank R and --size N");
    if (o->rank >= o->size)
      return bad("--rank %d is not below --size %d", o->rank, o->size);
    if (o->store_port == 0 && o->rank != 0)
      return bad("--store port 0 (pick a free one) is for rank 0 only");
  } else if (o->rank >= 0 || o->size > 0) {
    return bad("--rank and --size need --store HOST:PORT");
  }
  int n = o->store_host ? o->size : o->nlocal;
  if (n < d->min_ranks)
    return bad("-o %s needs at least %d ranks, not %d", d->name,
               d->min_ranks, n);
  if (d->rooted && o->root >= n)
    return bad("--root %d is not a rank of the group of %d", o->root, n);
  if (d->reduces && o->dtype == MEP_BOOL && o->redop == MEP_AVG)
    return bad("-r avg is not defined on bool");
  if (o->inject && !o->check)
    return bad("--inject-error needs -c");
  if (o->inplace && o->kind != PERF_ALLREDUCE)
    return bad("--in-place is for -o allreduce, not -o %s", d->name);
  if (o->min_bytes > o->max_bytes)
    return bad("-b %zu exceeds -e %zu", o->min_bytes, o->max_bytes);
  return 0;
}

int perf_parse_args(int argc, char **argv, perf_opts_t *o) {
  static const struct option longs[] = {
      {"nranks", required_argument, 0, 'n'},
      {"store", required_argument, 0, OPT_STORE},
      {"rank", required_argument, 0, OPT_RANK},
      {"size", required_argument, 0, OPT_SIZE},
      {"op", required_argument, 0, 'o'},
      {"minbytes", required_argument, 0, 'b'},
      {"maxbytes", required_argument, 0, 'e'},
      {"stepfactor", required_argument, 0, 'f'},
      {"datatype", required_argument, 0, 'd'},
      {"redop", required_argument, 0, 'r'},
      {"root", required_argument, 0, OPT_ROOT},
      {"warmup", required_argument, 0, 'w'},
      {"iters", required_argument, 0, 'i'},
      {"check", no_argument, 0, 'c'},
      {"seed", required_argument, 0, OPT_SEED},
      {"timeout", required_argument, 0, 't'},
      {"csv", no_argument, 0, OPT_CSV},
      {"inject-error", no_argument, 0, OPT_INJECT},
      {"in-place", no_argument, 0, OPT_INPLACE},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  *o = (perf_opts_t){.nlocal = 2, .rank = -1, .size = 0,
                     .kind = PERF_ALLREDUCE, .dtype = MEP_FLOAT32,
                     .redop = MEP_SUM, .min_bytes = 8, .max_bytes = 64 << 20,
                     .factor = 2, .warmup = 5, .iters = 20,
                     .timeout_ms = 30000, .seed = 1};
  int c, nset = 0, v;
  opterr = 1;
  while ((c = getopt_long(argc, argv, "n:o:b:e:f:d:r:w:i:ct:h", longs,
                          NULL)) != -1) {
    switch (c) {
    case 'n':
      if (parse_int(optarg, 1, &o->nlocal))
        return bad("-n: '%s' is not a positive number of ranks", optarg);
      nset = 1;
      break;
    case OPT_STORE:
      if (parse_store(optarg, o))
        return bad("--store: '%s' is not HOST:PORT", optarg);
      break;
    case OPT_RANK:
      if (parse_int(optarg, 0, &o->rank))
        return bad("--rank: '%s' is not a rank", optarg);
      break;
    case OPT_SIZE:
      if (parse_int(optarg, 1, &o->size))
        return bad("--size: '%s' is not a positive number", optarg);
      break;
    case 'o':
      if ((v = perf_op_find(optarg)) < 0)
        return bad("-o: unknown operation '%s'", optarg);
      o->kind = (perf_kind_t)v;
      break;
    case 'b':
    case 'e':
      if (parse_size(optarg, c == 'b' ? &o->min_bytes : &o->max_bytes))
        return bad("%s: '%s' is not a size (bytes, with an optional K, M or "
                   "G suffix)", c == 'b' ? "-b" : "-e", optarg);
      break;
    case 'f':
      if (parse_int(optarg, 2, &v))
        return bad("-f: '%s' is not a whole factor of 2 or more", optarg);
      o->factor = (size_t)v;
      break;
    case 'd':
      if (parse_dtype(optarg, &o->dtype))
        return bad("-d: unknown data type '%s'", optarg);
      break;
    case 'r':
      if (parse_redop(optarg, &o->redop))
        return bad("-r: unknown reduction '%s' (sum, prod, min, max, avg)",
                   optarg);
      break;
    case OPT_ROOT:
      if (parse_int(optarg, 0, &o->root))
        return bad("--root: '%s' is not a rank", optarg);
      break;
    case 'w':
      if (parse_int(optarg, 0, &o->warmup))
        return bad("-w: '%s' is not a count of iterations", optarg);
      break;
    case 'i':
      if (parse_int(optarg, 1, &o->iters))
        return bad("-i: '%s' is not a positive count of iterations", optarg);
      break;
    case 'c': o->check = 1; break;
    case OPT_SEED: {
      char *end;
      errno = 0;
      o->seed = strtoull(optarg, &end, 0);
      if (errno || end == optarg || *end)
        return bad("--seed: '%s' is not a number", optarg);
      break;
    }
    case 't':
      if (parse_int(optarg, 1, &o->timeout_ms))
        return bad("-t: '%s' is not a positive number of milliseconds",
                   optarg);
      break;
    case OPT_CSV: o->csv = 1; break;
    case OPT_INJECT: o->inject = 1; break;
    case OPT_INPLACE: o->inplace = 1; break;
    case 'h': usage(stdout); return 1;
    default:
      fprintf(stderr, "(mep-perf --help lists the options)\n");
      return 2;
    }
  }
  if (optind < argc)
    return bad("unexpected argument '%s'", argv[optind]);
  return validate(o, nset);
}

int perf_next_size(const perf_opts_t *o, size_t *s) {
  if (*s == 0 && o->max_bytes > 0) {
    *s = 1;
    return 1;
  }
  if (*s == 0 || *s > o->max_bytes / o->factor) return 0;
  *s *= o->factor;
  return 1;
}
