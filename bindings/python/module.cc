// strata._strata: the C++ runtime for Python (pybind11), with DLPack views of acquired tensors.
// The pure-Python package around it is bindings/python/strata/; docs/python.md describes both.
//
// Conventions:
//   - Every failing absl::Status becomes a Python exception carrying the runtime's message:
//     strata.Error (a RuntimeError) and subclasses that also derive from the matching built-in
//     (InvalidArgumentError/ValueError, NotFoundError/KeyError, ResourceExhaustedError/MemoryError).
//   - The GIL is released around every call that may block (acquire, release, flush, step, ...).
//   - One stream per Runtime carries the work of Python calls. acquire() synchronizes it before
//     returning, so the memory is ready for the host and for any stream; release() synchronizes
//     it too, so the bytes are final when a `with` block exits.
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dlpack.h"
#include "strata/config.h"
#include "strata/device.h"
#include "strata/offload_optimizer.h"
#include "strata/runtime.h"
#include "strata/tensor_store.h"
#include "strata/tier.h"

namespace py = pybind11;

namespace strata::python {
namespace {

// ---- errors -------------------------------------------------------------------------------

struct StatusError {
  absl::StatusCode code;
  std::string message;
};

[[noreturn]] void raise(const absl::Status& status) {
  throw StatusError{status.code(), std::string(status.message())};
}
[[noreturn]] void raise(absl::StatusCode code, std::string message) {
  throw StatusError{code, std::move(message)};
}
void check(const absl::Status& status) {
  if (!status.ok()) raise(status);
}
template <typename T>
T check(absl::StatusOr<T> value) {
  if (!value.ok()) raise(value.status());
  return *std::move(value);
}

struct Exceptions {
  PyObject* error = nullptr;             // strata.Error(RuntimeError)
  PyObject* invalid_argument = nullptr;  // (Error, ValueError)
  PyObject* not_found = nullptr;         // (Error, KeyError)
  PyObject* already_exists = nullptr;    // (Error, ValueError)
  PyObject* resource_exhausted = nullptr;  // (Error, MemoryError)
  PyObject* failed_precondition = nullptr;  // (Error)
};
Exceptions g_exceptions;

PyObject* exception_for(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return g_exceptions.invalid_argument;
    case absl::StatusCode::kNotFound:
      return g_exceptions.not_found;
    case absl::StatusCode::kAlreadyExists:
      return g_exceptions.already_exists;
    case absl::StatusCode::kResourceExhausted:
      return g_exceptions.resource_exhausted;
    case absl::StatusCode::kFailedPrecondition:
      return g_exceptions.failed_precondition;
    default:
      return g_exceptions.error;
  }
}

PyObject* new_exception(py::module_& m, const char* name, PyObject* error_base, PyObject* builtin) {
  const std::string qualified = std::string("strata.") + name;
  py::object bases = builtin == nullptr
                         ? py::reinterpret_borrow<py::object>(error_base)
                         : py::object(py::make_tuple(py::handle(error_base), py::handle(builtin)));
  PyObject* type = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // steals a reference; the type lives with the module
  Py_INCREF(type);
  return type;
}

// ---- names ----------------------------------------------------------------------------------

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

TierKind parse_tier(const std::string& text, bool allow_nvme) {
  const std::string t = lower(text);
  if (t == "gpu" || t == "cuda" || t == "device") return TierKind::kGpu;
  if (t == "cpu" || t == "host") return TierKind::kCpu;
  if (allow_nvme && t == "nvme") return TierKind::kNvme;
  raise(absl::StatusCode::kInvalidArgument,
        "'" + text + "' is not a tier: use " + (allow_nvme ? "gpu, cpu or nvme" : "gpu or cpu"));
}

std::string tier_name(TierKind kind) { return std::string(to_string(kind)); }

AccessMode parse_mode(const std::string& text) {
  const std::string t = lower(text);
  if (t == "r" || t == "read") return AccessMode::kRead;
  if (t == "w" || t == "write" || t == "rw" || t == "r+" || t == "readwrite") {
    return AccessMode::kWrite;
  }
  raise(absl::StatusCode::kInvalidArgument,
        "'" + text + "' is not an access mode: use 'r' (read) or 'w' (write)");
}

struct DType {
  std::string name;  // torch's spelling
  DLDataType dl;
  uint32_t itemsize;
};

const std::vector<DType>& dtypes() {
  static const std::vector<DType> table = {
      {"float32", {kDLFloat, 32, 1}, 4},  {"float64", {kDLFloat, 64, 1}, 8},
      {"float16", {kDLFloat, 16, 1}, 2},  {"bfloat16", {kDLBfloat, 16, 1}, 2},
      {"int8", {kDLInt, 8, 1}, 1},        {"int16", {kDLInt, 16, 1}, 2},
      {"int32", {kDLInt, 32, 1}, 4},      {"int64", {kDLInt, 64, 1}, 8},
      {"uint8", {kDLUInt, 8, 1}, 1},      {"bool", {kDLBool, 8, 1}, 1},
  };
  return table;
}

DType parse_dtype(const py::handle& object) {
  std::string text;
  if (py::isinstance<py::str>(object)) {
    text = object.cast<std::string>();
  } else if (py::hasattr(object, "is_floating_point")) {  // torch.dtype: "torch.float32"
    text = py::str(object).cast<std::string>();
  } else {  // numpy dtypes and scalar types
    try {
      text = py::module_::import("numpy").attr("dtype")(object).attr("name").cast<std::string>();
    } catch (const py::error_already_set&) {
      text = py::str(object).cast<std::string>();
    }
  }
  std::string t = lower(text);
  if (t.starts_with("torch.")) t = t.substr(6);
  static const std::map<std::string, std::string> aliases = {
      {"float", "float32"}, {"half", "float16"}, {"double", "float64"}, {"int", "int32"},
      {"long", "int64"},    {"short", "int16"},  {"f4", "float32"},     {"f2", "float16"},
      {"f8", "float64"},    {"bf16", "bfloat16"}};
  if (auto it = aliases.find(t); it != aliases.end()) t = it->second;
  for (const DType& d : dtypes()) {
    if (d.name == t) return d;
  }
  raise(absl::StatusCode::kInvalidArgument,
        "'" + text +
            "' is not a dtype strata knows: use float32, float64, float16, bfloat16, int8, int16, "
            "int32, int64, uint8 or bool");
}

// ---- runtime, tensors, acquisitions ----------------------------------------------------------

class PyRuntime {
 public:
  PyRuntime(std::unique_ptr<Runtime> runtime, std::unique_ptr<Stream> stream)
      : runtime_(std::move(runtime)), stream_(std::move(stream)) {}
  ~PyRuntime() {
    py::gil_scoped_release release;
    stream_.reset();
    runtime_.reset();
  }

