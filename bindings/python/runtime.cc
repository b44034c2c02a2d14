#include "runtime.h"

#include <pybind11/stl.h>

#include "environment.h"
#include "errors.h"
#include "stats.h"
#include "stream.h"
#include "tensor.h"

namespace py = pybind11;

namespace strata::python {

PyRuntime::~PyRuntime() {
  py::gil_scoped_release release;
  external_.clear();
  stream_.reset();
  runtime_.reset();
}

absl::StatusOr<Stream*> PyRuntime::external_stream(uintptr_t native) {
  if (auto it = external_.find(native); it != external_.end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<Stream>> wrapped = device().wrap_external_stream(native);
  if (!wrapped.ok()) return wrapped.status();
  Stream* stream = wrapped->get();
  external_.emplace(native, *std::move(wrapped));
  return stream;
}

void PyRuntime::forget_external_stream(uintptr_t native) {
  auto it = external_.find(native);
  if (it == external_.end()) return;
  std::unique_ptr<Stream> wrapper = std::move(it->second);
  external_.erase(it);
  py::gil_scoped_release unlocked;  // a host stream's last handle drains its queue
  wrapper.reset();
}

namespace {

std::shared_ptr<PyRuntime> make_runtime(const py::kwargs& overrides) {
  std::map<std::string, std::string> vars = runtime_variables(overrides);
  absl::StatusOr<std::unique_ptr<Runtime>> runtime;
  std::unique_ptr<Stream> stream;
  {
    py::gil_scoped_release unlocked;
    absl::StatusOr<Config> config = Config::from_variables(vars);
    if (!config.ok()) {
      runtime = config.status();
    } else {
      runtime = Runtime::create(*config);
    }
    if (runtime.ok()) {
      absl::StatusOr<std::unique_ptr<Stream>> s = (*runtime)->device().create_stream();
      if (s.ok()) {
        stream = *std::move(s);
      } else {
        runtime = s.status();
      }
    }
  }
  return std::make_shared<PyRuntime>(check(std::move(runtime)), std::move(stream));
}

void set_access_order(PyRuntime& r, const py::iterable& order) {
  std::vector<std::pair<TensorHandle, TierKind>> accesses;
  for (const py::handle item : order) {
    if (py::isinstance<PyTensor>(item)) {
      accesses.emplace_back(item.cast<PyTensor&>().handle, TierKind::kGpu);
    } else {
      auto pair = item.cast<py::tuple>();
      if (pair.size() != 2) {
        raise(absl::StatusCode::kInvalidArgument,
              "set_access_order takes tensors or (tensor, tier) pairs");
      }
      accesses.emplace_back(pair[0].cast<PyTensor&>().handle,
                            parse_tier(pair[1].cast<std::string>(), false));
    }
  }
  unlocked_check([&] { return r.store().set_access_order(accesses); });
}

}  // namespace

void bind_runtime(py::module_& m) {
  py::class_<PyRuntime, std::shared_ptr<PyRuntime>>(m, "Runtime", R"doc(
The strata runtime: device, GPU arena, pinned CPU tier, NVMe swap space and the tensor store.

Built from the STRATA_* environment variables; keyword arguments override them, e.g.
Runtime(backend="host", gpu_bytes="64MiB", nvme_paths=["/mnt/nvme0"]) sets STRATA_BACKEND,
STRATA_GPU_BYTES and STRATA_NVME_PATHS. None unsets a variable (its default applies).)doc")
      .def(py::init(&make_runtime))
      .def_property_readonly(
          "backend",
          [](PyRuntime& r) { return std::string(to_string(r.runtime().config().backend)); })
      .def_property_readonly("config",
                             [](PyRuntime& r) { return config_dict(r.runtime().config()); })
      .def_property_readonly("warnings", [](PyRuntime& r) { return r.runtime().warnings(); })
      .def_property_readonly("has_nvme", [](PyRuntime& r) { return r.runtime().nvme() != nullptr; })
      .def("create", &create_tensor, py::arg("name"), py::arg("shape"),
           py::arg("dtype") = "float32", py::arg("home") = "cpu",
           "Registers a tensor of `shape` and `dtype` whose home copy lives in `home` "
           "(cpu, nvme or gpu). Contents are undefined until first written.")
      .def("find", &find_tensor, py::arg("name"))
      .def("create_stream", &create_stream,
           "A new device stream (strata.Stream): a queue of device work that can consume "
           "acquisitions (__dlpack__(stream=s)) and release them (release(stream=s)).")
      .def("flush", [](PyRuntime& r) { unlocked_check([&] { return r.store().flush(); }); })
      .def("step_begin",
           [](PyRuntime& r) {
             py::gil_scoped_release unlocked;
             r.store().step_begin();
           })
      .def("step_end",
           [](PyRuntime& r) {
             py::gil_scoped_release unlocked;
             r.store().step_end();
           })
      .def("set_access_order", &set_access_order, py::arg("order"),
           "The order in which a training step acquires tensors: tensors (acquired in the gpu "
           "tier) or (tensor, tier) pairs. Replaces the recorded trace.")
      .def("stats", [](PyRuntime& r) { return store_stats(r.store().stats()); })
      .def(
          "startup", [](PyRuntime& r) { return startup_dict(r.runtime().startup()); },
          "What starting cost and what pinning the CPU tier has cost since (it is pinned piece "
          "by piece as it fills): create_seconds; piece_bytes, pieces, pinned_pieces, "
          "pinned_bytes (the bytes pinned with the device so far: on the cuda backend page-locked "
          "memory), unpinned_pieces, pin_seconds; io_uring's registered_bytes, registrations, "
          "registration_seconds, registration_failures, rings.")
      .def(
          "reset_peak_usage", [](PyRuntime& r) { r.store().reset_peak_usage(); },
          "Starts new high-water marks: each tier's peak_used in stats() becomes its use now.")
      .def(
          "synchronize",
          [](PyRuntime& r) { unlocked_check([&] { return r.device().synchronize(r.stream()); }); },
          "Blocks until the work issued on strata's stream by Python calls is done.");
}

}  // namespace strata::python
