// strata.ActivationStash: the C++ ActivationStash (include/strata/activations/activation_stash.h)
// for Python. allocate() and load() hand out strata.Acquisitions (DLPack views with the
// activation's shape and dtype); releasing the one from allocate() offloads the activation,
// releasing the one from load() gives the load back, each ordered after the work on the
// releasing stream. strata.torch's saved-tensor hooks are built on it (activations_torch.py).
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "acquisition.h"
#include "errors.h"
#include "names.h"
#include "runtime.h"
#include "strata/activations/activation_stash.h"
#include "stream.h"
#include "tensor.h"

namespace py = pybind11;

namespace strata::python {
namespace {

class PyActivationStash {
 public:
  PyActivationStash(std::shared_ptr<PyRuntime> rt_, std::unique_ptr<ActivationStash> stash_)
      : rt(std::move(rt_)), stash(std::move(stash_)) {}
  ~PyActivationStash() {
    py::gil_scoped_release unlocked;
    stash.reset();
  }
  std::shared_ptr<PyRuntime> rt;  // outlives stash
  std::unique_ptr<ActivationStash> stash;
};

std::shared_ptr<PyActivationStash> make_stash(const std::shared_ptr<PyRuntime>& rt,
                                              const std::string& home,
                                              const py::object& window_bytes,
                                              const py::object& prefetch_bytes, bool keep_tail,
                                              bool record_trace, const std::string& name) {
  ActivationStashOptions o;
  o.home = parse_tier(home, /*allow_nvme=*/true);
  o.window_bytes = size_arg(window_bytes, "window_bytes");
  o.prefetch_bytes = size_arg(prefetch_bytes, "prefetch_bytes", true);
  o.keep_tail = keep_tail;
  o.record_trace = record_trace;
  o.name = name;
  absl::StatusOr<std::unique_ptr<ActivationStash>> stash;
  {
    py::gil_scoped_release unlocked;
    stash = ActivationStash::create(rt->store(), rt->device(), o);
  }
  return std::make_shared<PyActivationStash>(rt, check(std::move(stash)));
}

std::vector<int64_t> shape_of(const py::handle& shape) {
  std::vector<int64_t> out;
  for (const py::handle& d : py::reinterpret_borrow<py::sequence>(shape)) {
    const auto n = d.cast<int64_t>();
    if (n < 0) raise(absl::StatusCode::kInvalidArgument, "a negative dimension in the shape");
    out.push_back(n);
  }
  return out;
}

// The PyTensor an Acquisition describes: the activation's shape and dtype over its store tensor.
std::shared_ptr<PyTensor> view_tensor(PyActivationStash& s, ActivationId id,
                                      std::vector<int64_t> shape, const DType& dtype,
                                      uint64_t bytes) {
  auto tensor = std::make_shared<PyTensor>(s.rt, TensorHandle{}, "activation." + std::to_string(id),
                                           std::move(shape), dtype, bytes, s.stash->options().home);
  tensor->engine_view = true;  // its bytes are the stash's: no acquire/evict/destroy of its own
  return tensor;
}

// allocate(shape, dtype, tier) -> (id, Acquisition): write the activation through the view, then
// release the acquisition (naming the stream that wrote it) to offload it.
py::tuple allocate(const std::shared_ptr<PyActivationStash>& stash, const py::object& shape_arg,
                   const py::object& dtype_arg, const std::string& tier_text) {
  PyActivationStash& s = *stash;
  const TierKind tier = parse_tier(tier_text, /*allow_nvme=*/false);
  std::vector<int64_t> shape = shape_of(shape_arg);
  const DType dtype = parse_dtype(dtype_arg);
  uint64_t bytes = dtype.itemsize;
  for (int64_t d : shape) bytes *= static_cast<uint64_t>(d);
  PyRuntime& rt = *s.rt;
  absl::StatusOr<ActivationStash::Buffer> buffer;
  std::unique_ptr<Event> ready;
  {
    py::gil_scoped_release unlocked;
    buffer = s.stash->allocate(bytes, tier, rt.stream());
    if (buffer.ok() && tier == TierKind::kGpu) {
      absl::StatusOr<std::unique_ptr<Event>> event = ready_event(rt);
      if (event.ok()) {
        ready = *std::move(event);
      } else {
        (void)s.stash->free(buffer->id, rt.stream());
        buffer = event.status();
      }
    }
  }
  const ActivationStash::Buffer b = check(std::move(buffer));
  auto tensor = view_tensor(s, b.id, std::move(shape), dtype, bytes);
  tensor->acquired++;
  auto acquisition =
      std::make_shared<Acquisition>(tensor, b.data, tier, AccessMode::kWrite, std::move(ready));
  const ActivationId id = b.id;
  acquisition->release_with = [stash, id](Stream& stream) {
    return stash->stash->offload(id, stream);
  };
  return py::make_tuple(id, acquisition);
}

// load(id, shape, dtype) -> Acquisition in the GPU tier; its release gives the load back.
std::shared_ptr<Acquisition> load(const std::shared_ptr<PyActivationStash>& stash, ActivationId id,
                                  const py::object& shape_arg, const py::object& dtype_arg,
                                  const py::object& owner) {
  PyActivationStash& s = *stash;
  std::vector<int64_t> shape = shape_of(shape_arg);
  const DType dtype = parse_dtype(dtype_arg);
  uint64_t bytes = dtype.itemsize;
  for (int64_t d : shape) bytes *= static_cast<uint64_t>(d);
  PyRuntime& rt = *s.rt;
  absl::StatusOr<const void*> data;
  std::unique_ptr<Event> ready;
  {
    py::gil_scoped_release unlocked;
    data = s.stash->load(id, rt.stream());
    if (data.ok()) {
      absl::StatusOr<std::unique_ptr<Event>> event = ready_event(rt);
      if (event.ok()) {
        ready = *std::move(event);
      } else {
        (void)s.stash->unload(id, rt.stream());
        data = event.status();
      }
    }
  }
  const void* address = check(std::move(data));
  auto tensor = view_tensor(s, id, std::move(shape), dtype, bytes);
  tensor->acquired++;
  auto acquisition = std::make_shared<Acquisition>(
      tensor, const_cast<void*>(address), TierKind::kGpu, AccessMode::kRead, std::move(ready));
  acquisition->release_with = [stash, id](Stream& stream) {
    return stash->stash->unload(id, stream);
  };
  acquisition->keep_alive = owner;
  return acquisition;
}

Stream& stream_or_default(PyRuntime& rt, const py::object& stream, const char* what) {
  const StreamChoice choice = parse_stream(rt, stream, what);
  if (choice.kind == StreamChoice::kHandle) return *check(rt.external_stream(choice.handle));
  return rt.stream();
}

py::dict stash_stats(const ActivationStashStats& s) {
  py::dict d;
  d["steps"] = s.steps;
  d["saved"] = s.saved;
  d["saved_bytes"] = s.saved_bytes;
  d["offloaded"] = s.offloaded;
  d["offloaded_bytes"] = s.offloaded_bytes;
  d["kept"] = s.kept;
  d["loads"] = s.loads;
  d["loads_prefetched"] = s.loads_prefetched;
  d["loads_on_demand"] = s.loads_on_demand;
  d["loads_kept"] = s.loads_kept;
  d["prefetches"] = s.prefetches;
  d["order_changes"] = s.order_changes;
  d["has_order"] = s.has_order;
  d["live"] = s.live;
  d["live_bytes"] = s.live_bytes;
  d["gpu_bytes"] = s.gpu_bytes;
  d["gpu_peak_bytes"] = s.gpu_peak_bytes;
  d["window_waits"] = s.window_waits;
  d["window_wait_seconds"] = static_cast<double>(s.window_wait_ns) * 1e-9;
  d["room_waiters"] = s.room_waiters;
  d["load_wait_seconds"] = static_cast<double>(s.load_wait_ns) * 1e-9;
  d["home_room_waits"] = s.home_room_waits;
  d["errors"] = s.errors;
  return d;
}

}  // namespace

void bind_activations(py::module_& m) {
  const ActivationStashOptions d;
  py::class_<PyActivationStash, std::shared_ptr<PyActivationStash>>(m, "ActivationStash", R"doc(
Saved activations through strata's tiers (ZeRO-R): they wait in the CPU tier (or on NVMe)
between forward and backward and come back into the GPU tier ahead of use, along the order the
previous step's backward used; at most `window_bytes` of the GPU tier at once. strata.torch's
offload_activations() drives it from autograd's saved-tensor hooks. See docs/activations.md.)doc")
      .def(py::init(&make_stash), py::arg("runtime"), py::arg("home") = "cpu",
           py::arg("window_bytes") = d.window_bytes, py::arg("prefetch_bytes") = d.prefetch_bytes,
           py::arg("keep_tail") = d.keep_tail, py::arg("record_trace") = d.record_trace,
           py::arg("name") = d.name)
      .def(
          "step_begin",
          [](PyActivationStash& s) {
            py::gil_scoped_release unlocked;
            s.stash->step_begin();
          },
          "Starts a step: save indices restart; the previous step's loads become the order.")
      .def(
          "step_end",
          [](PyActivationStash& s) {
            py::gil_scoped_release unlocked;
            s.stash->step_end();
          },
          "Ends the step (optional: step_begin() ends the previous one).")
      .def("allocate", &allocate, py::arg("shape"), py::arg("dtype"), py::arg("tier") = "cpu",
           "(id, Acquisition): memory for a new activation in `tier` (cpu: pinned CPU tier, for "
           "a copy from memory the caller owns; gpu: the GPU arena). Write it, then release the "
           "acquisition naming the stream that wrote it: that offloads the activation.")
      .def("load", &load, py::arg("id"), py::arg("shape"), py::arg("dtype"),
           py::arg("owner") = py::none(),
           "The activation in the GPU tier as an Acquisition (read); its release gives the load "
           "back. Prefetches the activations backward uses next. `owner` is kept alive as long "
           "as the acquisition (and any DLPack view of it).")
      .def(
          "free",
          [](PyActivationStash& s, ActivationId id, const py::object& stream) {
            Stream& on = stream_or_default(*s.rt, stream, "free");
            unlocked_check([&] { return s.stash->free(id, on); });
          },
          py::arg("id"), py::arg("stream") = py::none(),
          "Done with the activation: its bytes go once the work on `stream` is done.")
      .def(
          "synchronize",
          [](PyActivationStash& s) { unlocked_check([&] { return s.stash->synchronize(); }); },
          "Waits for the background moves and fetches; raises the first error they met.")
      .def(
          "stats",
          [](PyActivationStash& s) {
            ActivationStashStats st;
            {
              py::gil_scoped_release unlocked;
              st = s.stash->stats();
            }
            return stash_stats(st);
          },
          "A dict of counters (see ActivationStashStats in activation_stash.h).")
      .def(
          "write_trace",
          [](PyActivationStash& s, const std::string& path) {
            unlocked_check([&] { return s.stash->write_trace(path); });
          },
          py::arg("path"), "Writes the GPU-tier lifetimes for arena-replay (record_trace=True).")
      .def_property_readonly("window_bytes",
                             [](PyActivationStash& s) { return s.stash->options().window_bytes; })
      .def_property_readonly(
          "prefetch_bytes", [](PyActivationStash& s) { return s.stash->options().prefetch_bytes; });
}

}  // namespace strata::python
