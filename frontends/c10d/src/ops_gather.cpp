// ops_gather.cpp - all-gather (lists, flat, coalesced), gather, scatter.
#include <algorithm>

#include "backend.hpp"
#include "errors.hpp"
#include "ops_util.hpp"
#include "tensors.hpp"

namespace mep_c10d {

using c10d::OpType;

c10::intrusive_ptr<c10d::Work> MepBackend::allgather(
    std::vector<std::vector<at::Tensor>> &outputs,
    std::vector<at::Tensor> &inputs, const c10d::AllgatherOptions &) {
  const char *op = "all_gather";
  check_count(op, "the input list", inputs.size(), 1);
  check_count(op, "the output list", outputs.size(), 1);
  std::vector<at::Tensor> outs = outputs[0];
  MemPath path = mem_path(op, concat(inputs, outs));
  at::Tensor in = inputs[0];
  check_count(op, "the output tensor list", outs.size(),
              static_cast<size_t>(group_size_));
  check_same(op, "output", outs, in);
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda)
    return cuda_allgather(op, OpType::ALLGATHER, "mep:all_gather", outs, in);
#endif
  require_host(op, path);
  Elems el = move_elems(in);
  at::Tensor src = contiguous_or_copy(in);
  auto w = make_work(OpType::ALLGATHER, "mep:all_gather", what(op, in),
                     inputs, outs);
  return issue(w, [&](MepWork &w) {
    at::Tensor flat = scratch(w, group_size_ * in.numel(), in.scalar_type());
    w.keep(src);
    w.keep(flat);
    submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_allgather(c, data_of(src), data_of(flat), el.count, el.dtype,
                           r);
    });
    scatter_back(w, outs, flat, in.numel());
  });
}

// One all-gather of `in` into the flat `out` as part of w.
void MepBackend::gather_into(MepWork &w, const char *op, at::Tensor &out,
                             at::Tensor &in) {
  if (out.scalar_type() != in.scalar_type() ||
      out.numel() != group_size_ * in.numel())
    throw_value(std::string(op) + ": the output has " + describe(out) +
                ", expected " + std::to_string(group_size_) + " x " + describe(in));
  Elems el = move_elems(in);
  at::Tensor src = contiguous_or_copy(in);
  at::Tensor dst = contiguous_or_copy(out);
  w.keep(src);
  w.keep(dst);
  submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
    return mep_allgather(c, data_of(src), data_of(dst), el.count, el.dtype,
                         r);
  });
  copy_back(w, out, dst);
}

c10::intrusive_ptr<c10d::Work> MepBackend::_allgather_base(
    at::Tensor &output, at::Tensor &input, const c10d::AllgatherOptions &) {
  const char *op = "all_gather_into_tensor";
  MemPath path = mem_path(op, {output, input});
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) {
    std::vector<at::Tensor> outs{output}, ins{input};
    return cuda_gather_into(op, OpType::_ALLGATHER_BASE, outs, ins);
  }
#endif
  require_host(op, path);
  auto w = make_work(OpType::_ALLGATHER_BASE, "mep:all_gather_into_tensor",
                     what(op, input), {input}, {output});
  return issue(w, [&](MepWork &w) { gather_into(w, op, output, input); });
}

c10::intrusive_ptr<c10d::Work> MepBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &) {
  const char *op = "all_gather_into_tensor_coalesced";
  MemPath path = mem_path(op, concat(inputs, outputs));
  check_count(op, "the output list", outputs.size(), inputs.size());
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_gather_into(op, kAllgatherIntoTensorCoalesced, outputs,
                            inputs);
#endif
  require_host(op, path);
  auto w = make_work(kAllgatherIntoTensorCoalesced,
                     "mep:all_gather_into_tensor_coalesced",
                     std::string(op) + " of " + std::to_string(inputs.size()) +
                         " tensors (rank " + std::to_string(rank_) + ")",
                     inputs, outputs);
  return issue(w, [&](MepWork &w) {
    for (size_t i = 0; i < inputs.size(); i++)
      gather_into(w, op, outputs[i], inputs[i]);
  });
}