  Runtime& runtime() { return *runtime_; }
  TensorStore& store() { return runtime_->store(); }
  Device& device() { return runtime_->device(); }
  Stream& stream() { return *stream_; }
  bool cuda() const { return runtime_->config().backend == Backend::kCuda; }

  // What Python recorded at create(): dtype and shape, by tensor name.
  struct Record {
    std::vector<int64_t> shape;
    DType dtype;
  };
  std::map<std::string, Record> records;  // guarded by the GIL

 private:
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<Stream> stream_;  // destroyed before the runtime (see ~PyRuntime)
};

class PyTensor {
 public:
  PyTensor(std::shared_ptr<PyRuntime> rt_, TensorHandle handle_, std::string name_,
           std::vector<int64_t> shape_, DType dtype_, uint64_t bytes_, TierKind home_)
      : rt(std::move(rt_)), handle(handle_), name(std::move(name_)), shape(std::move(shape_)),
        dtype(std::move(dtype_)), bytes(bytes_), home(home_) {}

  void check_alive() const {
    if (destroyed) {
      raise(absl::StatusCode::kFailedPrecondition, "tensor '" + name + "' was destroyed");
    }
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  std::shared_ptr<PyRuntime> rt;
  TensorHandle handle;
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;
  uint64_t bytes;
  TierKind home;
  bool destroyed = false;
  int acquired = 0;  // live Acquisitions made through this object
};

class Acquisition {
 public:
  Acquisition(std::shared_ptr<PyTensor> tensor_, void* data_, TierKind tier_, AccessMode mode_)
      : tensor(std::move(tensor_)), data(data_), tier(tier_), mode(mode_) {}
  ~Acquisition() {
    // Dropped without release (no `with`, no release()): give the tensor back anyway.
    if (!released) {
      try {
        release();
      } catch (...) {  // NOLINT(bugprone-empty-catch): nothing to report to in a destructor
      }
    }
  }

