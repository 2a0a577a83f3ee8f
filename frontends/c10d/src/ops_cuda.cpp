// ops_cuda.cpp - the collectives on CUDA tensors (CUDA build): the core's
// mep_*_cuda calls on the current stream of the tensors' device, with
// staging for tensors that are not contiguous on that device. Copies back
// are enqueued right after the call, so they follow it on the stream; the
// blocks of ranks a degraded operation dropped are copied too (the host
// cannot know them when it enqueues).
#include "backend.hpp"
#include "errors.hpp"
#include "ops_util.hpp"
#include "tensors.hpp"

namespace mep_c10d {

using c10d::OpType;

namespace {

// Under capture only the kernel path can be recorded into a graph.
std::string capture_note(const CudaCall &cc) {
  return cc.capturing()
             ? " while the stream captures a CUDA graph (capture needs "
               "mep.cuda_path(pg) == \"kernel\": GPUs of one host that "
               "reach each other)"
             : "";
}

}  // namespace

c10::intrusive_ptr<CudaWork> MepBackend::make_cuda_work(
    const CudaCall &cc, OpType type, const char *title, std::string what,
    std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<CudaWork>(comm_, rank_, type, title,
                                       std::move(what) + capture_note(cc),
                                       ++seq_, std::move(inputs),
                                       std::move(outputs), cc.stream());
}

void MepBackend::submit_cuda(CudaWork &w, const CudaCall &cc, bool sized,
                             const Submit &f) {
  submit(w, sized, f, !cc.capturing());
}

c10::intrusive_ptr<c10d::Work> MepBackend::cuda_broadcast(
    std::vector<at::Tensor> &tensors, const c10d::BroadcastOptions &opts) {
  const char *op = "broadcast";
  at::Tensor t = tensors[0];
  Elems el = move_elems(t);
  int root = static_cast<int>(opts.rootRank);
  CudaCall cc(op, tensors);
  auto w = make_cuda_work(cc, OpType::BROADCAST, "mep:broadcast", what(op, t),
                          tensors, tensors);
  return issue(w, [&](MepWork &) {
    if (el.count) {
      at::Tensor buf = cc.inout(t);
      submit_cuda(*w, cc, false, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_broadcast_cuda(c, cuda_ptr(buf), el.count, el.dtype, root,
                                  cc.raw_stream(), r);
      });
    }
    cc.finish(*w);
  });
}

