#include "stream.h"

#include <pybind11/stl.h>

#include "errors.h"

namespace py = pybind11;

namespace strata::python {

PyStream::~PyStream() {
  rt_->forget_external_stream(handle_);
  py::gil_scoped_release unlocked;  // a host stream drains its queue
  stream_.reset();
}

std::shared_ptr<PyStream> create_stream(const std::shared_ptr<PyRuntime>& rt) {
  absl::StatusOr<std::unique_ptr<Stream>> stream;
  absl::StatusOr<uintptr_t> handle;
  {
    py::gil_scoped_release unlocked;
    stream = rt->device().create_stream();
    if (stream.ok()) handle = rt->device().native_handle(**stream);
  }
  std::unique_ptr<Stream> s = check(std::move(stream));
  return std::make_shared<PyStream>(rt, std::move(s), check(std::move(handle)));
}

StreamChoice parse_stream(PyRuntime& rt, const py::handle& stream, const char* what) {
  if (stream.is_none()) return {};
  if (py::isinstance<PyStream>(stream)) {
    const auto& s = stream.cast<const PyStream&>();
    if (&s.runtime() != &rt) {
      raise(absl::StatusCode::kInvalidArgument,
            std::string(what) + ": the stream belongs to another strata.Runtime");
    }
    return {StreamChoice::kHandle, s.handle()};
  }
  py::object value = py::reinterpret_borrow<py::object>(stream);
  bool from_framework = false;
  if (!py::isinstance<py::int_>(value) && py::hasattr(value, "cuda_stream")) {
    value = value.attr("cuda_stream");  // torch.cuda.Stream, cupy streams
    from_framework = true;
  }
  if (!py::isinstance<py::int_>(value)) {
    raise(absl::StatusCode::kInvalidArgument,
          std::string(what) +
              ": stream must be None, an int (DLPack), a strata.Stream or a "
              "torch.cuda.Stream, not " +
              py::str(py::type::handle_of(stream).attr("__name__")).cast<std::string>());
  }
  const auto number = value.cast<long long>();
  if (number == -1) return {StreamChoice::kNoSync, 0};
  if (number < -1) {
    raise(absl::StatusCode::kInvalidArgument,
          std::string(what) + ": stream=" + std::to_string(number) +
              " is not a stream: use None, -1 (no synchronization) or a stream handle");
  }
  if (rt.cuda()) {
    if (number == 0) {
      if (from_framework) return {StreamChoice::kHandle, 1};  // torch's default is legacy
      raise(absl::StatusCode::kInvalidArgument,
            std::string(what) +
                ": stream=0 is ambiguous (DLPack): pass 1 for CUDA's legacy default stream or 2 "
                "for the per-thread default stream");
    }
    return {StreamChoice::kHandle, static_cast<uintptr_t>(number)};
  }
  if (number <= 2) return {};  // the host backend's default stream is the host
  return {StreamChoice::kHandle, static_cast<uintptr_t>(number)};
}

void bind_stream(py::module_& m) {
  py::class_<PyStream, std::shared_ptr<PyStream>>(m, "Stream", R"doc(
A device stream made by Runtime.create_stream(): work on it runs in issue order. Pass it (or its
handle) as the `stream` of Acquisition.__dlpack__ and Acquisition.release. On CUDA it is a
cudaStream_t (handle); on the host backend a worker thread, named only by its handle.)doc")
      .def_property_readonly("handle", &PyStream::handle,
                             "The native handle: the cudaStream_t as an int, or the host "
                             "stream's id (DLPack's `stream` value).")
      .def("__int__", &PyStream::handle)
      .def_property_readonly("runtime", &PyStream::runtime_ptr)
      .def(
          "synchronize",
          [](PyStream& s) {
            unlocked_check([&] { return s.runtime().device().synchronize(s.stream()); });
          },
          "Blocks until the work issued on this stream is done.")
      .def("__repr__",
           [](PyStream& s) { return "strata.Stream(handle=" + std::to_string(s.handle()) + ")"; });
}

}  // namespace strata::python