  void release() {
    if (released) {
      raise(absl::StatusCode::kFailedPrecondition,
            "tensor '" + tensor->name + "': this acquisition was already released");
    }
    released = true;
    tensor->acquired--;
    PyRuntime& rt = *tensor->rt;
    absl::Status status;
    {
      py::gil_scoped_release unlocked;
      status = rt.store().release(tensor->handle, rt.stream());
      if (status.ok()) status = rt.device().synchronize(rt.stream());
    }
    check(status);
  }

  void check_live() const {
    if (released) {
      raise(absl::StatusCode::kFailedPrecondition,
            "tensor '" + tensor->name + "' was released: views must not outlive the acquisition");
    }
  }

  DLDevice dl_device() const {
    if (tier == TierKind::kGpu && tensor->rt->cuda()) {
      return {kDLCUDA, tensor->rt->runtime().config().device};
    }
    return {kDLCPU, 0};  // the CPU tier, and the "GPU" tier of the host backend
  }

  std::shared_ptr<PyTensor> tensor;
  void* data;
  TierKind tier;
  AccessMode mode;
  bool released = false;
};

// DLPack: the capsule's DLManagedTensor keeps the Python Acquisition alive (not the acquisition
// itself: that ends with the `with` block or release()).
struct DlpackContext {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  py::object owner;
};

void dlpack_deleter(DLManagedTensor* self) {
  auto* context = static_cast<DlpackContext*>(self->manager_ctx);
  py::gil_scoped_acquire gil;
  delete context;
}

void dlpack_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "used_dltensor") != 0) return;  // a consumer owns it now
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) {
    PyErr_WriteUnraisable(capsule);
  } else if (managed->deleter != nullptr) {
    managed->deleter(managed);
  }
  PyErr_Restore(type, value, traceback);
}

py::capsule to_dlpack(const py::object& self) {
  auto& acquisition = self.cast<Acquisition&>();
  acquisition.check_live();
  const PyTensor& t = *acquisition.tensor;
  auto context = std::make_unique<DlpackContext>();
  context->shape = t.shape;
  context->strides.assign(t.shape.size(), 1);
  for (size_t i = t.shape.size(); i-- > 1;) {
    context->strides[i - 1] = context->strides[i] * t.shape[i];
  }
  context->owner = self;
  DLTensor& dl = context->managed.dl_tensor;
  dl.data = acquisition.data;
  dl.device = acquisition.dl_device();
  dl.ndim = static_cast<int32_t>(t.shape.size());
  dl.dtype = t.dtype.dl;
  dl.shape = context->shape.data();
  dl.strides = context->strides.data();
  dl.byte_offset = 0;
  context->managed.manager_ctx = context.get();
  context->managed.deleter = dlpack_deleter;
  PyObject* capsule =
      PyCapsule_New(&context->managed, "dltensor", dlpack_capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  context.release();  // owned by the capsule (or its consumer) now
  return py::reinterpret_steal<py::capsule>(capsule);
}

std::shared_ptr<Acquisition> acquire(const std::shared_ptr<PyTensor>& tensor,
                                     const std::string& tier_text, const std::string& mode_text) {
  tensor->check_alive();
  const TierKind tier = parse_tier(tier_text, /*allow_nvme=*/false);
  const AccessMode mode = parse_mode(mode_text);
  PyRuntime& rt = *tensor->rt;
  absl::StatusOr<void*> data;
  {
    py::gil_scoped_release unlocked;
    data = rt.store().acquire(tensor->handle, tier, rt.stream(), mode);
    if (data.ok()) {
      // The host (and any consumer's stream) may use the memory at once.
      if (absl::Status synced = rt.device().synchronize(rt.stream()); !synced.ok()) {
        (void)rt.store().release(tensor->handle, rt.stream());
        data = synced;
      }
    }
  }
  void* address = check(std::move(data));
  tensor->acquired++;
  return std::make_shared<Acquisition>(tensor, address, tier, mode);
}

std::map<std::string, std::string> strata_environment() {
  std::map<std::string, std::string> vars;
  py::dict environ = py::module_::import("os").attr("environ").attr("copy")();
  for (auto [key, value] : environ) {
    const auto name = key.cast<std::string>();
    if (name.starts_with("STRATA_")) vars[name] = value.cast<std::string>();
  }
  return vars;
}

std::string override_text(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "on" : "off";
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    std::string joined;
    for (const py::handle item : value) {
      if (!joined.empty()) joined += ",";
      joined += py::str(py::module_::import("os").attr("fspath")(item)).cast<std::string>();
    }
    return joined;
  }
  if (py::hasattr(value, "__fspath__")) {
    return py::str(py::module_::import("os").attr("fspath")(value)).cast<std::string>();
  }
  return py::str(value).cast<std::string>();
}

