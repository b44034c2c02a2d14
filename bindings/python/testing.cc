#include "testing.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "errors.h"
#include "runtime.h"
#include "strata/device/host_device.h"
#include "strata/testing/device_buffers_only.h"
#include "stream.h"

namespace py = pybind11;

namespace strata::python {
namespace {

// A StreamGate and the runtime whose device it holds.
struct PyGate {
  std::shared_ptr<PyRuntime> rt;  // outlives gate
  std::unique_ptr<StreamGate> gate;
};

std::shared_ptr<PyGate> hold(const std::shared_ptr<PyRuntime>& rt,
                             const std::vector<std::shared_ptr<PyStream>>& exempt) {
  std::vector<Stream*> streams;
  for (const auto& s : exempt) {
    if (&s->runtime() != rt.get()) {
      raise(absl::StatusCode::kInvalidArgument,
            "hold: an exempt stream belongs to another Runtime");
    }
    streams.push_back(&s->stream());
  }
  return std::make_shared<PyGate>(PyGate{rt, check(hold_device(rt->device(), streams))});
}

std::shared_ptr<PyGate> hold_one(const std::shared_ptr<PyStream>& stream) {
  return std::make_shared<PyGate>(PyGate{
      stream->runtime_ptr(), check(hold_stream(stream->runtime().device(), stream->stream()))});
}

CopyKind parse_kind(const std::string& text) {
  if (text == "h2d") return CopyKind::kHostToDevice;
  if (text == "d2h") return CopyKind::kDeviceToHost;
  if (text == "d2d") return CopyKind::kDeviceToDevice;
  raise(absl::StatusCode::kInvalidArgument,
        "'" + text + "' is not a copy kind: use h2d, d2h or d2d");
}

}  // namespace

void bind_testing(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "testing", "Test hooks of the host backend (stream gates, raw copies); not a user API.");
  py::class_<PyGate, std::shared_ptr<PyGate>>(m, "Gate", R"doc(
Holds device work issued while it is closed until open() (or the end of a `with` block).)doc")
      .def("open", [](PyGate& g) { g.gate->open(); })
      .def_property_readonly("is_open", [](PyGate& g) { return g.gate->is_open(); })
      .def_property_readonly(
          "held", [](PyGate& g) { return g.gate->held(); }, "Work waiting at the gate now.")
      .def(
          "wait_until_held",
          [](PyGate& g, uint64_t count) {
            py::gil_scoped_release unlocked;
            g.gate->wait_until_held(count);
          },
          py::arg("count") = 1, "Blocks until `count` pieces of work wait at the gate.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyGate& g, const py::object&, const py::object&, const py::object&) {
        g.gate->open();
        return false;
      });
  m.def("hold", &hold, py::arg("runtime"),
        py::arg("exempt") = std::vector<std::shared_ptr<PyStream>>{},
        "Holds work issued on every stream of the runtime's (host) device, the store's own "
        "included, except the `exempt` strata.Streams.");
  m.def("hold_stream", &hold_one, py::arg("stream"), "Holds work issued on one strata.Stream.");
  m.def(
      "device_buffers_only",
      [](PyCommunicator& c) {
        if (c.rt == nullptr) {
          raise(absl::StatusCode::kInvalidArgument,
                "device_buffers_only: the communicator has no Runtime whose device memory it "
                "could take: create it with Communicator.from_environment(runtime)");
        }
        c.comm = testing::device_buffers_only(std::move(c.comm), c.rt->device());
      },
      py::arg("communicator"),
      "Makes `communicator` take its runtime's device memory only, as NCCL does: every host "
      "buffer is refused (strata/testing/device_buffers_only.h). Call it on every rank.");
  m.def(
      "copy_async",
      [](PyStream& stream, uintptr_t dst, uintptr_t src, uint64_t nbytes, const std::string& kind) {
        const CopyKind k = parse_kind(kind);
        unlocked_check([&] {
          return stream.runtime().device().copy_async(reinterpret_cast<void*>(dst),
                                                      reinterpret_cast<const void*>(src), nbytes, k,
                                                      stream.stream());
        });
      },
      py::arg("stream"), py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("kind"),
      "Enqueues a copy of raw addresses on `stream` (kind: h2d, d2h, d2d): a consumer's work.");
}

}  // namespace strata::python
