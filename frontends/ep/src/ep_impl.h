/* ep_impl.h - the buffer object and the two paths behind ep.h: the CPU
 * path (ep_host*.c) and the CUDA path (cuda/, built with MEP_HAVE_CUDA).
 * ep_buffer.c validates every call and hands it to one of them; both
 * paths use the helpers of ep_util.c, which calls neither of them. */
#ifndef MEP_EP_IMPL_H
#define MEP_EP_IMPL_H

#include "layout.h"
#include "mep/ep.h"

struct mep__ep_host;
struct mep__ep_cuda;

struct mep_ep_buffer {
  mep_comm_t *comm;
  mep_ep_config_t cfg;
  int rank, size;
  mep__ep_layout_t lay;   /* of every rank's communication memory */
  int64_t timeout_us;    /* resolved default */
  int32_t *active;       /* own active ranks: device (CUDA) or host */
  struct mep__ep_host *host; /* MEP_EP_HOST */
  struct mep__ep_cuda *cuda; /* MEP_EP_CUDA */
};

/* One validated call: what both paths take. phases: 1 send, 2 receive,
 * 3 both. active and timeout_us resolved (never NULL / <= 0). */
typedef struct mep__ep_call {
  int phases;
  int32_t *active;
  int64_t timeout_us;
  int32_t *recv_stats; /* dispatch: args' recv_stats, NULL if absent */
} mep__ep_call_t;

/* CPU path. create: collective; allocates b->host and b->active. */
int mep__ep_host_create(mep_ep_buffer_t *b);
void mep__ep_host_destroy(mep_ep_buffer_t *b);
int mep__ep_host_dispatch(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                          const mep__ep_call_t *c);
int mep__ep_host_combine(mep_ep_buffer_t *b, const mep_ep_combine_args_t *a,
                         const mep__ep_call_t *c);
void *mep__ep_host_combine_buffer(mep_ep_buffer_t *b);

#ifdef MEP_HAVE_CUDA
/* CUDA path. create: collective; allocates b->cuda and b->active. */
int mep__ep_cuda_create(mep_ep_buffer_t *b);
void mep__ep_cuda_destroy(mep_ep_buffer_t *b);
int mep__ep_cuda_dispatch(mep_ep_buffer_t *b, const mep_ep_dispatch_args_t *a,
                          const mep__ep_call_t *c);
int mep__ep_cuda_combine(mep_ep_buffer_t *b, const mep_ep_combine_args_t *a,
                         const mep__ep_call_t *c);
void *mep__ep_cuda_combine_buffer(mep_ep_buffer_t *b);
#endif

#endif /* MEP_EP_IMPL_H */