std::shared_ptr<PyRuntime> make_runtime(const py::kwargs& overrides) {
  std::map<std::string, std::string> vars = strata_environment();
  for (auto [key, value] : overrides) {
    std::string name = key.cast<std::string>();
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!name.starts_with("STRATA_")) name = "STRATA_" + name;
    if (value.is_none()) {
      vars.erase(name);  // back to the default
    } else {
      vars[name] = override_text(value);
    }
  }
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

// ---- stats as dicts ----------------------------------------------------------------------

py::dict store_stats(const StoreStats& s) {
  py::list tiers;
  for (const TierUsage& u : s.tiers) {
    py::dict d;
    d["kind"] = tier_name(u.kind);
    d["present"] = u.present;
    d["capacity"] = u.capacity;
    d["used"] = u.used;
    d["resident"] = u.resident;
    d["fragmentation"] = u.fragmentation;
    tiers.append(d);
  }
  py::dict moves;
  for (size_t from = 0; from < 3; ++from) {
    for (size_t to = 0; to < 3; ++to) {
      if (from == to) continue;
      const MoveStats& m = s.moves[from][to];
      py::dict d;
      d["bytes"] = m.bytes;
      d["moves"] = m.moves;
      d["ns"] = m.ns;
      moves[py::str(tier_name(static_cast<TierKind>(from)) + "->" +
                    tier_name(static_cast<TierKind>(to)))] = d;
    }
  }
  py::dict schedule;
  schedule["steps"] = s.schedule.steps;
  schedule["trace_length"] = s.schedule.trace_length;
  schedule["acquires"] = s.schedule.acquires;
  schedule["matched"] = s.schedule.matched;
  schedule["realigned"] = s.schedule.realigned;
  schedule["unknown"] = s.schedule.unknown;
  schedule["rerecords"] = s.schedule.rerecords;
  schedule["late"] = s.schedule.late;
  schedule["has_trace"] = s.schedule.has_trace;
  schedule["given_order"] = s.schedule.given_order;
  py::dict d;
  d["tiers"] = tiers;
  d["moves"] = moves;
  d["tensors"] = s.tensors;
  d["acquires"] = s.acquires;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["stall_ns"] = s.stall_ns;
  d["evictions_clean"] = s.evictions_clean;
  d["evictions_writeback"] = s.evictions_writeback;
  d["errors"] = s.errors;
  d["prefetches_issued"] = s.prefetches_issued;
  d["prefetches_used"] = s.prefetches_used;
  d["prefetches_late"] = s.prefetches_late;
  d["prefetches_wasted"] = s.prefetches_wasted;
  d["prefetches_failed"] = s.prefetches_failed;
  d["prefetch_accuracy"] = s.prefetch_accuracy();
  d["schedule"] = schedule;
  return d;
}

py::dict config_dict(const ResolvedConfig& c) {
  py::dict d;
  d["backend"] = std::string(to_string(c.backend));
  d["backend_reason"] = c.backend_reason;
  d["device"] = c.device;
  d["gpu_bytes"] = c.gpu_bytes;
  d["cpu_bytes"] = c.cpu_bytes;
  d["nvme_paths"] = c.nvme_paths;
  d["nvme_bytes"] = c.nvme_bytes;
  d["io_engine"] = std::string(to_string(c.io_engine));
  d["io_engine_reason"] = c.io_engine_reason;
  d["io_depth"] = c.io_depth;
  d["io_block"] = c.io_block;
  d["staging_bytes"] = c.staging_bytes;
  d["verify"] = c.verify;
  d["log"] = std::string(to_string(c.log));
  d["warnings"] = c.warnings;
  return d;
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
  PyRuntime::Record record{{static_cast<int64_t>(info.bytes)}, dtypes()[8]};  // uint8 bytes
  if (auto it = rt->records.find(name); it != rt->records.end()) record = it->second;
  return std::make_shared<PyTensor>(rt, h, info.name, record.shape, record.dtype, info.bytes,
                                    info.home);
}

// ---- the offload optimizer ---------------------------------------------------------------

class PyOptimizer {
 public:
  PyOptimizer(std::shared_ptr<PyRuntime> rt_, std::unique_ptr<OffloadOptimizer> opt_)
      : rt(std::move(rt_)), opt(std::move(opt_)) {}
  ~PyOptimizer() {
    py::gil_scoped_release unlocked;
    opt.reset();
  }
  std::shared_ptr<PyRuntime> rt;  // outlives opt
  std::unique_ptr<OffloadOptimizer> opt;
  std::vector<uint64_t> counts;  // by ParamId
};

