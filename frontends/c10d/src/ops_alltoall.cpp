// ops_alltoall.cpp - all-to-all, flat with (un)even splits and as lists.
#include <functional>
#include <memory>
#include <numeric>

#include "backend.hpp"
#include "errors.hpp"
#include "ops_util.hpp"
#include "tensors.hpp"

namespace mep_c10d {

using c10d::OpType;

namespace {

// Counts and displacements, in the core's elements, one per rank.
struct Layout {
  std::vector<size_t> counts, displs;
};

// The core's uneven all-to-all of flat src into flat dst; the layouts must
// outlive the call (the work keeps them, the Submit runs at once).
std::function<int(mep_comm_t *, mep_req_t **)> alltoallv_call(
    const at::Tensor &src, const at::Tensor &dst, const Layout &sl,
    const Layout &rl, mep_dtype_t dtype) {
  return [&src, &dst, &sl, &rl, dtype](mep_comm_t *c, mep_req_t **r) {
    return mep_alltoallv(c, data_of(src), sl.counts.data(), sl.displs.data(),
                         data_of(dst), rl.counts.data(), rl.displs.data(),
                         dtype, r);
  };
}

// Rows of dim 0 per rank (split_rows), in the core's elements.
Layout rows_layout(const char *op, const char *side, const at::Tensor &t,
                   const std::vector<int64_t> &splits, int size,
                   size_t row_elems) {
  Layout l;
  size_t off = 0;
  for (int64_t v : split_rows(op, side, t, splits, size)) {
    l.counts.push_back(static_cast<size_t>(v) * row_elems);
    l.displs.push_back(off);
    off += static_cast<size_t>(v) * row_elems;
  }
  return l;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> MepBackend::alltoall_base(
    at::Tensor &output, at::Tensor &input, std::vector<int64_t> &out_splits,
    std::vector<int64_t> &in_splits, const c10d::AllToAllOptions &) {
  const char *op = "all_to_all_single";
  MemPath path = mem_path(op, {output, input});
  if (output.scalar_type() != input.scalar_type())
    throw_value(std::string(op) + ": the output has " + describe(output) +
                ", the input " + describe(input));
  if (row_numel(output) != row_numel(input))
    throw_value(std::string(op) + ": rows of the output have " +
                std::to_string(row_numel(output)) + " elements, of the input " +
                std::to_string(row_numel(input)));
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_alltoall(output, input, out_splits, in_splits);
#endif
  require_host(op, path);
  Elems el = move_elems(input);
  size_t row = static_cast<size_t>(row_numel(input)) * input.element_size() /
        mep_dtype_size(el.dtype);
  at::Tensor src = contiguous_or_copy(input);
  at::Tensor dst = contiguous_or_copy(output);
  auto w = make_work(OpType::ALLTOALL_BASE, "mep:all_to_all_single",
                     what(op, input), {input}, {output});
  if (out_splits.empty() && in_splits.empty()) {
    check_equal_blocks(op, input, output, group_size_);
    return issue(w, [&](MepWork &w) {
      w.keep(src);
      w.keep(dst);
      submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_alltoall(c, data_of(src), data_of(dst),
                            el.count / static_cast<size_t>(group_size_), el.dtype,
                            r);
      });
      copy_back(w, output, dst);
    });
  }
  auto sl = std::make_shared<Layout>(
      rows_layout(op, "input", input, in_splits, group_size_, row));
  auto rl = std::make_shared<Layout>(
      rows_layout(op, "output", output, out_splits, group_size_, row));
  return issue(w, [&](MepWork &w) {
    w.keep(src);
    w.keep(dst);
    submit(w, true, alltoallv_call(src, dst, *sl, *rl, el.dtype));
    copy_back(w, output, dst);
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::alltoall(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllToAllOptions &) {
  const char *op = "all_to_all";
  MemPath path = mem_path(op, concat(inputs, outputs));
  check_count(op, "the input list", inputs.size(), static_cast<size_t>(group_size_));
  check_count(op, "the output list", outputs.size(),
              static_cast<size_t>(group_size_));
  const at::Tensor &like = inputs[0];
  for (const auto &t : concat(inputs, outputs))
    if (t.scalar_type() != like.scalar_type())
      throw_value(std::string(op) + ": tensors of dtypes " +
                  dtype_name(like.scalar_type()) + " and " +
                  dtype_name(t.scalar_type()) + " in one call");
#if MEP_C10D_CUDA
  if (path == MemPath::Cuda) return cuda_alltoall_list(outputs, inputs);
#endif
  require_host(op, path);
  Elems el = move_elems(like);
  auto sl = std::make_shared<Layout>();
  auto rl = std::make_shared<Layout>();
  size_t soff = 0, roff = 0;
  for (int r = 0; r < group_size_; r++) {
    size_t sc = elems_of(inputs[r], el.dtype), rc = elems_of(outputs[r], el.dtype);
    sl->counts.push_back(sc);
    sl->displs.push_back(soff);
    rl->counts.push_back(rc);
    rl->displs.push_back(roff);
    soff += sc;
    roff += rc;
  }
  std::vector<at::Tensor> outs = outputs;
  auto w = make_work(OpType::ALLTOALL, "mep:all_to_all",
                     std::string(op) + " of " + std::to_string(total_numel(inputs)) +
                         " " + dtype_name(like.scalar_type()) +
                         " elements (rank " + std::to_string(rank_) + " of " +
                         std::to_string(group_size_) + ")",
                     inputs, outputs);
  return issue(w, [&](MepWork &w) {
    at::Tensor src = flatten_into(
        scratch(w, total_numel(inputs), like.scalar_type()), inputs);
    at::Tensor dst = scratch(w, total_numel(outs), like.scalar_type());
    w.keep(src);
    w.keep(dst);
    submit(w, true, alltoallv_call(src, dst, *sl, *rl, el.dtype));
    w.on_success([outs, dst](const std::vector<int> &dropped) {
      int64_t off = 0;
      for (size_t r = 0; r < outs.size(); r++) {
        at::Tensor t = outs[r];
        bool lost = false;
        for (int d : dropped) lost |= d == static_cast<int>(r);
        if (!lost) t.copy_(dst.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
      }
    });
  });
}

void MepBackend::check_tag(const char *op, int tag) {
  if (tag >= kInternalTagBase)
    throw_value(std::string(op) + ": tag " + std::to_string(tag) +
                " is reserved: tags from " + std::to_string(kInternalTagBase) +
                " up carry the backend's own messages (monitored_barrier)");
}

c10::intrusive_ptr<c10d::Work> MepBackend::send(
    std::vector<at::Tensor> &tensors, int dst_rank, int tag) {
  const char *op = "send";
  require_host(op, mem_path(op, tensors));
  check_count(op, "the tensor list", tensors.size(), 1);
  check_tag(op, tag);
  at::Tensor t = tensors[0];
  at::Tensor buf = contiguous_or_copy(t);
  size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  auto w = make_work(OpType::SEND, "mep:send",
                     what(op, t) + " to rank " + std::to_string(dst_rank) +
                         " tag " + std::to_string(tag),
                     tensors, {});
  return issue(w, [&](MepWork &w) {
    w.keep(buf);
    submit(w, false, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_send(c, data_of(buf), bytes, dst_rank, tag, r);
    });
  });
}

// recv, and recvAnysource with src_rank MEP_ANY_SOURCE.
c10::intrusive_ptr<c10d::Work> MepBackend::recv_from(
    std::vector<at::Tensor> &tensors, int src_rank, int tag) {
  const bool any = src_rank == MEP_ANY_SOURCE;
  const char *op = any ? "recv from any source" : "recv";
  require_host(op, mem_path(op, tensors));
  check_count(op, "the tensor list", tensors.size(), 1);
  check_tag(op, tag);
  at::Tensor t = tensors[0];
  size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  std::string from =
      any ? " from any rank" : " from rank " + std::to_string(src_rank);
  auto w = make_work(any ? OpType::RECVANYSOURCE : OpType::RECV,
                     any ? "mep:recvAnySource" : "mep:recv",
                     what(op, t) + from + " tag " + std::to_string(tag), {},
                     tensors);
  w->mark_recv();
  return issue(w, [&](MepWork &w) {
    at::Tensor buf =
        t.is_contiguous() ? t : scratch(w, t.numel(), t.scalar_type());
    w.keep(buf);
    submit(w, false, [&](mep_comm_t *c, mep_req_t **r) {
      return mep_recv(c, data_of(buf), bytes, src_rank, tag, r);
    });
    MepWork *self = &w;
    w.on_success([self, bytes](const std::vector<int> &) {
      size_t got = mep_req_bytes(self->request(0));
      if (got != bytes)
        std::rethrow_exception(mep_error(
            MEP_ERR_MISMATCH, self->what(),
            "received " + std::to_string(got) + " bytes from rank " +
                std::to_string(mep_req_source(self->request(0))) +
                ", the tensor has " + std::to_string(bytes) +
                " (the sender's tensor differs)"));
    });
    copy_back(w, t, buf);
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::recv(
    std::vector<at::Tensor> &tensors, int src_rank, int tag) {
  // The core takes a negative peer for any source: not what recv asks.
  if (src_rank < 0)
    throw_value("recv: negative source rank " + std::to_string(src_rank));
  return recv_from(tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> MepBackend::recvAnysource(
    std::vector<at::Tensor> &tensors, int tag) {
  return recv_from(tensors, MEP_ANY_SOURCE, tag);
}

}  // namespace mep_c10d
