/* desc.c - device descriptor parts, asked for and checked (desc.h). */
#include "desc.h"

#include <stdio.h>
#include <string.h>

#include "link.h"

/* Room past what the plugin is given, to catch writes beyond it. */
#define PC_DESC_SLACK 64

const char *pc_part_fn(const pc_part_src_t *src) {
  return src->rmr ? "device_region"
         : src->mr ? "device_local"
                   : "device_descriptor";
}

static int call(const pc_part_src_t *src, void *buf, size_t *len) {
  const mep_transport_t *tp = src->s->tp;
  pc_call_begin(pc_part_fn(src));
  int rc = src->rmr ? tp->device_region(src->s->ep, src->rmr, buf, len)
           : src->mr ? tp->device_local(src->s->ctx, src->mr, buf, len)
                     : tp->device_descriptor(src->s->ctx, src->peer, buf,
                                             len);
  pc_call_end();
  return rc;
}

/* Fails if a byte of buf at or after `room` lost its poison. */
static void untouched_after(const pc_part_src_t *src, const unsigned char *buf,
                            size_t room, size_t total, size_t part_len) {
  for (size_t i = room; i < total; i++)
    if (buf[i] != PC_CANARY) {
      if (part_len)
        pc_fail("%s given room for %zu bytes (its part is %zu) wrote byte "
                "%zu",
                pc_part_fn(src), room, part_len, i);
      pc_fail("%s wrote past the %zu bytes it was given (byte %zu)",
              pc_part_fn(src), room, i);
    }
}

static void check_header(const pc_part_src_t *src, const pc_part_t *p) {
  const char *fn = pc_part_fn(src);
  int kind = (int)src->s->props.dev_kind;
  if (p->len > MEP_DEV_DESC_MAX)
    pc_fail("%s returned a part of %zu bytes, more than MEP_DEV_DESC_MAX "
            "(%d)",
            fn, p->len, MEP_DEV_DESC_MAX);
  if (p->len < sizeof(mep_dev_desc_t))
    pc_fail("%s returned a part of %zu bytes, shorter than its header "
            "(mep_dev_desc_t, %zu bytes)",
            fn, p->len, sizeof(mep_dev_desc_t));
  if (p->hdr.kind != kind)
    pc_fail("%s returned a part whose header says kind %u; props.dev_kind "
            "is %d",
            fn, p->hdr.kind, kind);
  if (p->hdr.size != p->len)
    pc_fail("%s returned %zu bytes (*len) but the part's header says its "
            "size is %u bytes: the core copies *len bytes and kernels trust "
            "the header",
            fn, p->len, p->hdr.size);
  if (p->hdr.version == 0)
    pc_fail("%s returned a part of version 0; versions start at 1", fn);
}

void pc_part_get(const pc_part_src_t *src, pc_part_t *out) {
  unsigned char buf[MEP_DEV_DESC_MAX + PC_DESC_SLACK];
  memset(buf, PC_CANARY, sizeof buf);
  memset(out, 0, sizeof *out);
  size_t len = MEP_DEV_DESC_MAX;
  out->rc = call(src, buf, &len);
  untouched_after(src, buf, MEP_DEV_DESC_MAX, sizeof buf, 0);
  if (out->rc != 0) {
    snprintf(out->err, sizeof out->err, "%s", pc_err(out->rc));
    return;
  }
  out->len = len;
  if (len <= MEP_DEV_DESC_MAX) memcpy(out->bytes, buf, len);
  if (len >= sizeof out->hdr) memcpy(&out->hdr, buf, sizeof out->hdr);
  check_header(src, out);
}

void pc_part_too_small(const pc_part_src_t *src, const pc_part_t *p) {
  const size_t rooms[] = {p->len - 1, 0};
  for (size_t k = 0; k < sizeof rooms / sizeof rooms[0]; k++) {
    unsigned char buf[MEP_DEV_DESC_MAX + PC_DESC_SLACK];
    memset(buf, PC_CANARY, sizeof buf);
    size_t len = rooms[k];
    int rc = call(src, buf, &len);
    untouched_after(src, buf, rooms[k], sizeof buf, p->len);
    if (rc == 0)
      pc_fail("%s returned 0 with room for %zu bytes, but its part is %zu "
              "bytes; want an error",
              pc_part_fn(src), rooms[k], p->len);
    pc_info("rank %d: %s with room for %zu of %zu bytes: %s",
            src->s->w->rank, pc_part_fn(src), rooms[k], p->len,
            mep_strerror(rc));
  }
}