ParamType param_type(const PyTensor& t) {
  if (t.dtype.name == "float32") return ParamType::kF32;
  if (t.dtype.name == "float16") return ParamType::kF16;
  if (t.dtype.name == "bfloat16") return ParamType::kBF16;
  raise(absl::StatusCode::kInvalidArgument,
        "parameter tensor '" + t.name + "' is " + t.dtype.name +
            ": the optimizer takes float32, float16 or bfloat16 parameters");
}
GradType grad_type(const PyTensor& t) {
  if (t.dtype.name == "float32") return GradType::kF32;
  if (t.dtype.name == "float16") return GradType::kF16;
  if (t.dtype.name == "bfloat16") return GradType::kBF16;
  raise(absl::StatusCode::kInvalidArgument,
        "gradient tensor '" + t.name + "' is " + t.dtype.name +
            ": the optimizer takes float32, float16 or bfloat16 gradients");
}

ParamId param_id(const PyOptimizer& o, int64_t id) {
  if (id < 0 || static_cast<uint64_t>(id) >= o.counts.size()) {
    raise(absl::StatusCode::kInvalidArgument,
          "parameter id " + std::to_string(id) + " is not registered with this optimizer");
  }
  return ParamId{static_cast<uint32_t>(id)};
}

py::dict group_dict(const AdamGroup& g) {
  py::dict d;
  d["lr"] = g.lr;
  d["betas"] = py::make_tuple(g.beta1, g.beta2);
  d["eps"] = g.eps;
  d["weight_decay"] = g.weight_decay;
  d["decoupled"] = g.decoupled;
  return d;
}

void apply_group_kwargs(AdamGroup& g, const py::kwargs& kwargs) {
  for (auto [key, value] : kwargs) {
    const auto k = key.cast<std::string>();
    if (k == "lr") {
      g.lr = value.cast<float>();
    } else if (k == "betas") {
      auto betas = value.cast<std::pair<float, float>>();
      g.beta1 = betas.first;
      g.beta2 = betas.second;
    } else if (k == "eps") {
      g.eps = value.cast<float>();
    } else if (k == "weight_decay") {
      g.weight_decay = value.cast<float>();
    } else if (k == "decoupled") {
      g.decoupled = value.cast<bool>();
    } else {
      raise(absl::StatusCode::kInvalidArgument,
            "'" + k + "' is not a group setting: use lr, betas, eps, weight_decay or decoupled");
    }
  }
}

std::shared_ptr<PyOptimizer> make_optimizer(const std::shared_ptr<PyRuntime>& rt,
                                            const std::string& state_home, float lr,
                                            std::pair<float, float> betas, float eps,
                                            float weight_decay, bool decoupled,
                                            float max_grad_norm, float loss_scale,
                                            bool dynamic_loss_scale, bool skip_on_overflow,
                                            uint64_t chunk_elements) {
  OffloadOptimizerOptions o;
  o.state_home = parse_tier(state_home, /*allow_nvme=*/true);
  o.defaults = {.lr = lr, .beta1 = betas.first, .beta2 = betas.second, .eps = eps,
                .weight_decay = weight_decay, .decoupled = decoupled};
  o.max_grad_norm = max_grad_norm;
  o.skip_on_overflow = skip_on_overflow;
  o.loss_scaling.scale = loss_scale;
  o.loss_scaling.dynamic = dynamic_loss_scale;
  o.chunk_elements = chunk_elements;
  absl::StatusOr<std::unique_ptr<OffloadOptimizer>> opt;
  {
    py::gil_scoped_release unlocked;
    opt = OffloadOptimizer::create(rt->runtime(), o);
  }
  return std::make_shared<PyOptimizer>(rt, check(std::move(opt)));
}