// The inputs' bytes one after the other, each at a multiple of 16 bytes so
// every dtype views its slice in place; one all-gather of those bytes, and
// each rank's slices copied into its output list. Any dtypes and shapes,
// as long as outputs[r][i] is shaped like inputs[i].
c10::intrusive_ptr<c10d::Work> MepBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>> &outputs,
    std::vector<at::Tensor> &inputs, const c10d::AllgatherOptions &) {
  const char *op = "all_gather_coalesced";
  check_count(op, "the output list", outputs.size(),
              static_cast<size_t>(group_size_));
  std::vector<at::Tensor> all = inputs;
  for (size_t r = 0; r < outputs.size(); r++) {
    check_count(op, ("output list " + std::to_string(r)).c_str(),
                outputs[r].size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); i++)
      if (outputs[r][i].scalar_type() != inputs[i].scalar_type() ||
          outputs[r][i].numel() != inputs[i].numel())
        throw_value(std::string(op) + ": output " + std::to_string(i) +
                    " of rank " + std::to_string(r) + " has " +
                    describe(outputs[r][i]) + ", input " + std::to_string(i) +
                    " has " + describe(inputs[i]));
    all = concat(all, outputs[r]);
  }
  require_host(op, mem_path(op, all));
  std::vector<int64_t> off(inputs.size()), len(inputs.size());
  int64_t total = 0;
  for (size_t i = 0; i < inputs.size(); i++) {
    off[i] = total;
    len[i] = inputs[i].numel() * inputs[i].element_size();
    total += (len[i] + 15) / 16 * 16;
  }
  auto w = make_work(OpType::ALLGATHER_COALESCED, "mep:all_gather_coalesced",
                     std::string(op) + " of " + std::to_string(inputs.size()) +
                         " tensors, " + std::to_string(total) +
                         " bytes (rank " + std::to_string(rank_) + ")",
                     inputs, all);
  return issue(w, [&](MepWork &w) {
    at::Tensor in = scratch(w, total, at::kByte);
    at::Tensor out = scratch(w, group_size_ * total, at::kByte);
    for (size_t i = 0; i < inputs.size(); i++)
      if (len[i])
        in.narrow(0, off[i], len[i])
            .view(inputs[i].scalar_type())
            .copy_(inputs[i].reshape({-1}));
    w.keep(in);
    w.keep(out);
    submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_allgather(c, data_of(in), data_of(out),
                           static_cast<size_t>(total), MEP_UINT8, r);
    });
    w.on_success([outputs, out, off, len, total](
                     const std::vector<int> &dropped) {
      for (size_t r = 0; r < outputs.size(); r++) {
        if (std::find(dropped.begin(), dropped.end(), static_cast<int>(r)) !=
            dropped.end())
          continue;  // a lost rank's tensors are left as they were
        for (size_t i = 0; i < outputs[r].size(); i++) {
          at::Tensor dst = outputs[r][i];
          if (!len[i]) continue;
          dst.copy_(out.narrow(0, static_cast<int64_t>(r) * total + off[i],
                               len[i])
                        .view(dst.scalar_type())
                        .view(dst.sizes()));
        }
      }
    });
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::gather(
    std::vector<std::vector<at::Tensor>> &outputs,
    std::vector<at::Tensor> &inputs, const c10d::GatherOptions &opts) {
  const char *op = "gather";
  check_count(op, "the input list", inputs.size(), 1);
  check_root(op, opts.rootRank);
  int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    check_count(op, "the output list", outputs.size(), 1);
    outs = outputs[0];
    check_count(op, "the gather list", outs.size(),
                static_cast<size_t>(group_size_));
    check_same(op, "gather_list", outs, in);
  }
  MemPath path = mem_path(op, concat(inputs, outs));
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda)
    return cuda_allgather(op, OpType::GATHER, "mep:gather", outs, in);
#endif
  require_host(op, path);
  Elems el = move_elems(in);
  at::Tensor src = contiguous_or_copy(in);
  auto w = make_work(OpType::GATHER, "mep:gather", what(op, in), inputs,
                     outs);
  return issue(w, [&](MepWork &w) {
    at::Tensor flat;
    if (rank_ == root) flat = scratch(w, group_size_ * in.numel(), in.scalar_type());
    w.keep(src);
    if (flat.defined()) w.keep(flat);
    submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_gather(c, data_of(src),
                        flat.defined() ? data_of(flat) : nullptr, el.count,
                        el.dtype, root, r);
    });
    if (flat.defined()) scatter_back(w, outs, flat, in.numel());
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::scatter(
    std::vector<at::Tensor> &outputs,
    std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ScatterOptions &opts) {
  const char *op = "scatter";
  check_count(op, "the output list", outputs.size(), 1);
  check_root(op, opts.rootRank);
  int root = static_cast<int>(opts.rootRank);
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    check_count(op, "the input list", inputs.size(), 1);
    ins = inputs[0];
    check_count(op, "the scatter list", ins.size(),
                static_cast<size_t>(group_size_));
    check_same(op, "scatter_list", ins, out);
  }
  MemPath path = mem_path(op, concat(outputs, ins));
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_scatter(out, ins, root);
#endif
  require_host(op, path);
  Elems el = move_elems(out);
  at::Tensor dst = contiguous_or_copy(out);
  auto w = make_work(OpType::SCATTER, "mep:scatter", what(op, out), ins,
                     outputs);
  return issue(w, [&](MepWork &w) {
    at::Tensor flat;
    if (rank_ == root)
      flat = flatten_into(scratch(w, total_numel(ins), out.scalar_type()), ins);
    w.keep(dst);
    if (flat.defined()) w.keep(flat);
    submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_scatter(c, flat.defined() ? data_of(flat) : nullptr,
                         data_of(dst), el.count, el.dtype, root, r);
    });
    copy_back(w, out, dst);
  });
}

}  // namespace mep_c10d