/* ------------------------------------------------------------- agreement */

/* What both ranks must have alike: the code, the header, and the fields
 * of MEP_DEV_PTR that describe the pair rather than one side. */
typedef struct shape {
  int64_t rc;
  uint64_t kind, version, size;
  uint64_t field; /* PTR: peer part: flags; region part: len */
} shape_t;

static shape_t shape_of(const pc_part_src_t *src, const pc_part_t *p) {
  shape_t sh = {p->rc, 0, 0, 0, 0};
  if (p->rc != 0) return sh;
  sh.kind = p->hdr.kind;
  sh.version = p->hdr.version;
  sh.size = p->hdr.size;
  if (p->hdr.kind == MEP_DEV_PTR && !src->rmr &&
      p->len >= sizeof(mep_dev_ptr_peer_t)) {
    mep_dev_ptr_peer_t peer;
    memcpy(&peer, p->bytes, sizeof peer);
    sh.field = peer.flags;
  } else if (p->hdr.kind == MEP_DEV_PTR && src->rmr &&
             p->len >= sizeof(mep_dev_ptr_region_t)) {
    mep_dev_ptr_region_t region;
    memcpy(&region, p->bytes, sizeof region);
    sh.field = region.len;
  }
  return sh;
}

static void describe(const pc_part_src_t *src, const shape_t *sh, char *buf,
                     size_t len) {
  if (sh->rc != 0) {
    snprintf(buf, len, "%s", mep_strerror((int)sh->rc));
    return;
  }
  char field[64] = "";
  if (sh->kind == MEP_DEV_PTR)
    snprintf(field, sizeof field, ", %s %llu", src->rmr ? "len" : "flags",
             (unsigned long long)sh->field);
  snprintf(buf, len, "a part of kind %llu, version %llu, %llu bytes%s",
           (unsigned long long)sh->kind, (unsigned long long)sh->version,
           (unsigned long long)sh->size, field);
}

void pc_part_agree(pc_sess_t *s, const pc_part_src_t *src,
                   const pc_part_t *p) {
  shape_t mine = shape_of(src, p), theirs;
  pc_link_send(PC_TAG_ANSWER, &mine, sizeof mine);
  if (pc_link_recv(PC_TAG_ANSWER, &theirs, sizeof theirs,
                   "the peer's descriptor answer") != sizeof theirs)
    pc_fail("internal: the peer's descriptor answer has the wrong size");
  if (memcmp(&mine, &theirs, sizeof mine) == 0) return;
  char a[256], b[256];
  describe(src, &mine, a, sizeof a);
  describe(src, &theirs, b, sizeof b);
  pc_fail("%s disagrees: rank %d got %s%s%s, rank %d got %s; both sides "
          "must answer alike",
          pc_part_fn(src), s->w->rank, a, p->rc ? ": " : "",
          p->rc ? p->err : "", s->peer, b);
}

/* ------------------------------------------------------------ MEP_DEV_PTR */

/* The part's version is the one this mep knows for its kind, and the
 * part is at least that version's struct. */
static void layout(const pc_part_t *p, const char *fn, const char *kind,
                   int version, size_t need) {
  if (p->hdr.version != version)
    pc_fail("%s returned a %s part of version %u; this mep knows version "
            "%d",
            fn, kind, p->hdr.version, version);
  if (p->len < need)
    pc_fail("%s returned a %s part of %zu bytes; version %d has %zu", fn,
            kind, p->len, version, need);
}

static void ptr_layout(const pc_part_t *p, const char *fn, size_t need) {
  layout(p, fn, "MEP_DEV_PTR", MEP_DEV_PTR_VERSION, need);
}