int64_t add_param(PyOptimizer& o, const std::string& name, const PyTensor& param,
                  const PyTensor& grad, const py::object& initial_master, uint32_t group) {
  param.check_alive();
  grad.check_alive();
  if (param.rt.get() != o.rt.get() || grad.rt.get() != o.rt.get()) {
    raise(absl::StatusCode::kInvalidArgument,
          "parameter '" + name + "': its tensors belong to another Runtime than the optimizer");
  }
  ParamSpec spec;
  spec.name = name;
  spec.param = param.handle;
  spec.grad = grad.handle;
  spec.param_type = param_type(param);
  spec.grad_type = grad_type(grad);
  spec.count = static_cast<uint64_t>(param.numel());
  spec.group = group;
  if (grad.numel() != param.numel()) {
    raise(absl::StatusCode::kInvalidArgument,
          "parameter '" + name + "': the gradient '" + grad.name + "' has " +
              std::to_string(grad.numel()) + " elements, the parameter " +
              std::to_string(param.numel()));
  }
  py::array_t<float, py::array::c_style | py::array::forcecast> master;
  if (!initial_master.is_none()) {
    py::object source = initial_master;
    if (py::hasattr(source, "detach") && py::hasattr(source, "cpu")) {  // a torch tensor
      source = source.attr("detach")().attr("cpu")().attr("float")().attr("numpy")();
    }
    master = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(source);
    if (!master) throw py::error_already_set();
    if (static_cast<uint64_t>(master.size()) != spec.count) {
      raise(absl::StatusCode::kInvalidArgument,
            "parameter '" + name + "': initial_master has " + std::to_string(master.size()) +
                " values, the parameter " + std::to_string(spec.count));
    }
    spec.initial_master = std::span<const float>(master.data(), spec.count);
  }
  absl::StatusOr<ParamId> id;
  {
    py::gil_scoped_release unlocked;
    id = o.opt->add_param(spec);
  }
  const ParamId pid = check(std::move(id));
  if (o.counts.size() <= pid.index) o.counts.resize(pid.index + 1);
  o.counts[pid.index] = spec.count;
  return pid.index;
}

py::dict optimizer_stats(const OffloadOptimizerStats& s) {
  py::dict d;
  d["steps"] = s.steps;
  d["skipped_steps"] = s.skipped_steps;
  d["failed_steps"] = s.failed_steps;
  d["grads_landed"] = s.grads_landed;
  d["grad_bytes_landed"] = s.grad_bytes_landed;
  d["params"] = s.params;
  d["elements"] = s.elements;
  d["chunk_elements"] = s.chunk_elements;
  d["chunks"] = s.chunks;
  d["last_step_ns"] = s.last_step_ns;
  d["last_step_wait_ns"] = s.last_step_wait_ns;
  d["last_adam_ns"] = s.last_adam_ns;
  d["last_nvme_wait_ns"] = s.last_nvme_wait_ns;
  d["nvme_bytes_read"] = s.nvme_bytes_read;
  d["nvme_bytes_written"] = s.nvme_bytes_written;
  d["peak_staging_chunks"] = s.peak_staging_chunks;
  return d;
}

template <typename F>
void unlocked_check(F&& f) {
  absl::Status status;
  {
    py::gil_scoped_release unlocked;
    status = f();
  }
  check(status);
}

}  // namespace
}  // namespace strata::python

