/* check_desc.c - descriptors (ABI 1.3): the peer part and the region part
 * of a plugin that declares a device kind, and for MEP_DEV_MLX5 the local
 * part of its own registration (ABI 1.6). Each is asked for with
 * poisoned room: the header names props.dev_kind and the part's size,
 * which is *len, at most MEP_DEV_DESC_MAX; too little room is refused
 * without a byte written past it; a bad peer index is MEP_ERR_INVALID;
 * both ranks get alike answers. For MEP_DEV_PTR and MEP_DEV_MLX5 the
 * fields are checked too, and on CUDA memory GPU kernels load and store
 * through a PTR region part's base (desc_reach.c). The parts are asked
 * for with a CUDA context current where this process can open one, as
 * the core asks (a transport may map what kernels reach only then).
 * Plugins of MEP_DEV_NONE skip it. */
#include <limits.h>
#include <string.h>

#include "checks.h"
#include "desc.h"
#include "desc_reach.h"
#include "link.h"
#include "mem_cuda.h"
#include "pattern.h"
#include "sess.h"

/* A rank no connect() ever named: refused with MEP_ERR_INVALID, or (the
 * caller's own rank) with some error, and nothing written past the room
 * (pc_part_get). */
static void bad_peer(pc_sess_t *s, int peer, int want_invalid) {
  pc_part_src_t src = {s, peer, NULL, NULL};
  pc_part_t p;
  pc_part_get(&src, &p);
  if (p.rc == 0)
    pc_fail("device_descriptor for rank %d (the group has ranks 0 and 1; "
            "this is rank %d) returned 0; want an error (MEP_ERR_INVALID)",
            peer, s->w->rank);
  if (want_invalid && p.rc != MEP_ERR_INVALID)
    pc_fail("device_descriptor for rank %d, outside the group of 2, "
            "returned %s; want MEP_ERR_INVALID",
            peer, p.err);
}

static void bad_peers(pc_sess_t *s) {
  const int outside[] = {-1, 2, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++)
    bad_peer(s, outside[i], 1);
  bad_peer(s, s->w->rank, 0);
}

/* The peer part; returns 0 when kernels reach the peer this way. */
static int peer_part(pc_sess_t *s, pc_part_t *p) {
  pc_part_src_t src = {s, s->peer, NULL, NULL};
  pc_part_get(&src, p);
  if (p->rc != 0 && p->rc != MEP_ERR_UNREACHABLE)
    pc_fail("device_descriptor for the connected rank %d failed: %s; want "
            "0, or MEP_ERR_UNREACHABLE with the reason",
            s->peer, p->err);
  if (p->rc == 0) pc_part_too_small(&src, p);
  pc_part_agree(s, &src, p);
  if (p->rc == 0 && p->hdr.kind == MEP_DEV_PTR) pc_part_ptr_peer(p);
  if (p->rc == 0 && p->hdr.kind == MEP_DEV_MLX5) pc_part_mlx5_peer(p);
  return p->rc;
}

static void region_part(pc_sess_t *s, const pc_remote_t *theirs,
                        pc_part_t *p) {
  pc_part_src_t src = {s, s->peer, theirs->rmr, NULL};
  pc_part_get(&src, p);
  if (p->rc != 0)
    pc_fail("device_region of rank %d's region of %llu bytes failed: %s",
            s->peer, (unsigned long long)theirs->len, p->err);
  pc_part_too_small(&src, p);
  pc_part_agree(s, &src, p);
  if (p->hdr.kind == MEP_DEV_PTR) pc_part_ptr_region(p, theirs->len);
  if (p->hdr.kind == MEP_DEV_MLX5)
    pc_part_mlx5_region(&src, p, theirs->len);
}

/* MEP_DEV_MLX5: the local part of this rank's own registration, which
 * kernels name as the source of their writes. */
static void local_part(pc_sess_t *s, const pc_region_t *mine) {
  if (s->props.dev_kind != MEP_DEV_MLX5) return;
  pc_part_src_t src = {s, s->peer, NULL, mine->mr};
  pc_part_t p;
  pc_part_get(&src, &p);
  if (p.rc != 0)
    pc_fail("device_local of this rank's region of %zu bytes failed: %s",
            mine->len, p.err);
  pc_part_too_small(&src, &p);
  pc_part_agree(s, &src, &p);
  pc_part_mlx5_region(&src, &p, mine->len);
}

