#include "tensor.h"

#include <pybind11/stl.h>

#include "acquisition.h"
#include "errors.h"

namespace py = pybind11;

namespace strata::python {

void PyTensor::check_alive() const {
  if (engine_view) {
    raise(absl::StatusCode::kFailedPrecondition,
          "'" + name +
              "' is a ZeroEngine parameter (a view into the engine's flat tensor): use the "
              "engine's acquire_param() and read_param()");
  }
  if (destroyed) {
    raise(absl::StatusCode::kFailedPrecondition, "tensor '" + name + "' was destroyed");
  }
}

std::shared_ptr<PyTensor> create_tensor(const std::shared_ptr<PyRuntime>& rt,
                                        const std::string& name, const py::object& shape_object,
                                        const py::object& dtype_object,
                                        const std::string& home_text) {
  std::vector<int64_t> shape;
  if (py::isinstance<py::int_>(shape_object)) {
    shape.push_back(shape_object.cast<int64_t>());
  } else {
    for (const py::handle d : shape_object) shape.push_back(d.cast<int64_t>());
  }
  const DType dtype = parse_dtype(dtype_object);
  const TierKind home = parse_tier(home_text, /*allow_nvme=*/true);
  uint64_t bytes = dtype.itemsize;
  for (int64_t d : shape) {
    if (d < 0) {
      raise(absl::StatusCode::kInvalidArgument,
            "tensor '" + name + "': shape has a negative dimension (" + std::to_string(d) + ")");
    }
    bytes *= static_cast<uint64_t>(d);
  }
  absl::StatusOr<TensorHandle> handle;
  {
    py::gil_scoped_release unlocked;
    handle = rt->store().create(name, bytes, home);
  }
  TensorHandle h = check(std::move(handle));
  rt->records[name] = PyRuntime::Record{shape, dtype};
  return std::make_shared<PyTensor>(rt, h, name, std::move(shape), dtype, bytes, home);
}

std::shared_ptr<PyTensor> find_tensor(const std::shared_ptr<PyRuntime>& rt,
                                      const std::string& name) {
  TensorHandle h = check(rt->store().find(name));
  TensorStore::Info info = check(rt->store().info(h));
  PyRuntime::Record record{{static_cast<int64_t>(info.bytes)}, uint8_dtype()};  // bytes
  if (auto it = rt->records.find(name); it != rt->records.end()) record = it->second;
  return std::make_shared<PyTensor>(rt, h, info.name, record.shape, record.dtype, info.bytes,
                                    info.home);
}

void bind_tensor(py::module_& m) {
  py::class_<PyTensor, std::shared_ptr<PyTensor>>(m, "Tensor",
                                                  "A tensor registered with a Runtime's store.")
      .def_property_readonly("name", [](PyTensor& t) { return t.name; })
      .def_property_readonly("shape", [](PyTensor& t) { return py::tuple(py::cast(t.shape)); })
      .def_property_readonly("dtype", [](PyTensor& t) { return t.dtype.name; })
      .def_property_readonly("itemsize", [](PyTensor& t) { return t.dtype.itemsize; })
      .def_property_readonly("nbytes", [](PyTensor& t) { return t.bytes; })
      .def_property_readonly("numel", &PyTensor::numel)
      .def_property_readonly("home", [](PyTensor& t) { return tier_name(t.home); })
      .def_property_readonly("destroyed", [](PyTensor& t) { return t.destroyed; })
      .def_property_readonly("acquired", [](PyTensor& t) { return t.acquired; })
      .def_property_readonly("runtime", [](PyTensor& t) { return t.rt; })
      .def("acquire", &acquire, py::arg("tier") = "cpu", py::arg("mode") = "r",
           "The tensor's memory in `tier` (cpu or gpu) for reading ('r'), writing ('w') or "
           "overwriting ('o': every byte written before any is read, nothing fetched first). "
           "Returns an Acquisition: a context manager whose value exposes __dlpack__ and "
           "__dlpack_device__. Views made from it must not outlive the `with` block. Returns "
           "without waiting for a device copy: the memory is ready for consumers that name "
           "their stream to __dlpack__ (docs/python.md).")
      .def(
          "prefetch",
          [](PyTensor& t, const std::string& tier) {
            t.check_alive();
            const TierKind k = parse_tier(tier, false);
            unlocked_check([&] { return t.rt->store().prefetch(t.handle, k); });
          },
          py::arg("tier") = "gpu")
      .def(
          "evict",
          [](PyTensor& t, const std::string& tier) {
            t.check_alive();
            const TierKind k = parse_tier(tier, true);
            unlocked_check([&] { return t.rt->store().evict(t.handle, k); });
          },
          py::arg("tier"),
          "Drops the copy in `tier`, writing it back home first when it holds the only newest "
          "bytes.")
      .def(
          "discard",
          [](PyTensor& t) {
            t.check_alive();
            unlocked_check([&] { return t.rt->store().discard(t.handle); });
          },
          "Its bytes are no longer needed (an activation after backward, a gradient after the "
          "step): its copies go without a write-back; its contents are undefined until next "
          "written.")
      .def("destroy",
           [](PyTensor& t) {
             t.check_alive();
             unlocked_check([&] { return t.rt->store().destroy(t.handle); });
             t.destroyed = true;
             t.rt->records.erase(t.name);
           })
      .def("__repr__", [](PyTensor& t) {
        std::string shape;
        for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        if (t.shape.size() == 1) shape += ",";
        return "strata.Tensor('" + t.name + "', shape=(" + shape + "), dtype=" + t.dtype.name +
               ", home=" + tier_name(t.home) + (t.destroyed ? ", destroyed" : "") + ")";
      });
}

}  // namespace strata::python
