// ops.cpp - mep.ep's per-call path in C++ (the extension mep.ep._ops):
// the output tensors come from torch's caching allocator without a trip
// through Python, and the C API (mep/ep.h) is called directly instead of
// through ctypes. Checking the arguments stays in Python (mep/ep/__init__.py), which
// calls these only with tensors it has checked; the return code goes back
// to Python too, which raises mep's error with its message. Without this
// module (a build without the c10d backend, or another torch) mep.ep takes
// the ctypes path.
#include <torch/extension.h>

#if MEP_EP_OPS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "mep/ep.h"

namespace {

mep_ep_buffer_t *buffer(uintptr_t p) {
  return reinterpret_cast<mep_ep_buffer_t *>(p);
}

template <typename T>
T *ptr_or_null(const c10::optional<at::Tensor> &t) {
  return t ? static_cast<T *>(t->data_ptr()) : nullptr;
}

// The stream a call runs on: the current one of the tensors' device.
void *stream_of(const at::Tensor &t) {
#if MEP_EP_OPS_CUDA
  if (t.is_cuda())
    return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#endif
  (void)t;
  return nullptr;
}

// One phase (or both) of a dispatch whose outputs exist: the first call,
// and the receive hook of a two-phase one.
int dispatch_phase(uintptr_t buf, const at::Tensor &x, const at::Tensor &topk_idx,
                   const at::Tensor &recv_x,
                   const c10::optional<at::Tensor> &scales,
                   const at::Tensor &src_info, const at::Tensor &layout_range,
                   const at::Tensor &count, int64_t flags,
                   const c10::optional<at::Tensor> &active, int64_t timeout_us) {
  mep_ep_dispatch_args_t a = {};
  a.struct_size = sizeof a;
  a.x = x.data_ptr();
  a.topk_idx = topk_idx.data_ptr<int64_t>();
  a.num_tokens = static_cast<int>(x.size(0));
  a.num_topk = static_cast<int>(topk_idx.size(1));
  a.flags = static_cast<unsigned>(flags);
  a.active_ranks = ptr_or_null<int32_t>(active);
  a.timeout_us = timeout_us;
  a.recv_x = recv_x.data_ptr();
  a.recv_scales = scales ? scales->data_ptr() : nullptr;
  a.recv_src_info = src_info.data_ptr<int32_t>();
  a.recv_layout_range = layout_range.data_ptr<int64_t>();
  a.recv_count = count.data_ptr<int32_t>();
  a.stream = stream_of(x);
  return mep_ep_dispatch(buffer(buf), &a);
}

// A dispatch with new outputs: (rc, recv_x, scales or None, src_info,
// layout_range, count). scales [L, H/g, R*T], as ep.h lays them out.
py::tuple dispatch(uintptr_t buf, const at::Tensor &x, const at::Tensor &topk_idx,
                   int64_t local, int64_t ranks, int64_t tokens, int64_t flags,
                   const c10::optional<at::Tensor> &active, int64_t timeout_us) {
  const int64_t H = x.size(1), S = ranks * tokens;
  const auto dev = x.options();
  const bool fp8 = flags & MEP_EP_FP8, ue8m0 = flags & MEP_EP_UE8M0;
  at::Tensor recv_x = at::empty(
      {local, S, H}, dev.dtype(fp8 ? at::kFloat8_e4m3fn : at::kBFloat16));
  c10::optional<at::Tensor> scales;
  if (fp8)
    scales = ue8m0 ? at::empty({local, H / 512, S}, dev.dtype(at::kInt))
                   : at::empty({local, H / 128, S}, dev.dtype(at::kFloat));
  at::Tensor src_info = at::empty({local, S}, dev.dtype(at::kInt));
  at::Tensor layout_range = at::empty({local, ranks}, dev.dtype(at::kLong));
  at::Tensor count = at::empty({local}, dev.dtype(at::kInt));
  int rc = dispatch_phase(buf, x, topk_idx, recv_x, scales, src_info,
                          layout_range, count, flags, active, timeout_us);
  return py::make_tuple(rc, recv_x, scales ? py::cast(*scales) : py::none(),
                        src_info, layout_range, count);
}

// One phase (or both) of a combine into `out`; x_ptr is x's data or, for a
// zero-copy combine, the buffer's combine area.
int combine_into(uintptr_t buf, uintptr_t x_ptr, const at::Tensor &topk_idx,
                 const at::Tensor &topk_weights, const at::Tensor &src_info,
                 const at::Tensor &layout_range, const at::Tensor &out,
                 int64_t flags, const c10::optional<at::Tensor> &active,
                 int64_t timeout_us) {
  mep_ep_combine_args_t a = {};
  a.struct_size = sizeof a;
  a.x = reinterpret_cast<const void *>(x_ptr);
  a.topk_idx = topk_idx.data_ptr<int64_t>();
  a.topk_weights = topk_weights.data_ptr<float>();
  a.src_info = src_info.data_ptr<int32_t>();
  a.layout_range = layout_range.data_ptr<int64_t>();
  a.num_tokens = static_cast<int>(topk_idx.size(0));
  a.num_topk = static_cast<int>(topk_idx.size(1));
  a.flags = static_cast<unsigned>(flags);
  a.active_ranks = ptr_or_null<int32_t>(active);
  a.timeout_us = timeout_us;
  a.out = out.data_ptr();
  a.stream = stream_of(out);
  return mep_ep_combine(buffer(buf), &a);
}

// A combine into a new bf16 [tokens, hidden] tensor: (rc, out).
py::tuple combine(uintptr_t buf, uintptr_t x_ptr, const at::Tensor &topk_idx,
                  const at::Tensor &topk_weights, const at::Tensor &src_info,
                  const at::Tensor &layout_range, int64_t hidden, int64_t flags,
                  const c10::optional<at::Tensor> &active, int64_t timeout_us) {
  at::Tensor out = at::empty({topk_idx.size(0), hidden},
                             topk_idx.options().dtype(at::kBFloat16));
  int rc = combine_into(buf, x_ptr, topk_idx, topk_weights, src_info,
                        layout_range, out, flags, active, timeout_us);
  return py::make_tuple(rc, out);
}

}  // namespace

PYBIND11_MODULE(_ops, m) {
  m.doc() = "mep.ep's per-call path in C++ (mep.ep checks the arguments)";
  m.def("dispatch", &dispatch, py::arg("buf"), py::arg("x"), py::arg("topk_idx"),
        py::arg("local"), py::arg("ranks"), py::arg("tokens"), py::arg("flags"),
        py::arg("active"), py::arg("timeout_us"));
  m.def("dispatch_phase", &dispatch_phase);
  m.def("combine_into", &combine_into);
  m.def("combine", &combine);
}