PYBIND11_MODULE(_strata, m) {
  using namespace strata;          // NOLINT(build/namespaces)
  using namespace strata::python;  // NOLINT(build/namespaces)
  m.doc() = "strata: a heterogeneous memory runtime for deep-learning training (C++ core)";

  g_exceptions.error = new_exception(m, "Error", PyExc_RuntimeError, nullptr);
  g_exceptions.invalid_argument =
      new_exception(m, "InvalidArgumentError", g_exceptions.error, PyExc_ValueError);
  g_exceptions.not_found = new_exception(m, "NotFoundError", g_exceptions.error, PyExc_KeyError);
  g_exceptions.already_exists =
      new_exception(m, "AlreadyExistsError", g_exceptions.error, PyExc_ValueError);
  g_exceptions.resource_exhausted =
      new_exception(m, "ResourceExhaustedError", g_exceptions.error, PyExc_MemoryError);
  g_exceptions.failed_precondition =
      new_exception(m, "FailedPreconditionError", g_exceptions.error, nullptr);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyErr_SetString(exception_for(e.code), e.message.c_str());
    }
  });

  py::class_<PyRuntime, std::shared_ptr<PyRuntime>>(m, "Runtime", R"doc(
The strata runtime: device, GPU arena, pinned CPU tier, NVMe swap space and the tensor store.

Built from the STRATA_* environment variables; keyword arguments override them, e.g.
Runtime(backend="host", gpu_bytes="64MiB", nvme_paths=["/mnt/nvme0"]) sets STRATA_BACKEND,
STRATA_GPU_BYTES and STRATA_NVME_PATHS. None unsets a variable (its default applies).)doc")
      .def(py::init(&make_runtime))
      .def_property_readonly("backend",
                             [](PyRuntime& r) {
                               return std::string(to_string(r.runtime().config().backend));
                             })
      .def_property_readonly("config",
                             [](PyRuntime& r) { return config_dict(r.runtime().config()); })
      .def_property_readonly("warnings", [](PyRuntime& r) { return r.runtime().warnings(); })
      .def_property_readonly("has_nvme", [](PyRuntime& r) { return r.runtime().nvme() != nullptr; })
      .def("create", &create_tensor, py::arg("name"), py::arg("shape"),
           py::arg("dtype") = "float32", py::arg("home") = "cpu",
           "Registers a tensor of `shape` and `dtype` whose home copy lives in `home` "
           "(cpu, nvme or gpu). Contents are undefined until first written.")
      .def("find", &find_tensor, py::arg("name"))
      .def("flush",
           [](PyRuntime& r) { unlocked_check([&] { return r.store().flush(); }); })
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
      .def(
          "set_access_order",
          [](PyRuntime& r, const py::iterable& order) {
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
          },
          py::arg("order"),
          "The order in which a training step acquires tensors: tensors (acquired in the gpu "
          "tier) or (tensor, tier) pairs. Replaces the recorded trace.")
      .def("stats", [](PyRuntime& r) { return store_stats(r.store().stats()); })
      .def("synchronize", [](PyRuntime& r) {
        unlocked_check([&] { return r.device().synchronize(r.stream()); });
      });

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
           "The tensor's memory in `tier` (cpu or gpu) for reading ('r') or writing ('w'). "
           "Returns an Acquisition: a context manager whose value exposes __dlpack__ and "
           "__dlpack_device__. Views made from it must not outlive the `with` block.")
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

  py::class_<Acquisition, std::shared_ptr<Acquisition>>(
      m, "Acquisition",
      "A tensor's memory in one tier, acquired until release() or the end of the `with` block.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](Acquisition& a, const py::object&, const py::object&, const py::object&) {
            if (!a.released) a.release();
            return false;
          })
      .def("release", &Acquisition::release)
      .def("__dlpack__", [](py::object self, const py::object& /*stream*/) { return to_dlpack(self); },
           py::arg("stream") = py::none(),
           "A 'dltensor' capsule viewing the memory (zero copy). acquire() has synchronized "
           "strata's stream, so the memory is ready for any consumer stream.")
      .def("__dlpack_device__",
           [](Acquisition& a) {
             const DLDevice d = a.dl_device();
             return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
           })
      .def_property_readonly("address",
                             [](Acquisition& a) {
                               a.check_live();
                               return reinterpret_cast<uintptr_t>(a.data);
                             })
      .def_property_readonly("tier", [](Acquisition& a) { return tier_name(a.tier); })
      .def_property_readonly("mode",
                             [](Acquisition& a) {
                               return std::string(a.mode == AccessMode::kRead ? "r" : "w");
                             })
      .def_property_readonly("released", [](Acquisition& a) { return a.released; })
      .def_property_readonly("tensor", [](Acquisition& a) { return a.tensor; })
      .def_property_readonly("shape",
                             [](Acquisition& a) { return py::tuple(py::cast(a.tensor->shape)); })
      .def_property_readonly("dtype", [](Acquisition& a) { return a.tensor->dtype.name; });

  py::class_<PyOptimizer, std::shared_ptr<PyOptimizer>>(m, "OffloadOptimizer", R"doc(
ZeRO-Offload's optimizer: fp32 master weights and Adam moments in the CPU tier (or on NVMe),
the Adam step on the CPU, gradients handed over as backward produces them (grad_ready).)doc")
      .def(py::init(&make_optimizer), py::arg("runtime"), py::arg("state_home") = "cpu",
           py::arg("lr") = 1e-3F, py::arg("betas") = std::pair<float, float>(0.9F, 0.999F),
           py::arg("eps") = 1e-8F, py::arg("weight_decay") = 0.0F, py::arg("decoupled") = true,
           py::arg("max_grad_norm") = 0.0F, py::arg("loss_scale") = 1.0F,
           py::arg("dynamic_loss_scale") = false, py::arg("skip_on_overflow") = true,
           py::arg("chunk_elements") = 0)
      .def("add_param", &add_param, py::arg("name"), py::arg("param"), py::arg("grad"),
           py::arg("initial_master") = py::none(), py::arg("group") = 0,
           "Registers a parameter (its tensor and its gradient's, same element count) and "
           "returns its id. initial_master: fp32 values (numpy, torch, any buffer); None widens "
           "the parameter tensor's current contents.")
      .def("find_param",
           [](PyOptimizer& o, const std::string& name) {
             return static_cast<int64_t>(check(o.opt->find_param(name)).index);
           })
      .def(
          "grad_ready",
          [](PyOptimizer& o, int64_t id) {
            const ParamId pid = param_id(o, id);
            unlocked_check([&] { return o.opt->grad_ready(pid, o.rt->stream()); });
          },
          py::arg("param"),
          "The parameter's gradient tensor holds its gradient (released): it is copied now, "
          "and accumulates with earlier ones since the last step.")
      .def("zero_grad", [](PyOptimizer& o) { unlocked_check([&] { return o.opt->zero_grad(); }); })
      .def("step",
           [](PyOptimizer& o) {
             absl::StatusOr<StepResult> result;
             {
               py::gil_scoped_release unlocked;
               result = o.opt->step();
             }
             const StepResult r = check(std::move(result));
             py::dict d;
             d["skipped"] = r.skipped;
             d["grad_norm"] = r.grad_norm;
             d["clip_coef"] = r.clip_coef;
             d["params_updated"] = r.params_updated;
             d["step"] = r.step;
             d["loss_scale"] = r.loss_scale;
             return d;
           })
      .def(
          "save",
          [](PyOptimizer& o, const py::object& directory) {
            const auto dir = py::str(py::module_::import("os").attr("fspath")(directory))
                                 .cast<std::string>();
            unlocked_check([&] { return o.opt->save(dir); });
          },
          py::arg("directory"))
      .def(
          "load",
          [](PyOptimizer& o, const py::object& directory) {
            const auto dir = py::str(py::module_::import("os").attr("fspath")(directory))
                                 .cast<std::string>();
            unlocked_check([&] { return o.opt->load(dir); });
          },
          py::arg("directory"))
      .def(
          "read_state",
          [](PyOptimizer& o, int64_t id) {
            const ParamId pid = param_id(o, id);
            const auto n = static_cast<py::ssize_t>(o.counts[pid.index]);
            py::array_t<float> master(n), exp_avg(n), exp_avg_sq(n);
            std::span<float> a(master.mutable_data(), static_cast<size_t>(n));
            std::span<float> b(exp_avg.mutable_data(), static_cast<size_t>(n));
            std::span<float> c(exp_avg_sq.mutable_data(), static_cast<size_t>(n));
            unlocked_check([&] { return o.opt->read_state(pid, a, b, c); });
            return py::make_tuple(master, exp_avg, exp_avg_sq);
          },
          py::arg("param"), "(master, exp_avg, exp_avg_sq) as fp32 numpy arrays.")
      .def(
          "add_group",
          [](PyOptimizer& o, const py::kwargs& kwargs) {
            AdamGroup g = check(o.opt->group(0));
            apply_group_kwargs(g, kwargs);
            return check(o.opt->add_group(g));
          },
          "A new parameter group: group 0's settings with the keyword overrides; returns its "
          "index.")
      .def(
          "group", [](PyOptimizer& o, uint32_t g) { return group_dict(check(o.opt->group(g))); },
          py::arg("group") = 0)
      .def(
          "set_group",
          [](PyOptimizer& o, uint32_t group, const py::kwargs& kwargs) {
            AdamGroup g = check(o.opt->group(group));
            apply_group_kwargs(g, kwargs);
            check(o.opt->set_group(group, g));
          },
          py::arg("group"))
      .def(
          "set_lr",
          [](PyOptimizer& o, uint32_t group, float lr) {
            AdamGroup g = check(o.opt->group(group));
            g.lr = lr;
            check(o.opt->set_group(group, g));
          },
          py::arg("group"), py::arg("lr"))
      .def("set_loss_scale",
           [](PyOptimizer& o, float scale) { check(o.opt->set_loss_scale(scale)); })
      .def_property_readonly("loss_scale", [](PyOptimizer& o) { return o.opt->loss_scale(); })
      .def_property_readonly("step_count", [](PyOptimizer& o) { return o.opt->step_count(); })
      .def("param_step_count",
           [](PyOptimizer& o, int64_t id) { return o.opt->param_step_count(param_id(o, id)); })
      .def("stats", [](PyOptimizer& o) { return optimizer_stats(o.opt->stats()); })
      .def_property_readonly("runtime", [](PyOptimizer& o) { return o.rt; });
}
