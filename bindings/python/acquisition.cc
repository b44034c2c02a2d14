#include "acquisition.h"

#include <pybind11/stl.h>

#include <algorithm>

#include "dlpack_export.h"
#include "errors.h"
#include "stream.h"

namespace py = pybind11;

namespace strata::python {
namespace {

constexpr uintptr_t kCudaLegacyStream = 1;  // cudaStreamLegacy: DLPack's stream=None on CUDA

}  // namespace

Acquisition::~Acquisition() {
  // Dropped without release (no `with`, no release()): give the tensor back anyway.
  if (!released) {
    try {
      release(py::none());
    } catch (...) {  // NOLINT(bugprone-empty-catch): nothing to report to in a destructor
    }
  }
}

void Acquisition::check_live() const {
  if (released) {
    raise(absl::StatusCode::kFailedPrecondition,
          "tensor '" + tensor->name + "' was released: views must not outlive the acquisition");
  }
}

DLDevice Acquisition::dl_device() const {
  if (tier == TierKind::kGpu && tensor->rt->cuda()) {
    return {kDLCUDA, tensor->rt->runtime().config().device};
  }
  return {kDLCPU, 0};  // the CPU tier, and the "GPU" tier of the host backend
}

void Acquisition::order_consumer(const py::handle& stream) {
  check_live();
  PyRuntime& rt = *tensor->rt;
  StreamChoice choice = parse_stream(rt, stream, "__dlpack__");
  if (ready == nullptr || choice.kind == StreamChoice::kNoSync) return;
  if (choice.kind == StreamChoice::kDefault) {
    if (!rt.cuda()) {  // a host consumer: it reads as soon as it has the capsule
      unlocked_check([&] { return rt.device().synchronize(*ready); });
      return;
    }
    choice = {StreamChoice::kHandle, kCudaLegacyStream};
  }
  Stream* consumer = check(rt.external_stream(choice.handle));
  unlocked_check([&] { return rt.device().wait(*consumer, *ready); });
  if (std::find(consumers.begin(), consumers.end(), choice.handle) == consumers.end()) {
    consumers.push_back(choice.handle);
  }
}

void Acquisition::release(const py::handle& stream) {
  if (released) {
    raise(absl::StatusCode::kFailedPrecondition,
          "tensor '" + tensor->name + "': this acquisition was already released");
  }
  PyRuntime& rt = *tensor->rt;
  const StreamChoice choice = parse_stream(rt, stream, "release");
  // The streams whose work used the memory: the one named, else those seen at __dlpack__, else
  // (CUDA's GPU tier) the legacy default stream, DLPack's default.
  std::vector<Stream*> streams;
  if (choice.kind == StreamChoice::kHandle) {
    streams.push_back(check(rt.external_stream(choice.handle)));
  } else if (choice.kind == StreamChoice::kDefault) {
    std::vector<uintptr_t> handles = consumers;
    if (handles.empty() && rt.cuda() && tier == TierKind::kGpu) {
      handles.push_back(kCudaLegacyStream);
    }
    for (uintptr_t handle : handles) {
      absl::StatusOr<Stream*> s = rt.external_stream(handle);
      // A host stream that is gone has drained its work; a CUDA handle is taken as given.
      if (s.ok()) streams.push_back(*s);
    }
  }
  released = true;
  tensor->acquired--;
  absl::Status status;
  {
    py::gil_scoped_release unlocked;
    Device& device = rt.device();
    const auto give_back = [&](Stream& s) {
      return release_with ? release_with(s) : rt.store().release(tensor->handle, s);
    };
    if (streams.size() == 1) {
      status = give_back(*streams.front());
    } else {
      // Several consumers (or none): strata's stream joins them, and the store records there.
      for (Stream* s : streams) {
        absl::StatusOr<std::unique_ptr<Event>> done = device.create_event();
        if (!done.ok()) {
          status = done.status();
          break;
        }
        status = device.record(**done, *s);
        if (status.ok()) status = device.wait(rt.stream(), **done);
        if (!status.ok()) break;
      }
      absl::Status released_status = give_back(rt.stream());
      if (status.ok()) status = released_status;
    }
  }
  check(status);
}

std::shared_ptr<Acquisition> acquire(const std::shared_ptr<PyTensor>& tensor,
                                     const std::string& tier_text, const std::string& mode_text) {
  tensor->check_alive();
  const TierKind tier = parse_tier(tier_text, /*allow_nvme=*/false);
  const AccessMode mode = parse_mode(mode_text);
  PyRuntime& rt = *tensor->rt;
  absl::StatusOr<void*> data;
  std::unique_ptr<Event> ready;
  {
    py::gil_scoped_release unlocked;
    data = rt.store().acquire(tensor->handle, tier, rt.stream(), mode);
    if (data.ok() && tier == TierKind::kGpu) {
      // Marks where the memory is ready; consumers wait on it at __dlpack__, not the host here.
      absl::StatusOr<std::unique_ptr<Event>> event = rt.device().create_event();
      absl::Status recorded = event.status();
      if (recorded.ok()) recorded = rt.device().record(**event, rt.stream());
      if (recorded.ok()) {
        ready = *std::move(event);
      } else {
        (void)rt.store().release(tensor->handle, rt.stream());
        data = recorded;
      }
    }
  }
  void* address = check(std::move(data));
  tensor->acquired++;
  return std::make_shared<Acquisition>(tensor, address, tier, mode, std::move(ready));
}

void bind_acquisition(py::module_& m) {
  py::class_<Acquisition, std::shared_ptr<Acquisition>>(
      m, "Acquisition",
      "A tensor's memory in one tier, acquired until release() or the end of the `with` block.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](Acquisition& a, const py::object&, const py::object&, const py::object&) {
             if (!a.released) a.release(py::none());
             return false;
           })
      .def(
          "release", [](Acquisition& a, const py::object& stream) { a.release(stream); },
          py::arg("stream") = py::none(),
          "Gives the memory back without waiting. `stream`: where the work that used it was "
          "issued (strata's next use of the memory waits for it there); None: the streams given "
          "to __dlpack__, else CUDA's legacy default stream (host backend: the host).")
      .def(
          "__dlpack__",
          [](py::object self, const py::object& stream, const py::object& /*max_version*/) {
            self.cast<Acquisition&>().order_consumer(stream);
            return to_dlpack(self);
          },
          py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          "A 'dltensor' capsule viewing the memory (zero copy). `stream` is the consumer's "
          "(DLPack): it is made to wait until the memory is ready; the host does not wait, "
          "except for stream=None on the host backend (a host consumer). -1: no ordering.")
      .def("__dlpack_device__",
           [](Acquisition& a) {
             const DLDevice d = a.dl_device();
             return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
           })
      .def(
          "synchronize",
          [](Acquisition& a) {
            a.check_live();
            if (a.ready == nullptr) return;
            unlocked_check([&] { return a.tensor->rt->device().synchronize(*a.ready); });
          },
          "Blocks until the memory is ready for the host (what `address` users need).")
      .def_property_readonly("address",
                             [](Acquisition& a) {
                               a.check_live();
                               return reinterpret_cast<uintptr_t>(a.data);
                             })
      .def_property_readonly("tier", [](Acquisition& a) { return tier_name(a.tier); })
      .def_property_readonly("mode",
                             [](Acquisition& a) {
                               return std::string(a.mode == AccessMode::kRead    ? "r"
                                                  : a.mode == AccessMode::kWrite ? "w"
                                                                                 : "o");
                             })
      .def_property_readonly("released", [](Acquisition& a) { return a.released; })
      .def_property_readonly("tensor", [](Acquisition& a) { return a.tensor; })
      .def_property_readonly("shape",
                             [](Acquisition& a) { return py::tuple(py::cast(a.tensor->shape)); })
      .def_property_readonly("dtype", [](Acquisition& a) { return a.tensor->dtype.name; });
}

// Records an event on strata's stream where `tier`'s memory is ready: consumers wait on it at
// __dlpack__ (as Tensor.acquire()), the host for stream=None on the host backend.
absl::StatusOr<std::unique_ptr<Event>> ready_event(PyRuntime& rt) {
  absl::StatusOr<std::unique_ptr<Event>> event = rt.device().create_event();
  if (!event.ok()) return event.status();
  if (absl::Status s = rt.device().record(**event, rt.stream()); !s.ok()) return s;
  return event;
}

}  // namespace strata::python
