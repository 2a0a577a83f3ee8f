// ops_reduce.cpp - broadcast, all-reduce (plain and coalesced), reduce and
// barrier.
#include <map>

#include "backend.hpp"
#include "errors.hpp"
#include "ops_util.hpp"
#include "tensors.hpp"

namespace mep_c10d {

using c10d::OpType;

c10::intrusive_ptr<c10d::Work> MepBackend::broadcast(
    std::vector<at::Tensor> &tensors, const c10d::BroadcastOptions &opts) {
  const char *op = "broadcast";
  MemPath path = mem_path(op, tensors);
  check_count(op, "the tensor list", tensors.size(), 1);
  check_root(op, opts.rootRank);
  if (opts.rootTensor != 0)
    throw_value("broadcast: rootTensor must be 0 (one tensor per process)");
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_broadcast(tensors, opts);
#endif
  require_host(op, path);
  at::Tensor t = tensors[0];
  Elems el = move_elems(t);
  at::Tensor buf = contiguous_or_copy(t);
  int root = static_cast<int>(opts.rootRank);
  auto w = make_work(OpType::BROADCAST, "mep:broadcast", what(op, t),
                     tensors, tensors);
  return issue(w, [&](MepWork &w) {
    w.keep(buf);
    submit(w, false, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_broadcast(c, data_of(buf), el.count, el.dtype, root, r);
    });
    if (rank_ != root) copy_back(w, t, buf);
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::allreduce(
    std::vector<at::Tensor> &tensors, const c10d::AllreduceOptions &opts) {
  const char *op = "all_reduce";
  MemPath path = mem_path(op, tensors);
  check_count(op, "the tensor list", tensors.size(), 1);
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_allreduce(tensors, opts.reduceOp, op, OpType::ALLREDUCE);
#endif
  require_host(op, path);
  at::Tensor t = tensors[0];
  Elems el = reduce_elems(op, t, opts.reduceOp);
  mep_op_t rop = reduce_op(op, opts.reduceOp, t.scalar_type());
  at::Tensor src = contiguous_or_copy(t);
  auto w = make_work(OpType::ALLREDUCE, "mep:all_reduce", what(op, t),
                     tensors, tensors);
  return issue(w, [&](MepWork &w) {
    // In place where t is contiguous: the core keeps a copy of the input
    // (it may run the collective again over survivors), made by its copy
    // thread while the all-reduce runs ([core] copy_thread), and puts it
    // back if the call fails; copy_back then has nothing to do.
    at::Tensor dst = src.is_same(t) ? t
                                    : scratch(w, t.numel(), t.scalar_type());
    w.keep(src);
    w.keep(dst);
    submit(w, false, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_allreduce(c, data_of(src), data_of(dst), el.count, el.dtype,
                           rop, r);
    });
    copy_back(w, t, dst);
  });
}

// One all-reduce per dtype, over the group's tensors packed end to end.
c10::intrusive_ptr<c10d::Work> MepBackend::allreduce_coalesced(
    std::vector<at::Tensor> &tensors,
    const c10d::AllreduceCoalescedOptions &opts) {
  const char *op = "all_reduce_coalesced";
  MemPath path = mem_path(op, tensors);
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_allreduce(tensors, opts.reduceOp, op,
                          OpType::ALLREDUCE_COALESCED);
#endif
  require_host(op, path);
  std::vector<at::ScalarType> order;
  std::map<at::ScalarType, std::vector<at::Tensor>> groups;
  int64_t total = 0;
  for (const auto &t : tensors) {
    reduce_elems(op, t, opts.reduceOp);
    reduce_op(op, opts.reduceOp, t.scalar_type());
    if (!groups.count(t.scalar_type())) order.push_back(t.scalar_type());
    groups[t.scalar_type()].push_back(t);
    total += t.numel();
  }
  std::string desc = std::string(op) + " of " + std::to_string(tensors.size()) +
                     " tensors, " + std::to_string(total) + " elements (rank " +
                     std::to_string(rank_) + " of " + std::to_string(group_size_) +
                     ")";
  auto w = make_work(OpType::ALLREDUCE_COALESCED, "mep:all_reduce_coalesced",
                     desc, tensors, tensors);
  return issue(w, [&](MepWork &w) {
    for (at::ScalarType st : order) {
      const auto &list = groups[st];
      const int64_t n = total_numel(list);
      at::Tensor src = list.size() == 1 && list[0].is_contiguous()
                           ? list[0].reshape({-1})
                           : flatten_into(scratch(w, n, st), list);
      at::Tensor flat = scratch(w, n, st);
      Elems el = reduce_elems(op, flat, opts.reduceOp);
      mep_op_t rop = reduce_op(op, opts.reduceOp, st);
      w.keep(src);
      w.keep(flat);
      submit(w, false, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_allreduce(c, data_of(src), data_of(flat), el.count,
                             el.dtype, rop, r);
      });
      w.on_success([list, flat](const std::vector<int> &) {
        int64_t off = 0;
        for (const auto &t : list) {
          at::Tensor dst = t;
          dst.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
          off += t.numel();
        }
      });
    }
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::reduce(
    std::vector<at::Tensor> &tensors, const c10d::ReduceOptions &opts) {
  const char *op = "reduce";
  MemPath path = mem_path(op, tensors);
  check_count(op, "the tensor list", tensors.size(), 1);
  check_root(op, opts.rootRank);
  if (opts.rootTensor != 0)
    throw_value("reduce: rootTensor must be 0 (one tensor per process)");
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_reduce(tensors, opts);
#endif
  require_host(op, path);
  at::Tensor t = tensors[0];
  Elems el = reduce_elems(op, t, opts.reduceOp);
  mep_op_t rop = reduce_op(op, opts.reduceOp, t.scalar_type());
  at::Tensor src = contiguous_or_copy(t);
  int root = static_cast<int>(opts.rootRank);
  auto w = make_work(OpType::REDUCE, "mep:reduce", what(op, t), tensors,
                     tensors);
  return issue(w, [&](MepWork &w) {
    at::Tensor dst;
    if (rank_ == root) dst = scratch(w, t.numel(), t.scalar_type());
    w.keep(src);
    submit(w, false, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_reduce(c, data_of(src), dst.defined() ? data_of(dst) : nullptr,
                        el.count, el.dtype, rop, root, r);
    });
    if (dst.defined()) copy_back(w, t, dst);
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::barrier(
    const c10d::BarrierOptions &opts) {
  auto w = make_work(OpType::BARRIER, "mep:barrier",
                     "barrier (rank " + std::to_string(rank_) + " of " +
                         std::to_string(group_size_) + ")",
                     {}, {});
  // barrier(timeout=...): its wait gives up then ("Timed out waiting");
  // the barrier itself goes on until the core's deadline.
  if (opts.timeout != c10d::kUnsetTimeout) w->set_wait_timeout(opts.timeout);
  return issue(w, [&](MepWork &w) {
    submit(w, false, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_barrier(c, r);
    });
  });
}

}  // namespace mep_c10d
