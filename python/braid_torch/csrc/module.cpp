// The Python module braid_torch._C: builds the backend for braid_torch's creator.
#include <optional>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include "backend.hpp"

namespace {

c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                         std::chrono::milliseconds timeout, std::vector<int> host_of,
                                         std::optional<c10::intrusive_ptr<c10d::Backend>> cross,
                                         std::optional<c10::intrusive_ptr<c10d::Backend>> world) {
  py::gil_scoped_release nogil; // joining waits for the other ranks
  return c10::make_intrusive<braid_torch::backend>(store, rank, size, timeout, std::move(host_of), cross.value_or(nullptr),
                                                   world.value_or(nullptr));
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "braid as a torch.distributed backend (C++ part)";
  m.def("create_backend", &create, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("host_of"),
        py::arg("cross") = std::nullopt, py::arg("world") = std::nullopt);
  m.attr("has_cuda") = braid_torch::backend::cuda_built();
}