// All-reduce of each tensor in place (one tensor for all_reduce, several
// for the coalesced form): the core copies an in-place input aside itself.
c10::intrusive_ptr<c10d::Work> MepBackend::cuda_allreduce(
    std::vector<at::Tensor> &tensors, const c10d::ReduceOp &rop,
    const char *op, OpType type) {
  std::vector<Elems> els;
  std::vector<mep_op_t> mops;
  int64_t total = 0;
  for (const auto &t : tensors) {
    els.push_back(reduce_elems(op, t, rop));
    mops.push_back(reduce_op(op, rop, t.scalar_type()));
    total += t.numel();
  }
  std::string desc =
      tensors.size() == 1
          ? what(op, tensors[0])
          : std::string(op) + " of " + std::to_string(tensors.size()) +
                " tensors, " + std::to_string(total) + " elements (rank " +
                std::to_string(rank_) + " of " + std::to_string(group_size_) +
                ")";
  CudaCall cc(op, tensors);
  auto w = make_cuda_work(cc, type, type == OpType::ALLREDUCE
                                        ? "mep:all_reduce"
                                        : "mep:all_reduce_coalesced",
                          desc, tensors, tensors);
  return issue(w, [&](MepWork &) {
    for (size_t i = 0; i < tensors.size(); i++) {
      if (!els[i].count) continue;  // the same on every rank
      at::Tensor buf = cc.inout(tensors[i]);
      submit_cuda(*w, cc, false, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_allreduce_cuda(c, cuda_ptr(buf), cuda_ptr(buf),
                                  els[i].count, els[i].dtype, mops[i],
                                  cc.raw_stream(), r);
      });
    }
    cc.finish(*w);
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::cuda_allgather(
    std::vector<at::Tensor> &outs, at::Tensor &in) {
  const char *op = "all_gather";
  Elems el = move_elems(in);
  const int64_t n = in.numel();
  CudaCall cc(op, concat({in}, outs));
  auto w = make_cuda_work(cc, OpType::ALLGATHER, "mep:all_gather",
                          what(op, in), {in}, outs);
  return issue(w, [&](MepWork &) {
    if (el.count) {
      at::Tensor src = cc.in(in);
      at::Tensor flat = cc.temp(group_size_ * n, in.scalar_type());
      submit_cuda(*w, cc, true, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_allgather_cuda(c, cuda_ptr(src), cuda_ptr(flat), el.count,
                                  el.dtype, cc.raw_stream(), r);
      });
      for (size_t r = 0; r < outs.size(); r++)
        cc.copy_after(outs[r], flat.narrow(0, static_cast<int64_t>(r) * n, n));
    }
    cc.finish(*w);
  });
}

// All-gathers inputs[i] into the flat outputs[i], one call each.
c10::intrusive_ptr<c10d::Work> MepBackend::cuda_gather_into(
    const char *op, OpType type, std::vector<at::Tensor> &outputs,
    std::vector<at::Tensor> &inputs) {
  for (size_t i = 0; i < inputs.size(); i++) {
    const at::Tensor &out = outputs[i], &in = inputs[i];
    if (out.scalar_type() != in.scalar_type() ||
        out.numel() != group_size_ * in.numel())
      throw_value(std::string(op) + ": the output has " + describe(out) +
                  ", expected " + std::to_string(group_size_) + " x " +
                  describe(in));
  }
  CudaCall cc(op, concat(inputs, outputs));
  std::string desc = inputs.size() == 1
                         ? what(op, inputs[0])
                         : std::string(op) + " of " +
                               std::to_string(inputs.size()) +
                               " tensors (rank " + std::to_string(rank_) + ")";
  auto w = make_cuda_work(cc, type, type == OpType::_ALLGATHER_BASE
                                        ? "mep:all_gather_into_tensor"
                                        : "mep:all_gather_into_tensor_coalesced",
                          desc, inputs, outputs);
  return issue(w, [&](MepWork &) {
    for (size_t i = 0; i < inputs.size(); i++) {
      Elems el = move_elems(inputs[i]);
      if (!el.count) continue;
      at::Tensor src = cc.in(inputs[i]);
      at::Tensor dst = cc.out(outputs[i]);
      submit_cuda(*w, cc, true, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_allgather_cuda(c, cuda_ptr(src), cuda_ptr(dst), el.count,
                                  el.dtype, cc.raw_stream(), r);
      });
    }
    cc.finish(*w);
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::cuda_reduce_scatter(
    at::Tensor &out, std::vector<at::Tensor> &ins, const c10d::ReduceOp &rop) {
  const char *op = "reduce_scatter";
  Elems el = reduce_elems(op, out, rop);
  mep_op_t mop = reduce_op(op, rop, out.scalar_type());
  CudaCall cc(op, concat({out}, ins));
  auto w = make_cuda_work(cc, OpType::REDUCE_SCATTER, "mep:reduce_scatter",
                          what(op, out), ins, {out});
  return issue(w, [&](MepWork &) {
    if (el.count) {
      // flatten_into copies on the current stream, which the guard made
      // the operation's.
      at::Tensor flat =
          flatten_into(cc.temp(total_numel(ins), out.scalar_type()), ins);
      at::Tensor dst = cc.out(out);
      submit_cuda(*w, cc, true, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_reduce_scatter_cuda(c, cuda_ptr(flat), cuda_ptr(dst),
                                       el.count, el.dtype, mop,
                                       cc.raw_stream(), r);
      });
    }
    cc.finish(*w);
  });
}

// Reduce-scatters the flat inputs[i] into outputs[i], one call each.
c10::intrusive_ptr<c10d::Work> MepBackend::cuda_reduce_scatter_from(
    const char *op, OpType type, std::vector<at::Tensor> &outputs,
    std::vector<at::Tensor> &inputs, const c10d::ReduceOp &rop) {
  std::vector<Elems> els;
  std::vector<mep_op_t> mops;
  for (size_t i = 0; i < inputs.size(); i++) {
    const at::Tensor &out = outputs[i], &in = inputs[i];
    if (out.scalar_type() != in.scalar_type() ||
        in.numel() != group_size_ * out.numel())
      throw_value(std::string(op) + ": the input has " + describe(in) +
                  ", expected " + std::to_string(group_size_) + " x " +
                  describe(out));
    els.push_back(reduce_elems(op, out, rop));
    mops.push_back(reduce_op(op, rop, out.scalar_type()));
  }
  CudaCall cc(op, concat(inputs, outputs));
  std::string desc = outputs.size() == 1
                         ? what(op, outputs[0])
                         : std::string(op) + " of " +
                               std::to_string(inputs.size()) +
                               " tensors (rank " + std::to_string(rank_) + ")";
  auto w = make_cuda_work(cc, type, type == OpType::_REDUCE_SCATTER_BASE
                                        ? "mep:reduce_scatter_tensor"
                                        : "mep:reduce_scatter_tensor_coalesced",
                          desc, inputs, outputs);
  return issue(w, [&](MepWork &) {
    for (size_t i = 0; i < inputs.size(); i++) {
      if (!els[i].count) continue;
      at::Tensor src = cc.in(inputs[i]);
      at::Tensor dst = cc.out(outputs[i]);
      submit_cuda(*w, cc, true, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_reduce_scatter_cuda(c, cuda_ptr(src), cuda_ptr(dst),
                                       els[i].count, els[i].dtype, mops[i],
                                       cc.raw_stream(), r);
      });
    }
    cc.finish(*w);
  });
}

namespace {

// Whether `splits` (rows per rank, or empty) is the even share of `rows`.
bool even_splits(const std::vector<int64_t> &splits, int64_t rows, int size) {
  if (splits.empty()) return true;
  if (splits.size() != static_cast<size_t>(size) || rows % size) return false;
  for (int64_t s : splits)
    if (s != rows / size) return false;
  return true;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> MepBackend::cuda_alltoall(
    at::Tensor &output, at::Tensor &input,
    const std::vector<int64_t> &out_splits,
    const std::vector<int64_t> &in_splits) {
  const char *op = "all_to_all_single";
  const int64_t in_rows = input.dim() ? input.size(0) : 1;
  const int64_t out_rows = output.dim() ? output.size(0) : 1;
  if (!even_splits(in_splits, in_rows, group_size_) ||
      !even_splits(out_splits, out_rows, group_size_))
    throw_value(std::string(op) +
                ": uneven split sizes are not supported on CUDA tensors yet "
                "(equal splits are; or move the tensors to the CPU)");
  if (input.numel() != output.numel() || input.numel() % group_size_)
    throw_value(std::string(op) + ": the input has " + describe(input) +
                " and the output " + describe(output) +
                "; equal splits need the same number, divisible by " +
                std::to_string(group_size_));
  Elems el = move_elems(input);
  CudaCall cc(op, {input, output});
  auto w = make_cuda_work(cc, OpType::ALLTOALL_BASE, "mep:all_to_all_single",
                          what(op, input), {input}, {output});
  return issue(w, [&](MepWork &) {
    if (el.count) {
      at::Tensor src = cc.in(input);
      at::Tensor dst = cc.out(output);
      submit_cuda(*w, cc, true, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_alltoall_cuda(c, cuda_ptr(src), cuda_ptr(dst),
                                 el.count / static_cast<size_t>(group_size_),
                                 el.dtype, cc.raw_stream(), r);
      });
    }
    cc.finish(*w);
  });
}

}  // namespace mep_c10d
