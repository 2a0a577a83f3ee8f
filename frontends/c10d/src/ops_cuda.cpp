// ops_cuda.cpp - the collectives on CUDA tensors (CUDA build): the core's
// mep_*_cuda calls on the current stream of the tensors' device, with
// staging for tensors that are not contiguous on that device. Copies back
// are enqueued right after the call, so they follow it on the stream; the
// blocks of ranks a degraded operation dropped are copied too (the host
// cannot know them when it enqueues).
//
// The core's CUDA calls are all-reduce, all-gather, reduce-scatter,
// all-to-all with equal blocks and broadcast; the other collectives are
// composed of them (each function says which and why). Every rank makes
// the same core calls in the same order whatever its role, so the group
// stays in step.
#include <algorithm>

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

// reduce: the core has no rooted reduction on CUDA memory, so an
// all-reduce, in place on the root and into scratch elsewhere (the
// non-roots' tensors stay as they were, as with NCCL). It moves what a
// reduce-scatter plus all-gather moves, about twice a tree reduce's bytes,
// in one call.
c10::intrusive_ptr<c10d::Work> MepBackend::cuda_reduce(
    std::vector<at::Tensor> &tensors, const c10d::ReduceOptions &opts) {
  const char *op = "reduce";
  at::Tensor t = tensors[0];
  Elems el = reduce_elems(op, t, opts.reduceOp);
  mep_op_t mop = reduce_op(op, opts.reduceOp, t.scalar_type());
  const bool root = rank_ == static_cast<int>(opts.rootRank);
  CudaCall cc(op, tensors);
  auto w = make_cuda_work(cc, OpType::REDUCE, "mep:reduce", what(op, t),
                          tensors, tensors);
  return issue(w, [&](MepWork &) {
    if (el.count) {
      at::Tensor src = root ? cc.inout(t) : cc.in(t);
      at::Tensor dst = root ? src : cc.temp(t.numel(), t.scalar_type());
      submit_cuda(*w, cc, false, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_allreduce_cuda(c, cuda_ptr(src), cuda_ptr(dst), el.count,
                                  el.dtype, mop, cc.raw_stream(), r);
      });
    }
    cc.finish(*w);
  });
}

