// ops_reduce_scatter.cpp - reduce-scatter (lists, flat, coalesced).
#include "backend.hpp"
#include "errors.hpp"
#include "ops_util.hpp"
#include "tensors.hpp"

namespace mep_c10d {

using c10d::OpType;

c10::intrusive_ptr<c10d::Work> MepBackend::reduce_scatter(
    std::vector<at::Tensor> &outputs,
    std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ReduceScatterOptions &opts) {
  const char *op = "reduce_scatter";
  check_count(op, "the output list", outputs.size(), 1);
  check_count(op, "the input list", inputs.size(), 1);
  std::vector<at::Tensor> ins = inputs[0];
  MemPath path = mem_path(op, concat(outputs, ins));
  at::Tensor out = outputs[0];
  check_count(op, "the input tensor list", ins.size(),
              static_cast<size_t>(group_size_));
  check_same(op, "input", ins, out);
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_reduce_scatter(out, ins, opts.reduceOp);
#endif
  require_host(op, path);
  Elems el = reduce_elems(op, out, opts.reduceOp);
  mep_op_t rop = reduce_op(op, opts.reduceOp, out.scalar_type());
  at::Tensor dst = contiguous_or_copy(out);
  auto w = make_work(OpType::REDUCE_SCATTER, "mep:reduce_scatter",
                     what(op, out), ins, outputs);
  return issue(w, [&](MepWork &w) {
    at::Tensor flat =
        flatten_into(scratch(w, total_numel(ins), out.scalar_type()), ins);
    w.keep(flat);
    w.keep(dst);
    submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_reduce_scatter(c, data_of(flat), data_of(dst), el.count,
                                el.dtype, rop, r);
    });
    copy_back(w, out, dst);
  });
}

void MepBackend::reduce_scatter_into(MepWork &w, const char *op,
                                     at::Tensor &out, at::Tensor &in,
                                     const c10d::ReduceOp &rop) {
  if (out.scalar_type() != in.scalar_type() ||
      in.numel() != group_size_ * out.numel())
    throw_value(std::string(op) + ": the input has " + describe(in) +
                ", expected " + std::to_string(group_size_) + " x " +
                describe(out));
  Elems el = reduce_elems(op, out, rop);
  mep_op_t mop = reduce_op(op, rop, out.scalar_type());
  at::Tensor src = contiguous_or_copy(in);
  at::Tensor dst = contiguous_or_copy(out);
  w.keep(src);
  w.keep(dst);
  submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
    return mep_reduce_scatter(c, data_of(src), data_of(dst), el.count,
                              el.dtype, mop, r);
  });
  copy_back(w, out, dst);
}

c10::intrusive_ptr<c10d::Work> MepBackend::_reduce_scatter_base(
    at::Tensor &output, at::Tensor &input,
    const c10d::ReduceScatterOptions &opts) {
  const char *op = "reduce_scatter_tensor";
  MemPath path = mem_path(op, {output, input});
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) {
    std::vector<at::Tensor> outs{output}, ins{input};
    return cuda_reduce_scatter_from(op, OpType::_REDUCE_SCATTER_BASE, outs,
                                    ins, opts.reduceOp);
  }
#endif
  require_host(op, path);
  auto w = make_work(OpType::_REDUCE_SCATTER_BASE, "mep:reduce_scatter_tensor",
                     what(op, output), {input}, {output});
  return issue(w, [&](MepWork &w) {
    reduce_scatter_into(w, op, output, input, opts.reduceOp);
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::ReduceScatterOptions &opts) {
  const char *op = "reduce_scatter_tensor_coalesced";
  MemPath path = mem_path(op, concat(inputs, outputs));
  check_count(op, "the output list", outputs.size(), inputs.size());
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_reduce_scatter_from(op, kReduceScatterTensorCoalesced,
                                    outputs, inputs, opts.reduceOp);
#endif
  require_host(op, path);
  auto w = make_work(kReduceScatterTensorCoalesced,
                     "mep:reduce_scatter_tensor_coalesced",
                     std::string(op) + " of " + std::to_string(inputs.size()) +
                         " tensors (rank " + std::to_string(rank_) + ")",
                     inputs, outputs);
  return issue(w, [&](MepWork &w) {
    for (size_t i = 0; i < inputs.size(); i++)
      reduce_scatter_into(w, op, outputs[i], inputs[i], opts.reduceOp);
  });
}

}  // namespace mep_c10d
