/* Bad input to the core: each case gets its clear error and nothing else
 * breaks. Environment-driven cases run in a forked child each, so the
 * variables of one case never leak into the next. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "launch.h"

static int port;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static mep_store_t *store_connect(void) {
  mep_store_t *s = NULL;
  CHECK_OK(mep_store_tcp_connect("127.0.0.1", port, 10000, &s));
  return s;
}

/* Creates a communicator and expects it to fail with `want` and a message
 * holding every needle. */
static void expect_create_fails(const char *name, int rank, int size,
                                int want, const char *const *needles) {
  mep_store_t *s = store_connect();
  mep_comm_opts_t o = {.struct_size = sizeof o, .name = name,
                       .timeout_ms = 10000};
  mep_comm_t *comm = NULL;
  CHECK_RC(mep_comm_create(s, rank, size, &o, &comm), want);
  CHECK(comm == NULL, "no communicator on failure");
  for (; needles && *needles; needles++) CHECK_MSG(*needles);
  printf("  %s: %s\n", name, mep_last_error());
  mep_store_destroy(s);
}

typedef void (*case_fn)(void);

/* Runs a case in a child process; returns its exit status. */
static int run_case(const char *name, case_fn fn) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    fn();
    _exit(0);
  }
  int status;
  waitpid(pid, &status, 0);
  int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  printf("%s %s\n", ok ? "PASS" : "FAIL", name);
  return !ok;
}

static void unknown_transport(void) {
  setenv("MEP_TRANSPORTS", "tcp,nosuch", 1);
  expect_create_fails("unknown", 0, 1, MEP_ERR_NOT_FOUND,
                      (const char *const[]){"nosuch", "tried",
                                            "MEP_TRANSPORTS", NULL});
}

static void bad_name(void) {
  setenv("MEP_TRANSPORTS", "tcp,../evil", 1);
  expect_create_fails("badname", 0, 1, MEP_ERR_INVALID,
                      (const char *const[]){"../evil", NULL});
}

static void empty_list(void) {
  setenv("MEP_TRANSPORTS", "tcp,,shm", 1);
  expect_create_fails("emptylist", 0, 1, MEP_ERR_CONFIG,
                      (const char *const[]){"MEP_TRANSPORTS", NULL});
}

static void wrong_abi(void) {
  setenv("MEP_TRANSPORTS", "badabi,tcp", 1);
  expect_create_fails("abi", 0, 1, MEP_ERR_ABI,
                      (const char *const[]){"libmep-transport-badabi.so",
                                            "ABI 2.", "speaks 1.", NULL});
}

static void malformed_config(void) {
  char path[] = "/tmp/mep-badcfg-XXXXXX";
  int fd = mkstemp(path);
  const char text[] = "[core]\ntimeout_ms = 100\nthis line is not ini\n";
  CHECK(write(fd, text, sizeof text - 1) == (ssize_t)sizeof text - 1, "w");
  close(fd);
  setenv("MEP_CONFIG", path, 1);
  char where[64];
  snprintf(where, sizeof where, "%s:3", path);
  expect_create_fails("badcfg", 0, 1, MEP_ERR_CONFIG,
                      (const char *const[]){where, NULL});
  unlink(path);
}

static void bad_rank(void) {
  expect_create_fails("badrank", 3, 3, MEP_ERR_INVALID,
                      (const char *const[]){"rank 3", NULL});
  expect_create_fails("badsize", 0, 0, MEP_ERR_INVALID, NULL);
}

/* Both ranks exclude tcp, leaving only transports that are absent here. */
static void nothing_reaches(void) {
  setenv("MEP_TRANSPORTS", "^tcp", 1);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    expect_create_fails("unreach", 1, 2, MEP_ERR_UNREACHABLE,
                        (const char *const[]){"rank 0", "nvlink", NULL});
    _exit(0);
  }
  expect_create_fails("unreach", 0, 2, MEP_ERR_UNREACHABLE,
                      (const char *const[]){"rank 1", "verbs", NULL});
  int status;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 1 case failed");
}

/* Misuse of a working single-rank communicator. */
static void misuse(void) {
  setenv("MEP_TRANSPORTS", "tcp", 1);
  mep_store_t *s = store_connect();
  mep_comm_opts_t o = {.struct_size = sizeof o, .name = "misuse"};
  mep_comm_t *comm;
  CHECK_OK(mep_comm_create(s, 0, 1, &o, &comm));
  CHECK(strcmp(mep_comm_route(comm, 0), "self") == 0, "self route");
  CHECK(mep_comm_route(comm, 1) == NULL, "no route past size");
  uint64_t buf[16] = {0};
  mep_region_t *r;
  CHECK_OK(mep_region_register(comm, buf, sizeof buf, MEP_MEM_HOST, &r));
  CHECK_RC(mep_put(comm, 0, r, 0, r, 100, 29), MEP_ERR_BOUNDS);
  CHECK_RC(mep_put(comm, 0, r, SIZE_MAX, r, 0, 2), MEP_ERR_BOUNDS);
  CHECK_RC(mep_put(comm, 1, r, 0, r, 0, 8), MEP_ERR_INVALID);
  CHECK_RC(mep_put(comm, -1, r, 0, r, 0, 8), MEP_ERR_INVALID);
  CHECK_RC(mep_signal(comm, 0, r, 4, 1, MEP_SIGNAL_SET), MEP_ERR_INVALID);
  CHECK_RC(mep_signal(comm, 0, r, 128, 1, MEP_SIGNAL_SET), MEP_ERR_BOUNDS);
  CHECK_RC(mep_signal(comm, 0, r, 0, 1, (mep_signal_op_t)7), MEP_ERR_INVALID);
  CHECK_RC(mep_region_register(comm, buf, 8, MEP_MEM_CUDA, &(mep_region_t *){0}),
           MEP_ERR_UNSUPPORTED);
  long long t0 = now_ms();
  CHECK_RC(mep_wait(r, 8, 1, 200, NULL), MEP_ERR_TIMEOUT);
  long long dt = now_ms() - t0;
  CHECK(dt >= 200 && dt < 1500, "wait took %lld ms for a 200 ms timeout", dt);
  CHECK_MSG("200 ms");
  CHECK_OK(mep_signal(comm, 0, r, 8, 5, MEP_SIGNAL_ADD));
  CHECK_OK(mep_wait(r, 8, 5, 0, NULL));
  CHECK_OK(mep_flush(comm, 1000));
  CHECK_OK(mep_region_deregister(r));
  CHECK_OK(mep_comm_destroy(comm));
  mep_store_destroy(s);
}

