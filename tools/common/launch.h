/* launch.h - run N local ranks as forked processes around a built-in
 * store: for tools (mep-info --size, mep-perf -n) and the integration
 * tests. Not part of the library. */
#ifndef MEP_TOOLS_LAUNCH_H
#define MEP_TOOLS_LAUNCH_H

#include <stdint.h>

#include <mep/mep.h>

/* Body of one rank. Returns 0 on success; anything else fails the rank.
 * `store` and `comm` stay owned by the launcher. */
typedef int (*mep_launch_fn)(mep_comm_t *comm, mep_store_t *store, void *arg);

typedef struct mep_launch_opts {
  int size;             /* ranks to fork */
  int timeout_ms;       /* the whole run's deadline; ranks are killed after */
  const char *name;     /* communicator name (store namespace) */
  /* Called in each child before the communicator is made (e.g. to set
   * per-rank environment such as MEP_HOST_ID); may be NULL. */
  void (*before_comm)(int rank, void *arg);
  /* Called in a child whose mep_comm_create failed with `rc` (message in
   * mep_last_error()); its result is the rank's result. NULL: the failure
   * is printed and fails the rank. */
  int (*on_create_error)(int rank, int rc, void *arg);
} mep_launch_opts_t;

/* A store server in a process of its own (so the caller keeps no thread:
 * forking a process that has threads can leave a lock taken in the child).
 * Sets *port; mep_launch_store_stop ends and reaps it. */
typedef struct mep_launch_store {
  const char *host; /* the caller's: address to listen on; NULL: 127.0.0.1 */
  int pid;
  int ctl_fd; /* closing it tells the server to stop */
  int port;
} mep_launch_store_t;
int mep_launch_store_start(mep_launch_store_t *st);
void mep_launch_store_stop(mep_launch_store_t *st);

/* Starts a store server on 127.0.0.1 (ephemeral port), forks `size`
 * processes that each connect, create the communicator, run fn and exit
 * with its result. Every child is reaped; at the deadline the survivors
 * are killed. Returns 0 when every rank succeeded, else the count of
 * failed ranks, each described on stderr ("rank 2: exited with 1",
 * "rank 0: killed by signal 9 at the deadline"). With MEP_LAUNCH_HOSTS=1
 * in the environment each rank is a host of its own (MEP_HOST_ID
 * "mep-launch-host-RANK"): one machine plays several hosts. */
int mep_launch(const mep_launch_opts_t *opts, mep_launch_fn fn, void *arg);

/* Requests a rank has made so far through the store mep_launch gave its
 * body (every set, get, add and check, the communicator's included); 0 for
 * any other store. */
uint64_t mep_launch_store_requests(const mep_store_t *store);

#endif
