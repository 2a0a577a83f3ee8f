// ops.cpp - mep.ep's per-call path in C++ (the extension mep.ep._ops):
// the output tensors come from torch's caching allocator without a trip
// through Python, and the C API (mep/ep.h) is called directly instead of
// through ctypes. Two ways in: dispatch/combine take tensors that
// mep/ep/__init__.py has checked; Fast (one per buffer, after its first
// call) checks a call itself and makes it only when Python's checks would
// have let it through unchanged, else returns None and Python's path
// raises the error it names. Its checks read no tensor attribute from
// Python, which under a TorchFunctionMode (torch.set_default_device, as
// DeepEP's tests use) costs microseconds each. Return codes go back to
// Python, which raises mep's error with its message. Without this module
// (a build without the c10d backend, or another torch) mep.ep takes the
// ctypes path.
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <initializer_list>

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
                   const c10::optional<at::Tensor> &active, int64_t timeout_us,
                   const c10::optional<at::Tensor> &stats) {
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
  a.recv_stats = ptr_or_null<int32_t>(stats);
  return mep_ep_dispatch(buffer(buf), &a);
}

// A dispatch with new outputs: (rc, recv_x, scales or None, src_info,
// layout_range, count). scales is [L, R*T, H/g], a transposed view of
// [L, H/g, R*T] as ep.h lays them out (DeepEP's layout), whose data_ptr
// dispatch_phase takes as well.
py::tuple dispatch(uintptr_t buf, const at::Tensor &x, const at::Tensor &topk_idx,
                   int64_t local, int64_t ranks, int64_t tokens, int64_t flags,
                   const c10::optional<at::Tensor> &active, int64_t timeout_us,
                   const c10::optional<at::Tensor> &stats) {
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
                          layout_range, count, flags, active, timeout_us,
                          stats);
  return py::make_tuple(
      rc, recv_x, scales ? py::cast(scales->transpose(1, 2)) : py::none(),
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

// ---------------------------------------------------------------- Fast

// What a buffer was made for: each call is checked against it.
struct Fast {
  uintptr_t buf;
  int64_t local, ranks, tokens, hidden, experts;
  at::Device device;
  uintptr_t combine_buffer; // the zero-copy combine's source
};

// The tensor `h` holds when it is one of this dtype and these sizes (-1:
// any) on the buffer's device, contiguous unless told otherwise; else
// nullopt, as for anything that is not a tensor.
c10::optional<at::Tensor> fits(const Fast &f, py::handle h, at::ScalarType dt,
                               std::initializer_list<int64_t> sizes,
                               bool contiguous = true) {
  if (!THPVariable_Check(h.ptr())) return c10::nullopt;
  const at::Tensor &t = THPVariable_Unpack(h.ptr());
  if (t.scalar_type() != dt || t.dim() != static_cast<int64_t>(sizes.size()) ||
      t.device() != f.device || (contiguous && !t.is_contiguous()))
    return c10::nullopt;
  int64_t i = 0;
  for (int64_t want : sizes) {
    if (want >= 0 && t.size(i) != want) return c10::nullopt;
    i++;
  }
  return t;
}

// An optional tensor argument: true when `h` is None (*out stays empty) or
// fits; false otherwise.
bool fits_or_none(const Fast &f, py::handle h, at::ScalarType dt,
                  std::initializer_list<int64_t> sizes,
                  c10::optional<at::Tensor> *out) {
  if (h.is_none()) return true;
  *out = fits(f, h, dt, sizes);
  return out->has_value();
}

// `h` is a Python int (not a bool) equal to v.
bool is_int(py::handle h, int64_t v) {
  if (!PyLong_CheckExact(h.ptr())) return false;
  int overflow = 0;
  return PyLong_AsLongLongAndOverflow(h.ptr(), &overflow) == v && !overflow;
}

// topk_idx's entries are experts or -1 (host memory only: the CUDA
// kernels skip entries outside 0..experts-1, as Python's path lets them).
bool topk_in_range(const at::Tensor &idx, int64_t experts) {
  if (!idx.device().is_cpu()) return true;
  const int64_t *p = idx.data_ptr<int64_t>();
  for (int64_t i = 0, n = idx.numel(); i < n; i++)
    if (p[i] < -1 || p[i] >= experts) return false;
  return true;
}

// A low_latency_dispatch, checked: None, or (rc, recv_x, scales or None,
// src_info, layout_range, count) as dispatch returns.
py::object fast_dispatch(const Fast &f, py::handle xh, py::handle idxh,
                         py::handle tokens, py::handle experts, int64_t flags,
                         py::handle statsh, py::handle acth,
                         int64_t timeout_us) {
  const bool fp8 = flags & MEP_EP_FP8, round = flags & MEP_EP_ROUND_SCALE;
  if ((flags & MEP_EP_UE8M0) && (!round || f.hidden % 512)) return py::none();
  if (round && !fp8) return py::none();
  if (!is_int(tokens, f.tokens) || !is_int(experts, f.experts))
    return py::none();
  auto x = fits(f, xh, at::kBFloat16, {-1, f.hidden});
  if (!x || x->size(0) > f.tokens) return py::none();
  auto idx = fits(f, idxh, at::kLong, {x->size(0), -1});
  if (!idx || idx->size(1) < 1 || idx->size(1) > MEP_EP_MAX_TOPK ||
      !topk_in_range(*idx, f.experts))
    return py::none();
  c10::optional<at::Tensor> stats, act;
  if (!fits_or_none(f, statsh, at::kInt, {f.local}, &stats) ||
      !fits_or_none(f, acth, at::kInt, {f.ranks}, &act))
    return py::none();
  return dispatch(f.buf, *x, *idx, f.local, f.ranks, f.tokens, flags, act,
                  timeout_us, stats);
}

// A low_latency_combine, checked: None, or (rc, out).
py::object fast_combine(const Fast &f, py::handle xh, py::handle idxh,
                        py::handle wh, py::handle handle, bool zero_copy,
                        py::handle outh, py::handle acth, int64_t flags,
                        int64_t timeout_us) {
  if (!PyTuple_Check(handle.ptr()) || PyTuple_GET_SIZE(handle.ptr()) != 5)
    return py::none();
  py::tuple hd = py::reinterpret_borrow<py::tuple>(handle);
  if (!is_int(hd[2], f.tokens) || !is_int(hd[3], f.hidden) ||
      !is_int(hd[4], f.experts))
    return py::none();
  const int64_t S = f.ranks * f.tokens;
  auto src_info = fits(f, hd[0], at::kInt, {f.local, S});
  auto layout_range = fits(f, hd[1], at::kLong, {f.local, f.ranks});
  auto x = fits(f, xh, at::kBFloat16, {f.local, S, f.hidden}, !zero_copy);
  auto idx = fits(f, idxh, at::kLong, {-1, -1});
  if (!src_info || !layout_range || !x || !idx || idx->size(0) > f.tokens ||
      idx->size(1) < 1 || idx->size(1) > MEP_EP_MAX_TOPK)
    return py::none();
  const int64_t n = idx->size(0);
  auto w = fits(f, wh, at::kFloat, {n, idx->size(1)});
  c10::optional<at::Tensor> out, act;
  if (!w || !fits_or_none(f, outh, at::kBFloat16, {n, f.hidden}, &out) ||
      !fits_or_none(f, acth, at::kInt, {f.ranks}, &act))
    return py::none();
  const uintptr_t xp = zero_copy ? f.combine_buffer
                                 : reinterpret_cast<uintptr_t>(x->data_ptr());
  if (zero_copy) flags |= MEP_EP_ZERO_COPY;
  if (!out) out = at::empty({n, f.hidden}, idx->options().dtype(at::kBFloat16));
  int rc = combine_into(f.buf, xp, *idx, *w, *src_info, *layout_range, *out,
                        flags, act, timeout_us);
  return py::make_tuple(rc, *out);
}

}  // namespace

PYBIND11_MODULE(_ops, m) {
  m.doc() = "mep.ep's per-call path in C++ (mep.ep checks the arguments)";
  m.def("dispatch", &dispatch, py::arg("buf"), py::arg("x"), py::arg("topk_idx"),
        py::arg("local"), py::arg("ranks"), py::arg("tokens"), py::arg("flags"),
        py::arg("active"), py::arg("timeout_us"), py::arg("stats"));
  m.def("dispatch_phase", &dispatch_phase);
  m.def("combine_into", &combine_into);
  m.def("combine", &combine);
  py::class_<Fast>(m, "Fast", "a buffer's checked per-call path (None: "
                               "let Python's path check and raise)")
      .def(py::init([](uintptr_t buf, int64_t local, int64_t ranks,
                       int64_t tokens, int64_t hidden, int64_t experts,
                       at::Device device, uintptr_t combine_buffer) {
        return Fast{buf, local, ranks, tokens, hidden, experts, device,
                    combine_buffer};
      }))
      .def("dispatch", &fast_dispatch)
      .def("combine", &fast_combine);
}
