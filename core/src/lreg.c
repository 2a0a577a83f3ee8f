/* lreg.c - the cache of local-only registrations (lreg.h). A handful of
 * entries searched linearly: a collective asks for at most two buffers. */
#include "lreg.h"

#include <stdint.h>
#include <stdlib.h>

#include "error.h"
#include "region.h"

typedef struct entry {
  const void *ptr;
  size_t len;
  mep_region_t *reg;
  uint64_t used; /* the tick of its last use: the smallest is evicted */
} entry_t;

struct mep__lregs {
  mep_comm_t *comm;
  int cap, n;
  uint64_t tick;
  unsigned long made;
  entry_t *e;
};

mep__lregs_t *mep__lregs_new(mep_comm_t *comm, int cap) {
  mep__lregs_t *c = calloc(1, sizeof *c);
  if (c) c->e = calloc((size_t)cap, sizeof *c->e);
  if (!c || !c->e) {
    free(c);
    return NULL;
  }
  c->comm = comm;
  c->cap = cap;
  return c;
}

void mep__lregs_free(mep__lregs_t *c) {
  if (!c) return;
  for (int i = 0; i < c->n; i++) mep_region_deregister(c->e[i].reg);
  free(c->e);
  free(c);
}

/* The slot for a new entry: a free one, else the least recently used,
 * deregistered. */
static entry_t *victim(mep__lregs_t *c) {
  if (c->n < c->cap) return &c->e[c->n++];
  entry_t *v = &c->e[0];
  for (int i = 1; i < c->n; i++)
    if (c->e[i].used < v->used) v = &c->e[i];
  mep_region_deregister(v->reg);
  v->reg = NULL;
  return v;
}

/* Whether every transport in use that carries host memory registers it
 * by address alone. */
static int by_address(const mep_comm_t *comm) {
  for (int i = 0; i < comm->ntps; i++) {
    const mep__tp_t *tp = &comm->tps[i];
    if (tp->used && (tp->props.mem_kinds & (1u << MEP_MEM_HOST)) &&
        !tp->props.reg_by_address)
      return 0;
  }
  return 1;
}

int mep__lregs_get(mep__lregs_t *c, const void *ptr, size_t len,
                   mep_region_t **out) {
  if (!by_address(c->comm))
    return mep__err(MEP_ERR_UNSUPPORTED, "a transport in use pins the pages "
                    "it registers: callers' buffers are not kept");
  c->tick++;
  for (int i = 0; i < c->n; i++) {
    entry_t *e = &c->e[i];
    if (e->ptr == ptr && e->len == len) {
      e->used = c->tick;
      *out = e->reg;
      return MEP_OK;
    }
  }
  mep_region_t *r;
  int rc = mep__region_local(c->comm, ptr, len, &r);
  if (rc) return rc;
  c->made++;
  *out = r;
  entry_t *e = victim(c);
  *e = (entry_t){.ptr = ptr, .len = len, .reg = r, .used = c->tick};
  return MEP_OK;
}

void mep__lregs_drop(mep__lregs_t *c, mep_region_t *r) {
  for (int i = 0; c && r && i < c->n; i++) {
    if (c->e[i].reg != r) continue;
    mep_region_deregister(r);
    c->e[i] = c->e[--c->n];
    return;
  }
}

int mep__lregs_count(const mep__lregs_t *c) { return c ? c->n : 0; }
unsigned long mep__lregs_made(const mep__lregs_t *c) {
  return c ? c->made : 0;
}
