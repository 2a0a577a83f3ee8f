// module.cpp - the Python extension mep._C: the backend class the package
// registers with torch.distributed, and the fault-tolerance calls.
#include <torch/csrc/utils/pybind.h>

#include <climits>

#include "backend.hpp"

namespace py = pybind11;
using mep_c10d::CommConfig;
using mep_c10d::MepBackend;

namespace {

int clamp_ms(double seconds) {
  double ms = seconds * 1000.0;
  if (ms >= static_cast<double>(INT_MAX)) return INT_MAX;
  return ms < 1.0 ? 1 : static_cast<int>(ms);
}

c10::intrusive_ptr<MepBackend> make_backend(
    const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
    double timeout_s, std::optional<at::Tensor> active_ranks,
    bool is_extension, int max_size) {
  CommConfig cfg;
  cfg.rank = rank;
  cfg.size = size;
  cfg.max_size = max_size;
  cfg.timeout_ms = clamp_ms(timeout_s);
  cfg.join = is_extension;
  if (active_ranks) cfg.active_ranks = *active_ranks;
  return c10::make_intrusive<MepBackend>(
      store, cfg, std::chrono::milliseconds(cfg.timeout_ms));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "mep's c10d backend (the compiled part of the mep package)";
  // The base class must be registered before a subclass is bound.
  py::module_::import("torch.distributed");
  m.attr("mep_version") = mep_version();

  py::class_<MepBackend, c10d::Backend, c10::intrusive_ptr<MepBackend>>(
      m, "MepBackend")
      .def(py::init(&make_backend), py::arg("store"), py::arg("rank"),
           py::arg("size"), py::arg("timeout_s"),
           py::arg("active_ranks") = py::none(),
           py::arg("is_extension") = false, py::arg("max_size") = 0,
           py::call_guard<py::gil_scoped_release>(),
           "Creates the communicator over the store (collective; blocks "
           "until every rank of the group, or for an extension the "
           "survivors' recover_ranks, is there).")
      .def("active_ranks", &MepBackend::active_ranks,
           py::call_guard<py::gil_scoped_release>())
      .def("peer_state", &MepBackend::peer_state, py::arg("ranks"),
           py::call_guard<py::gil_scoped_release>())
      .def("recover_ranks", &MepBackend::recover_ranks, py::arg("ranks"),
           py::call_guard<py::gil_scoped_release>())
      .def("extend_group_size_to", &MepBackend::extend_group_size_to,
           py::arg("size"), py::call_guard<py::gil_scoped_release>())
      .def("dropped_ranks", &MepBackend::dropped_ranks)
      .def("slots", &MepBackend::slots)
      .def("max_size", &MepBackend::max_size)
      .def("epoch", &MepBackend::epoch)
      .def("cuda_path", &MepBackend::cuda_path,
           py::call_guard<py::gil_scoped_release>(),
           "mep_cuda_path of the communicator: 'kernel', 'staged', or '' "
           "without CUDA. Collective (the first call sets the kernel path "
           "up).");
#if MEP_C10D_CUDA
  m.attr("cuda_build") = true;
#else
  m.attr("cuda_build") = false;
#endif
}