// all_gather into a list, and gather: the core has no rooted gather on
// CUDA memory, and an all-to-all cannot send to the root alone (its blocks
// are equal), so every rank all-gathers into scratch and only the root
// (whose `outs` is the gather list; empty elsewhere) copies it out.
c10::intrusive_ptr<c10d::Work> MepBackend::cuda_allgather(
    const char *op, OpType type, const char *title,
    std::vector<at::Tensor> &outs, at::Tensor &in) {
  Elems el = move_elems(in);
  const int64_t n = in.numel();
  CudaCall cc(op, concat({in}, outs));
  auto w = make_cuda_work(cc, type, title, what(op, in), {in}, outs);
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

// scatter: an all-to-all of blocks of the output's size, in which the
// root sends block r of its list to rank r and the others send zeros;
// each rank keeps the block from the root. A broadcast of the whole list
// would move the same bytes into every rank but all of them out of the
// root's link (size - 1 times the list); the all-to-all takes one block
// out of each rank's link, the root's included.
c10::intrusive_ptr<c10d::Work> MepBackend::cuda_scatter(
    at::Tensor &out, std::vector<at::Tensor> &ins, int root) {
  const char *op = "scatter";
  Elems el = move_elems(out);
  const int64_t n = out.numel();
  CudaCall cc(op, concat({out}, ins));
  auto w = make_cuda_work(cc, OpType::SCATTER, "mep:scatter", what(op, out),
                          ins, {out});
  return issue(w, [&](MepWork &) {
    if (el.count) {
      at::Tensor send = cc.temp(group_size_ * n, out.scalar_type());
      if (rank_ == root)
        flatten_into(send, ins);
      else
        send.zero_();  // sent and dropped: no stale memory leaves the rank
      at::Tensor recv = cc.temp(group_size_ * n, out.scalar_type());
      submit_cuda(*w, cc, true, [&](mep_comm_t *c, mep_req_t **r) {
        return mep_alltoall_cuda(c, cuda_ptr(send), cuda_ptr(recv), el.count,
                                 el.dtype, cc.raw_stream(), r);
      });
      cc.copy_after(out, recv.narrow(0, static_cast<int64_t>(root) * n, n));
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

// An all-to-all whose pieces differ in size: sends[p] (send_units[p]
// units of unit_numel elements) goes to rank p, recvs[q] (recv_units[q]
// units) comes from rank q. The core's all-to-all takes equal blocks, so
// every piece travels in a block of the largest piece of the whole group.
struct MepBackend::Pieces {
  const char *unit;       // "rows", "elements"
  const char *recv_name;  // the torch argument that sized recvs
  int64_t unit_numel;
  at::ScalarType st;
  std::vector<at::Tensor> sends, recvs;  // views of the user's tensors
  std::vector<int64_t> send_units, recv_units;
  // The tensors the pieces are consecutive parts of (all_to_all_single),
  // or undefined (lists); when every piece fills its block they are the
  // core's buffers themselves, without packing.
  at::Tensor whole_in, whole_out;
};

// The split sizes are host data, so the ranks agree on the block with one
// host all-to-all of two int64 per pair (what p sends to q, and p's
// largest piece): every rank learns every rank's largest piece, and what
// each peer sends it, which it checks against what it expects. A rank
// that finds a disagreement still runs the collective (the others cannot
// know and would wait for it) and returns the disagreement, which the
// caller raises once the operation is enqueued.
std::string MepBackend::cuda_alltoall_pieces(CudaWork &w, CudaCall &cc,
                                             const Pieces &pc) {
  const size_t size = static_cast<size_t>(group_size_);
  int64_t mine = 0;
  for (size_t p = 0; p < size; p++)
    mine = std::max({mine, pc.send_units[p], pc.recv_units[p]});
  // A dropped rank's pair is left as it was: what we expect, and no
  // larger piece, so the survivors agree among themselves.
  std::vector<int64_t> out(2 * size), in(2 * size);
  for (size_t p = 0; p < size; p++) {
    out[2 * p] = pc.send_units[p];
    out[2 * p + 1] = mine;
    in[2 * p] = pc.recv_units[p];
    in[2 * p + 1] = 0;
  }
  submit(w, true, [&](mep_comm_t *c, mep_req_t **r) {
    return mep_alltoall(c, out.data(), in.data(), 2, MEP_INT64, r);
  }, false);  // blocking: a few bytes, and the sizes are needed now
  int64_t pad = mine;
  std::string bad;
  for (size_t q = 0; q < size; q++) {
    pad = std::max(pad, in[2 * q + 1]);
    if (bad.empty() && in[2 * q] != pc.recv_units[q])
      bad = "rank " + std::to_string(q) + " sends " +
            std::to_string(in[2 * q]) + " " + pc.unit + " to rank " +
            std::to_string(rank_) + ", which expects " +
            std::to_string(pc.recv_units[q]) + " (" + pc.recv_name + "[" +
            std::to_string(q) + "]); the operation ran, rank " +
            std::to_string(rank_) + "'s output is not valid";
  }
  const int64_t block = pad * pc.unit_numel;  // elements per rank
  if (block == 0) return bad;  // nothing anywhere: the same on every rank
  auto fills = [pad](const std::vector<int64_t> &units) {
    for (int64_t u : units)
      if (u != pad) return false;
    return true;
  };
  at::Tensor src, dst;
  if (pc.whole_in.defined() && fills(pc.send_units)) {
    src = cc.in(pc.whole_in);
  } else {
    // Packing copies run on the current stream, which is the operation's.
    src = cc.temp(static_cast<int64_t>(size) * block, pc.st);
    for (size_t p = 0; p < size; p++) {
      at::Tensor slot = src.narrow(0, static_cast<int64_t>(p) * block, block);
      const int64_t used = pc.send_units[p] * pc.unit_numel;
      if (used)
        slot.narrow(0, 0, used).view(pc.sends[p].sizes()).copy_(pc.sends[p]);
      if (used < block)  // sent and dropped: no stale memory leaves the rank
        slot.narrow(0, used, block - used).zero_();
    }
  }
  const bool direct_out = pc.whole_out.defined() && fills(pc.recv_units);
  dst = direct_out ? cc.out(pc.whole_out)
                   : cc.temp(static_cast<int64_t>(size) * block, pc.st);
  Elems el = move_elems(src);
  submit_cuda(w, cc, true, [&](mep_comm_t *c, mep_req_t **r) {
    return mep_alltoall_cuda(c, cuda_ptr(src), cuda_ptr(dst), el.count / size,
                             el.dtype, cc.raw_stream(), r);
  });
  if (!direct_out)
    for (size_t q = 0; q < size; q++) {
      const int64_t used = pc.recv_units[q] * pc.unit_numel;
      if (used)
        cc.copy_after(pc.recvs[q],
                      dst.narrow(0, static_cast<int64_t>(q) * block, used));
    }
  return bad;
}

c10::intrusive_ptr<c10d::Work> MepBackend::cuda_alltoall(
    at::Tensor &output, at::Tensor &input,
    const std::vector<int64_t> &out_splits,
    const std::vector<int64_t> &in_splits) {
  const char *op = "all_to_all_single";
  if (out_splits.empty() && in_splits.empty()) {
    // Equal blocks on every rank (split sizes are given on all ranks or on
    // none): the core's call as it is, without agreeing on sizes first.
    check_equal_blocks(op, input, output, group_size_);
    Elems el = move_elems(input);
    CudaCall cc(op, {input, output});
    auto w = make_cuda_work(cc, OpType::ALLTOALL_BASE,
                            "mep:all_to_all_single", what(op, input), {input},
                            {output});
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
  Pieces pc;
  pc.unit = "rows";
  pc.recv_name = "output_split_sizes";
  pc.unit_numel = row_numel(input);
  pc.st = input.scalar_type();
  pc.send_units = split_rows(op, "input", input, in_splits, group_size_);
  pc.recv_units = split_rows(op, "output", output, out_splits, group_size_);
  // Rows of a 0-dim tensor: itself, as one row.
  at::Tensor in_rows = input.dim() ? input : input.unsqueeze(0);
  at::Tensor out_rows = output.dim() ? output : output.unsqueeze(0);
  int64_t in_off = 0, out_off = 0;
  for (int p = 0; p < group_size_; p++) {
    pc.sends.push_back(in_rows.narrow(0, in_off, pc.send_units[p]));
    pc.recvs.push_back(out_rows.narrow(0, out_off, pc.recv_units[p]));
    in_off += pc.send_units[p];
    out_off += pc.recv_units[p];
  }
  pc.whole_in = input;
  pc.whole_out = output;
  CudaCall cc(op, {input, output});
  auto w = make_cuda_work(cc, OpType::ALLTOALL_BASE, "mep:all_to_all_single",
                          what(op, input), {input}, {output});
  return issue(w, [&](MepWork &) {
    std::string bad = cuda_alltoall_pieces(*w, cc, pc);
    cc.finish(*w);
    if (!bad.empty())
      std::rethrow_exception(mep_error(MEP_ERR_MISMATCH, w->what(), bad));
  });
}

c10::intrusive_ptr<c10d::Work> MepBackend::cuda_alltoall_list(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs) {
  const char *op = "all_to_all";
  const at::Tensor &like = inputs[0];
  CudaCall cc(op, concat(inputs, outputs));
  auto w = make_cuda_work(
      cc, OpType::ALLTOALL, "mep:all_to_all",
      std::string(op) + " of " + std::to_string(total_numel(inputs)) + " " +
          dtype_name(like.scalar_type()) + " elements (rank " +
          std::to_string(rank_) + " of " + std::to_string(group_size_) + ")",
      inputs, outputs);
  Pieces pc;
  pc.unit = "elements";
  pc.recv_name = "output_tensor_list";
  pc.unit_numel = 1;
  pc.st = like.scalar_type();
  pc.sends = inputs;
  pc.recvs = outputs;
  for (const auto &t : inputs) pc.send_units.push_back(t.numel());
  for (const auto &t : outputs) pc.recv_units.push_back(t.numel());
  return issue(w, [&](MepWork &) {
    std::string bad = cuda_alltoall_pieces(*w, cc, pc);
    cc.finish(*w);
    if (!bad.empty())
      std::rethrow_exception(mep_error(MEP_ERR_MISMATCH, w->what(), bad));
  });
}

}  // namespace mep_c10d