/* A peer that dies is reported within a second, not at the timeout. */
static void peer_dies(void) {
  setenv("MEP_TRANSPORTS", "tcp", 1);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    mep_store_t *s = store_connect();
    mep_comm_opts_t o = {.struct_size = sizeof o, .name = "dies"};
    mep_comm_t *comm;
    CHECK_OK(mep_comm_create(s, 1, 2, &o, &comm));
    uint64_t w[4] = {0};
    mep_region_t *r;
    CHECK_OK(mep_region_register(comm, w, sizeof w, MEP_MEM_HOST, &r));
    CHECK_OK(mep_signal(comm, 0, r, 0, 1, MEP_SIGNAL_SET));
    CHECK_OK(mep_flush(comm, 5000));
    sleep(1); /* let the signal leave before dying abruptly */
    _exit(0);
  }
  mep_store_t *s = store_connect();
  mep_comm_opts_t o = {.struct_size = sizeof o, .name = "dies",
                       .timeout_ms = 20000};
  mep_comm_t *comm;
  CHECK_OK(mep_comm_create(s, 0, 2, &o, &comm));
  uint64_t w[4] = {0};
  mep_region_t *r;
  CHECK_OK(mep_region_register(comm, w, sizeof w, MEP_MEM_HOST, &r));
  CHECK_OK(mep_wait(r, 0, 1, 10000, NULL));
  int status;
  waitpid(pid, &status, 0);
  long long dead = now_ms();
  int rc = MEP_OK;
  while (rc == MEP_OK && now_ms() - dead < 5000) {
    rc = mep_put(comm, 1, r, 8, r, 8, 8);
    if (rc == MEP_OK) rc = mep_flush(comm, 5000);
  }
  long long dt = now_ms() - dead;
  CHECK(rc == MEP_ERR_PEER_FAILED, "rc %d (%s)", rc, mep_last_error());
  CHECK(dt < 1000, "death reported after %lld ms", dt);
  CHECK_RC(mep_signal(comm, 1, r, 0, 1, MEP_SIGNAL_SET), MEP_ERR_PEER_FAILED);
  CHECK_MSG("rank 1");
  CHECK_OK(mep_comm_destroy(comm));
  mep_store_destroy(s);
}

/* A request still running when its communicator is destroyed fails with
 * MEP_ERR_CLOSED and stays usable (ASan watches for use after free). */
static void destroy_while_running(void) {
  setenv("MEP_TRANSPORTS", "tcp", 1);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) { /* rank 1 never joins the all-reduce */
    alarm(30);
    mep_store_t *s = store_connect();
    mep_comm_opts_t o = {.struct_size = sizeof o, .name = "destroy"};
    mep_comm_t *comm;
    CHECK_OK(mep_comm_create(s, 1, 2, &o, &comm));
    sleep(1);
    CHECK_OK(mep_comm_destroy(comm));
    mep_store_destroy(s);
    _exit(0);
  }
  mep_store_t *s = store_connect();
  mep_comm_opts_t o = {.struct_size = sizeof o, .name = "destroy"};
  mep_comm_t *comm;
  CHECK_OK(mep_comm_create(s, 0, 2, &o, &comm));
  float in[64] = {1}, out[64];
  mep_req_t *req;
  CHECK_OK(mep_allreduce(comm, in, out, 64, MEP_FLOAT32, MEP_SUM, &req));
  CHECK_RC(mep_req_wait(req, 50), MEP_ERR_TIMEOUT);
  CHECK_OK(mep_comm_destroy(comm));
  CHECK_RC(mep_req_wait(req, 1000), MEP_ERR_CLOSED);
  CHECK(mep_req_status(req) == MEP_ERR_CLOSED, "status");
  mep_req_free(req);
  mep_store_destroy(s);
  int status;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 1 failed");
}

int main(void) {
  mep_launch_store_t st = {0};
  CHECK(mep_launch_store_start(&st) == 0, "store server");
  port = st.port;
  unsetenv("MEP_TRANSPORTS");
  unsetenv("MEP_CONFIG");
  struct { const char *name; case_fn fn; } cases[] = {
      {"unknown transport in MEP_TRANSPORTS", unknown_transport},
      {"transport name with a path in it", bad_name},
      {"empty entry in MEP_TRANSPORTS", empty_list},
      {"plugin built for another ABI", wrong_abi},
      {"malformed config file", malformed_config},
      {"rank out of range", bad_rank},
      {"no transport reaches a peer", nothing_reaches},
      {"misuse of a communicator", misuse},
      {"peer dies", peer_dies},
      {"destroy while a request runs", destroy_while_running},
  };
  int failed = 0, n = (int)(sizeof cases / sizeof *cases);
  for (int i = 0; i < n; i++) failed += run_case(cases[i].name, cases[i].fn);
  mep_launch_store_stop(&st);
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed ? 1 : 0;
}
