/* devwin.h - the device window's proxy (devwin_proxy.c): a thread that
 * carries out the commands GPU kernels enqueue on a ring in host memory
 * (mep_dev_cmd_t, see mep/device.h), with mep_put and mep_signal on one
 * registered host region. It touches only host memory, so it builds and
 * is tested without CUDA; devwin.c gives it pinned, GPU-mapped memory. */
#ifndef MEP_SRC_DEVWIN_H
#define MEP_SRC_DEVWIN_H

#include <stddef.h>
#include <stdint.h>

#include "mep/device.h"
#include "mep/mep.h"

typedef struct mep__proxy mep__proxy_t;

/* Starts the thread on `ring` (len slots, a power of two, every seq 0).
 * It takes slot pos & (len - 1) once its seq is pos + 1 and publishes
 * *done = pos + 1 (release) when the command was carried out or dropped.
 * PUT sends bytes of `region` to the peer's instance of region, SIGNAL
 * stores a word there (after the earlier puts to that peer). A bad
 * command, or one to a failed peer, is dropped: *failed becomes nonzero
 * and mep__proxy_error tells the first such error. PUTs whose bytes
 * continue one another may go as one (devwin_proxy.c: merging). `region`
 * (the host part) must outlive the proxy. */
int mep__proxy_start(mep_comm_t *comm, mep_region_t *region,
                     mep_dev_cmd_t *ring, uint32_t len,
                     volatile uint64_t *done, volatile uint32_t *failed,
                     mep__proxy_t **out);

/* 0, or the first error the proxy met, with its message in msg. */
int mep__proxy_error(mep__proxy_t *px, char *msg, size_t len);

/* PUT commands carried out so far, and how many of them went within an
 * earlier one's mep_put (merged: their bytes continued it). NULL: 0, 0. */
void mep__proxy_counts(const mep__proxy_t *px, uint64_t *puts,
                       uint64_t *merged);

/* CUDA builds (cuda/devwin_quiet.cu): waits, from a one-thread kernel on
 * a stream of its own, until the NIC has carried out every request kernels
 * posted to the window's MEP_DEV_MLX5 peers (mep_dev_quiet of
 * mep/device/win.cuh; w is the device-resident descriptor). 0, -1 (the
 * timeout passed), -2 (a peer's queue pair failed: its requests will
 * never complete) or -3 (a CUDA error, its code in *cuda_err). */
#ifdef __cplusplus
extern "C"
#endif
int mep__devwin_quiet(const mep_dev_win_t *w, uint64_t timeout_ns,
                      int *cuda_err);

/* Stops the thread once it has carried out the slots before `target` and
 * no further slot is ready (target 0: whatever is ready now), waiting at
 * most the communicator's timeout; flushes, joins and frees. Returns
 * MEP_ERR_TIMEOUT when slots before target were left undone. NULL: no-op. */
int mep__proxy_stop(mep__proxy_t *px, uint64_t target);

#endif
