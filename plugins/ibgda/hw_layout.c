/* hw_layout.c - backend = device: the layout producers use (m5_qp_t's
 * producer fields), from what mlx5dv_init_obj says of a queue pair and
 * its CQ; and what this version refuses there. No verbs calls: the unit
 * tests feed it mlx5dv's structures. */
#include <infiniband/mlx5dv.h>
#include <stdio.h>

#include "ibgda.h"

int mep__ibgda_hw_layout(const struct mlx5dv_qp *dq,
                         const struct mlx5dv_cq *dc, uint32_t qpn,
                         m5_qp_t *v, char *why, size_t why_len) {
  const char *bad = NULL;
  if (!dq->sq.buf || !dq->dbrec || !dq->bf.reg || !dc->buf || !dc->dbrec)
    bad = "a queue object it does not name";
  else if (dq->sq.stride != MEP_MLX5_SEND_WQE_BB)
    bad = "a send queue stride other than 64 bytes";
  else if (!mep__m5_pow2(dq->sq.wqe_cnt) ||
           dq->sq.wqe_cnt < MEP_MLX5_MAX_WQE_BB)
    bad = "a send queue size that is not a power of two of at least 4";
  else if (dc->cqe_size != MEP_MLX5_CQE_SIZE)
    bad = "CQEs of other than 64 bytes (MLX5_CQE_SIZE=128?)";
  else if (!mep__m5_pow2(dc->cqe_cnt))
    bad = "a CQ size that is not a power of two";
  if (bad) {
    snprintf(why, why_len, "mlx5dv_init_obj gives %s (send queue %u x %u "
             "bytes, CQ %u x %u bytes)", bad, dq->sq.wqe_cnt, dq->sq.stride,
             dc->cqe_cnt, dc->cqe_size);
    return -1;
  }
  v->sq = dq->sq.buf;
  v->sq_bbs = dq->sq.wqe_cnt;
  v->qpn = qpn & 0xffffff;
  v->dbrec = (uint32_t *)dq->dbrec;
  v->db = dq->bf.reg;
  v->cq = dc->buf;
  v->cq_n = dc->cqe_cnt;
  v->cq_dbrec = (uint32_t *)dc->dbrec;
  return 0;
}