/* The own region's stream, per rank. */
static uint64_t region_seed(const pc_worker_t *w, int rank) {
  return pc_seed_for(w->seed, 0xde5c, (uint64_t)rank, 0);
}

/* A MEP_DEV_PTR region part, dereferenced where the regions are CUDA
 * memory; host memory has no address a kernel could be given. */
static void try_base(pc_sess_t *s, const pc_region_t *mine,
                     const pc_remote_t *theirs, const pc_part_t *p) {
  if (p->hdr.kind != MEP_DEV_PTR) {
    pc_info("rank %d: kind %u: the headers are checked; the fields are "
            "known for MEP_DEV_PTR only",
            s->w->rank, p->hdr.kind);
    return;
  }
  if (mine->mem != PC_MEM_CUDA) {
    pc_info("rank %d: the region part's base was not dereferenced: the "
            "regions are %s memory (kernels need CUDA memory: --memory "
            "cuda, on a GPU)",
            s->w->rank, pc_mem_name(mine->mem));
    return;
  }
  mep_dev_ptr_region_t region;
  memcpy(&region, p->bytes, sizeof region);
  pc_reach_t r = {s, mine, region_seed(s->w, s->w->rank), region.base,
                  theirs->len, region_seed(s->w, s->peer)};
  pc_desc_reach(&r);
}

static void require_functions(const mep_transport_t *tp, int kind) {
  if (!tp->device_descriptor ||
      !MEP_TP_HAS(tp, mep_transport_t, device_region) || !tp->device_region)
    pc_fail("props: dev_kind is %d but device_descriptor or device_region "
            "is missing (see the abi check)",
            kind);
  if (kind == MEP_DEV_MLX5 &&
      (!MEP_TP_HAS(tp, mep_transport_t, device_local) || !tp->device_local))
    pc_fail("props: dev_kind is MEP_DEV_MLX5 but device_local is missing "
            "(see the abi check)");
}

void pc_check_descriptors(pc_worker_t *w) {
  pc_sess_t s;
  pc_sess_init(&s, w);
  if (s.props.dev_kind == MEP_DEV_NONE)
    pc_skip("the plugin declares no device descriptor kind (props.dev_kind "
            "is MEP_DEV_NONE): kernels reach its peers through the core's "
            "proxy");
  require_functions(w->tp, (int)s.props.dev_kind);
  char why[256];
  if (pc_cuda_open(why, sizeof why))
    pc_info("rank %d: no CUDA context is current while the parts are asked "
            "for: %s", w->rank, why);
  pc_sess_connect(&s);
  pc_link_barrier(1, "the barrier after connect");
  bad_peers(&s);
  pc_part_t peer, region;
  int unreachable = peer_part(&s, &peer) == MEP_ERR_UNREACHABLE;
  /* a MEP_DEV_MLX5 region or local part is keys and addresses, which do
   * not depend on the GPU reaching the queues: checked all the same */
  if (unreachable && s.props.dev_kind != MEP_DEV_MLX5)
    pc_skip("kernels of rank %d cannot reach rank %d through this plugin "
            "(both ranks say MEP_ERR_UNREACHABLE): %s; that answer was "
            "checked, the region part was not",
            w->rank, s.peer, peer.err);

  pc_rng_t g;
  pc_rng_seed(&g, pc_seed_for(w->seed, 0xde5, 0, 0));
  size_t len = 2 * (size_t)pc_rng_range(&g, 2048, 65536) + 1;
  pc_region_t mine;
  pc_remote_t theirs;
  pc_region_reg(&s, &mine, len);
  pc_region_fill(&mine, 0, len, region_seed(w, w->rank), 0);
  pc_region_share(&s, &mine, &theirs);
  region_part(&s, &theirs, &region);
  local_part(&s, &mine);
  if (!unreachable) try_base(&s, &mine, &theirs, &region);

  pc_link_barrier(1, "the barrier before unimport");
  pc_remote_release(&s, &theirs);
  /* The peer's mapping of this region is gone before its memory is. */
  pc_link_barrier(1, "the barrier after unimport");
  pc_region_dereg(&s, &mine);
  pc_sess_close(&s);
  if (unreachable)
    pc_skip("kernels of rank %d cannot reach rank %d through this plugin "
            "(both ranks say MEP_ERR_UNREACHABLE): %s; that answer, and the "
            "region and local parts, were checked",
            w->rank, s.peer, peer.err);
}
