/* ep_host.c - the CPU path (MEP_EP_HOST): one host region per rank of the
 * layout's size, registered with every transport, and the helpers the
 * dispatch and combine files share. */
#include "ep_host.h"

#include <stdlib.h>
#include <string.h>

#include "ep_util.h"

int mep__ep_host_create(mep_ep_buffer_t *b) {
  const char *fn = "mep_ep_buffer_create";
  struct mep__ep_host *h = calloc(1, sizeof *h);
  size_t R = (size_t)b->size, E = (size_t)b->cfg.num_experts;
  uint64_t bytes = b->lay.total;
  if (h) {
    h->mem = aligned_alloc(MEP_EP_ALIGN, (size_t)bytes);
    h->counts = calloc(E, sizeof *h->counts);
    b->active = malloc(R * sizeof *b->active);
  }
  if (!h || !h->mem || !h->counts || !b->active) {
    if (h) free(h->mem);
    if (h) free(h->counts);
    free(h);
    free(b->active);
    b->active = NULL;
    return mep_set_error(MEP_ERR_NOMEM, 0, "%s: no memory for the %llu "
                         "bytes of the CPU path's communication buffer", fn,
                         (unsigned long long)bytes);
  }
  /* zero: a count word below (1 << 32) means "nothing yet" */
  memset(h->mem, 0, (size_t)bytes);
  int rc = mep__ep_initial_active(b, b->active);
  if (!rc)
    rc = mep_region_register(b->comm, h->mem, (size_t)bytes, MEP_MEM_HOST,
                             &h->region);
  if (rc) {
    free(h->mem);
    free(h->counts);
    free(h);
    free(b->active);
    b->active = NULL;
    return rc == MEP_ERR_NOMEM
               ? rc
               : mep_set_error(rc, 1, "%s: registering the %llu-byte host "
                               "buffer", fn, (unsigned long long)bytes);
  }
  b->host = h;
  return 0;
}

void mep__ep_host_destroy(mep_ep_buffer_t *b) {
  struct mep__ep_host *h = b->host;
  if (!h) return;
  /* let puts that read our stages finish before their memory goes */
  (void)mep_flush(b->comm, (int)(b->timeout_us / 1000) + 1);
  (void)mep_region_deregister(h->region);
  free(h->mem);
  free(h->counts);
  free(h);
  free(b->active);
  b->host = NULL;
  b->active = NULL;
}

int mep__ep_host_send_words(mep_ep_buffer_t *b, int dst, uint64_t off) {
  struct mep__ep_host *h = b->host;
  const mep__ep_layout_t *l = &b->lay;
  int L = l->local, rc = 0;
  uint64_t last;
  memcpy(&last, (const char *)h->mem + mep__ep_count_stage(l, dst, L - 1),
         sizeof last);
  if (L > 1)
    rc = mep_put(b->comm, dst, h->region, mep__ep_count_stage(l, dst, 0),
                 h->region, off, (size_t)(L - 1) * 8);
  if (!rc)
    rc = mep_signal(b->comm, dst, h->region, off + (uint64_t)(L - 1) * 8, last,
                    MEP_SIGNAL_SET);
  return rc;
}

int mep__ep_host_wait_words(mep_ep_buffer_t *b, const mep__ep_call_t *c,
                            uint64_t seq, uint64_t off, const char *fn) {
  uint64_t deadline = mep__ep_now_us() + (uint64_t)c->timeout_us;
  uint64_t L = (uint64_t)b->lay.local;
  for (int src = 0; src < b->size; src++) {
    if (!c->active[src]) continue;
    int rc = mep_wait(b->host->region, off + ((uint64_t)src * L + L - 1) * 8,
                      seq << 32, mep__ep_left_ms(deadline), NULL);
    if (rc == MEP_ERR_TIMEOUT)
      c->active[src] = 0;
    else if (rc)
      return mep_set_error(rc, 1, "%s: waiting for rank %d's words", fn, src);
  }
  return 0;
}

void *mep__ep_host_combine_buffer(mep_ep_buffer_t *b) {
  return (char *)b->host->mem + b->lay.comb_stage;
}