void pc_part_ptr_peer(const pc_part_t *p) {
  mep_dev_ptr_peer_t peer;
  ptr_layout(p, "device_descriptor", sizeof peer);
  memcpy(&peer, p->bytes, sizeof peer);
  if (peer.device < -1)
    pc_fail("device_descriptor: the peer's GPU is %d; want an ordinal, or "
            "-1 for this process's own GPU",
            peer.device);
  if (peer.flags & ~MEP_DEV_PTR_PEER_ACCESS)
    pc_fail("device_descriptor: flags 0x%x has bits that MEP_DEV_PTR does "
            "not define",
            peer.flags);
  char gpu[48] = "this process's own";
  if (peer.device >= 0) snprintf(gpu, sizeof gpu, "ordinal %d", peer.device);
  pc_info("rank %d: device_descriptor: MEP_DEV_PTR; the peer's GPU is %s%s",
          pc_self()->rank, gpu,
          peer.flags & MEP_DEV_PTR_PEER_ACCESS ? ", with peer access" : "");
}

void pc_part_ptr_region(const pc_part_t *p, uint64_t region_len) {
  mep_dev_ptr_region_t region;
  ptr_layout(p, "device_region", sizeof region);
  memcpy(&region, p->bytes, sizeof region);
  if (region.base == 0)
    pc_fail("device_region: base is 0; want the address at which kernels "
            "reach the peer's region");
  if (region.len != region_len)
    pc_fail("device_region: len is %llu; the peer's region is %llu bytes",
            (unsigned long long)region.len, (unsigned long long)region_len);
}

/* ----------------------------------------------------------- MEP_DEV_MLX5 */

static void mlx5_layout(const pc_part_t *p, const char *fn, size_t need) {
  layout(p, fn, "MEP_DEV_MLX5", MEP_DEV_MLX5_VERSION, need);
}

static int pow2(uint64_t v) { return v && !(v & (v - 1)); }

void pc_part_mlx5_peer(const pc_part_t *p) {
  mep_dev_mlx5_peer_t q;
  mlx5_layout(p, "device_descriptor", sizeof q);
  memcpy(&q, p->bytes, sizeof q);
  if (!q.qpn || q.qpn > 0xffffffu)
    pc_fail("device_descriptor: QP number 0x%x; want 24 bits, not 0", q.qpn);
  if (!pow2(q.sq_bbs) || !pow2(q.cq_n))
    pc_fail("device_descriptor: a send queue of %u building blocks and a "
            "CQ of %u entries; want powers of two",
            q.sq_bbs, q.cq_n);
  const uint64_t objs[] = {q.sq, q.dbrec, q.db, q.pi, q.ready, q.ci,
                           q.cq, q.cq_dbrec, q.cq_ci, q.cq_lock};
  for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++)
    if (!objs[i])
      pc_fail("device_descriptor: object %zu of the queue pair (sq, dbrec, "
              "db, pi, ready, ci, cq, cq_dbrec, cq_ci, cq_lock) is at "
              "address 0",
              i);
  if (q.flags & ~MEP_DEV_MLX5_MODEL)
    pc_fail("device_descriptor: flags 0x%x has bits that MEP_DEV_MLX5 does "
            "not define",
            q.flags);
  pc_info("rank %d: device_descriptor: MEP_DEV_MLX5, QP 0x%x, %u BBs, %u "
          "CQEs%s",
          pc_self()->rank, q.qpn, q.sq_bbs, q.cq_n,
          q.flags & MEP_DEV_MLX5_MODEL ? " (the software model)" : "");
}

void pc_part_mlx5_region(const pc_part_src_t *src, const pc_part_t *p,
                         uint64_t region_len) {
  const char *fn = pc_part_fn(src);
  mep_dev_mlx5_region_t r;
  mlx5_layout(p, fn, sizeof r);
  memcpy(&r, p->bytes, sizeof r);
  if (r.len != region_len)
    pc_fail("%s: len is %llu; the region is %llu bytes", fn,
            (unsigned long long)r.len, (unsigned long long)region_len);
}
