#include "zero.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "acquisition.h"
#include "errors.h"
#include "float16.h"
#include "names.h"
#include "optimizer.h"
#include "strata/base/size.h"
#include "tensor.h"

namespace py = pybind11;

namespace strata::python {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// numpy, torch (detached, moved to the CPU, widened) or anything numpy converts, as fp32.
FloatArray float_array(const py::handle& value) {
  py::object source = py::reinterpret_borrow<py::object>(value);
  if (py::hasattr(source, "detach") && py::hasattr(source, "cpu")) {  // a torch tensor
    source = source.attr("detach")().attr("cpu")().attr("float")().attr("numpy")();
  }
  FloatArray array = FloatArray::ensure(source);
  if (!array) throw py::error_already_set();
  return array;
}

std::string type_name(const py::handle& value) {
  return py::str(py::type::of(value).attr("__name__")).cast<std::string>();
}

ParamType param_type_of(const py::object& dtype) {
  const std::string name = parse_dtype(dtype).name;
  if (name == "float32") return ParamType::kF32;
  if (name == "float16") return ParamType::kF16;
  if (name == "bfloat16") return ParamType::kBF16;
  raise(absl::StatusCode::kInvalidArgument,
        "param_dtype " + name + ": the engine's parameters are float32, float16 or bfloat16");
}

GradType grad_type_of(const py::object& dtype) {
  const std::string name = parse_dtype(dtype).name;
  if (name == "float32") return GradType::kF32;
  if (name == "float16") return GradType::kF16;
  if (name == "bfloat16") return GradType::kBF16;
  raise(absl::StatusCode::kInvalidArgument,
        "grad_dtype " + name + ": the engine's gradients are float32, float16 or bfloat16");
}

const DType& dtype_of(ParamType type) {
  const char* name = type == ParamType::kF32   ? "float32"
                     : type == ParamType::kF16 ? "float16"
                                               : "bfloat16";
  for (const DType& d : dtypes()) {
    if (d.name == name) return d;
  }
  return dtypes().front();
}

uint64_t size_of(const py::object& value, const char* what) {
  if (py::isinstance<py::str>(value)) {
    absl::StatusOr<uint64_t> bytes = parse_size(value.cast<std::string>());
    if (!bytes.ok())
      raise(absl::StatusCode::kInvalidArgument,
            std::string(what) + "=" + std::string(bytes.status().message()));
    return *bytes;
  }
  const auto n = value.cast<int64_t>();
  if (n <= 0) {
    raise(absl::StatusCode::kInvalidArgument,
          std::string(what) + "=" + std::to_string(n) + ": a positive byte count (or '32MiB')");
  }
  return static_cast<uint64_t>(n);
}

// One (name, shape[, initial[, group]]) entry; `keep` holds the initial values' array.
ZeroParam param_of(const py::handle& item, size_t i, std::vector<FloatArray>& keep) {
  const std::string where = "params[" + std::to_string(i) + "]";
  if (!py::isinstance<py::sequence>(item) || py::isinstance<py::str>(item)) {
    raise(absl::StatusCode::kInvalidArgument,
          where + " is a " + type_name(item) + ": use (name, shape), (name, shape, initial) or " +
              "(name, shape, initial, group)");
  }
  const auto entry = py::reinterpret_borrow<py::sequence>(item);
  if (entry.size() < 2 || entry.size() > 4) {
    raise(absl::StatusCode::kInvalidArgument,
          where + " has " + std::to_string(entry.size()) +
              " items: use (name, shape), (name, shape, initial) or (name, shape, initial, group)");
  }
  ZeroParam param;
  param.name = entry[0].cast<std::string>();
  const py::object shape = entry[1];
  if (py::isinstance<py::int_>(shape)) {
    param.shape.push_back(shape.cast<int64_t>());
  } else {
    for (const py::handle d : shape) param.shape.push_back(d.cast<int64_t>());
  }
  if (entry.size() >= 4) param.group = entry[3].cast<uint32_t>();
  if (entry.size() >= 3 && !entry[2].is_none()) {
    uint64_t count = 1;
    for (int64_t d : param.shape) count *= d > 0 ? static_cast<uint64_t>(d) : 0;
    FloatArray initial = float_array(entry[2]);
    if (static_cast<uint64_t>(initial.size()) != count) {
      raise(absl::StatusCode::kInvalidArgument, where + " ('" + param.name + "'): initial has " +
                                                    std::to_string(initial.size()) +
                                                    " values, the shape " + std::to_string(count));
    }
    param.initial = std::span<const float>(initial.data(), count);
    keep.push_back(std::move(initial));
  }
  return param;
}

std::shared_ptr<PyZeroEngine> make_engine(
    const std::shared_ptr<PyRuntime>& rt, const std::shared_ptr<PyCommunicator>& comm,
    const py::iterable& params, uint32_t stage, const py::object& param_dtype,
    const py::object& grad_dtype, const py::object& bucket_bytes, uint32_t gradient_buckets,
    uint32_t alignment, const std::string& param_home, uint32_t accumulation_steps,
    const std::string& state_home, float lr, std::pair<float, float> betas, float eps,
    float weight_decay, bool decoupled, float max_grad_norm, float loss_scale,
    bool dynamic_loss_scale, bool skip_on_overflow, uint64_t chunk_elements,
    const py::object& groups) {
  if (comm->rt != nullptr && comm->rt != rt) {
    raise(absl::StatusCode::kInvalidArgument,
          "the Communicator was created with another Runtime than the engine's: create it with "
          "Communicator.from_environment(runtime)");
  }
  ZeroOptions o;
  o.stage = stage;
  o.param_type = param_type_of(param_dtype);
  o.grad_type = grad_type_of(grad_dtype);
  o.bucket_bytes = size_of(bucket_bytes, "bucket_bytes");
  o.gradient_buckets = gradient_buckets;
  o.alignment = alignment;
  o.param_home = parse_tier(param_home, /*allow_nvme=*/false);
  o.accumulation_steps = accumulation_steps;
  OffloadOptimizerOptions& opt = o.optimizer;
  opt.state_home = parse_tier(state_home, /*allow_nvme=*/true);
  opt.defaults = {.lr = lr,
                  .beta1 = betas.first,
                  .beta2 = betas.second,
                  .eps = eps,
                  .weight_decay = weight_decay,
                  .decoupled = decoupled};
  opt.max_grad_norm = max_grad_norm;
  opt.skip_on_overflow = skip_on_overflow;
  opt.loss_scaling.scale = loss_scale;
  opt.loss_scaling.dynamic = dynamic_loss_scale;
  opt.chunk_elements = chunk_elements;
  if (!groups.is_none()) {
    for (const py::handle g : groups) {
      AdamGroup group = opt.defaults;
      apply_group_kwargs(group, g.cast<py::dict>());
      o.groups.push_back(group);
    }
  }
  std::vector<FloatArray> keep;
  std::vector<ZeroParam> list;
  for (const py::handle item : params) list.push_back(param_of(item, list.size(), keep));
  absl::StatusOr<std::unique_ptr<ZeroEngine>> engine;
  {
    py::gil_scoped_release unlocked;
    engine = ZeroEngine::create(rt->runtime(), *comm->comm, list, std::move(o));
  }
  return std::make_shared<PyZeroEngine>(rt, comm, check(std::move(engine)));
}

// A parameter named by its name or its id.
ZeroParamId param_id(const PyZeroEngine& e, const py::handle& p) {
  if (py::isinstance<py::str>(p)) return check(e.engine->find(p.cast<std::string>()));
  if (py::isinstance<py::int_>(p)) {
    const auto id = p.cast<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(e.engine->param_count())) {
      raise(absl::StatusCode::kInvalidArgument, "parameter id " + std::to_string(id) +
                                                    " is not a parameter of this engine (it has " +
                                                    std::to_string(e.engine->param_count()) + ")");
    }
    return ZeroParamId{static_cast<uint32_t>(id)};
  }
  raise(absl::StatusCode::kInvalidArgument,
        "a parameter is named by its name (str) or id (int), not a " + type_name(p));
}

const ZeroLayoutParam& layout_param(const PyZeroEngine& e, ZeroParamId id) {
  return e.engine->layout().params()[id.index];
}

py::tuple shape_tuple(const ZeroLayoutParam& p) { return py::tuple(py::cast(p.shape)); }

// The parameter's value widened to fp32, shaped.
py::array_t<float> read_param(PyZeroEngine& e, const py::handle& p) {
  const ZeroParamId id = param_id(e, p);
  const ZeroLayoutParam& lp = layout_param(e, id);
  py::array_t<float> out(std::vector<py::ssize_t>(lp.shape.begin(), lp.shape.end()));
  float* dst = out.mutable_data();
  const ParamType type = e.engine->options().param_type;
  unlocked_check([&]() -> absl::Status {
    Stream& stream = e.rt->stream();
    absl::StatusOr<void*> data = e.engine->acquire_param(id, TierKind::kCpu, stream);
    if (!data.ok()) return data.status();
    absl::Status status = e.rt->device().synchronize(stream);
    if (status.ok()) {
      for (uint64_t i = 0; i < lp.count; ++i) {
        switch (type) {
          case ParamType::kF32:
            dst[i] = static_cast<const float*>(*data)[i];
            break;
          case ParamType::kF16:
            dst[i] = half_to_float(static_cast<const uint16_t*>(*data)[i]);
            break;
          case ParamType::kBF16:
            dst[i] = bf16_to_float(static_cast<const uint16_t*>(*data)[i]);
            break;
        }
      }
    }
    absl::Status released = e.engine->release_param(id, stream);
    return status.ok() ? released : status;
  });
  return out;
}

// A DLPack-able Acquisition of the parameter (its own shape and dtype, zero copy).
std::shared_ptr<Acquisition> acquire_param(PyZeroEngine& e, const py::handle& p,
                                           const std::string& tier_text,
                                           const std::string& mode_text) {
  const ZeroParamId id = param_id(e, p);
  const TierKind tier = parse_tier(tier_text, /*allow_nvme=*/false);
  const AccessMode mode = parse_mode(mode_text);
  const ZeroLayoutParam& lp = layout_param(e, id);
  const ZeroTensorView view = check(e.engine->param_view(id));
  const DType& dtype = dtype_of(e.engine->options().param_type);
  auto tensor =
      std::make_shared<PyTensor>(e.rt, view.tensor, lp.name, lp.shape, dtype,
                                 lp.count * dtype.itemsize, e.engine->options().param_home);
  tensor->engine_view = true;
  PyRuntime& rt = *e.rt;
  absl::StatusOr<void*> data;
  std::unique_ptr<Event> ready;
  {
    py::gil_scoped_release unlocked;
    data = e.engine->acquire_param(id, tier, rt.stream(), mode);
    if (data.ok() && tier == TierKind::kGpu) {
      // As Tensor.acquire(): consumers wait on this event at __dlpack__, not the host here.
      absl::StatusOr<std::unique_ptr<Event>> event = rt.device().create_event();
      absl::Status recorded = event.status();
      if (recorded.ok()) recorded = rt.device().record(**event, rt.stream());
      if (recorded.ok()) {
        ready = *std::move(event);
      } else {
        (void)e.engine->release_param(id, rt.stream());
        data = recorded;
      }
    }
  }
  void* address = check(std::move(data));
  tensor->acquired++;
  return std::make_shared<Acquisition>(tensor, address, tier, mode, std::move(ready));
}

// Adds `g` (count values) into a gradient buffer of `type`, each element rounded once.
void add_into(void* buffer, GradType type, const float* g, uint64_t count) {
  switch (type) {
    case GradType::kF32: {
      auto* b = static_cast<float*>(buffer);
      for (uint64_t i = 0; i < count; ++i) b[i] += g[i];
      break;
    }
    case GradType::kF16: {
      auto* b = static_cast<uint16_t*>(buffer);
      for (uint64_t i = 0; i < count; ++i) b[i] = float_to_half(half_to_float(b[i]) + g[i]);
      break;
    }
    case GradType::kBF16: {
      auto* b = static_cast<uint16_t*>(buffer);
      for (uint64_t i = 0; i < count; ++i) b[i] = float_to_bf16(bf16_to_float(b[i]) + g[i]);
      break;
    }
  }
}

void add_grad(PyZeroEngine& e, const py::handle& p, const py::handle& gradient) {
  const ZeroParamId id = param_id(e, p);
  const ZeroLayoutParam& lp = layout_param(e, id);
  const FloatArray g = float_array(gradient);
  if (static_cast<uint64_t>(g.size()) != lp.count) {
    raise(absl::StatusCode::kInvalidArgument,
          "add_grad: parameter '" + lp.name + "' has " + std::to_string(lp.count) +
              " elements; the gradient has " + std::to_string(g.size()));
  }
  const float* src = g.data();
  const GradType type = e.engine->options().grad_type;
  unlocked_check([&]() -> absl::Status {
    Stream& stream = e.rt->stream();
    absl::StatusOr<void*> buffer = e.engine->acquire_grad(id, TierKind::kCpu, stream);
    if (!buffer.ok()) return buffer.status();
    // The buffer is the host's once the stream has caught up (as after Tensor.acquire).
    if (absl::Status s = e.rt->device().synchronize(stream); !s.ok()) return s;
    add_into(*buffer, type, src, lp.count);
    return e.engine->grad_ready(id, stream);
  });
}

py::dict by_tier(const std::array<uint64_t, 3>& bytes) {
  py::dict d;
  for (size_t t = 0; t < bytes.size(); ++t)
    d[py::str(tier_name(static_cast<TierKind>(t)))] = bytes[t];
  return d;
}

py::dict memory_dict(const ZeroMemory& m) {
  py::dict d;
  d["params"] = by_tier(m.params);
  d["grads"] = by_tier(m.grads);
  d["optimizer_states"] = by_tier(m.optimizer_states);
  d["buckets"] = by_tier(m.buckets);
  d["model_states"] = m.model_states();
  return d;
}

py::dict stats_dict(const ZeroStats& s) {
  py::dict d;
  d["steps"] = s.steps;
  d["micro_steps"] = s.micro_steps;
  d["reduce_scatters"] = s.reduce_scatters;
  d["all_gathers"] = s.all_gathers;
  d["last_step_comm_bytes"] = s.last_step_comm_bytes;
  d["last_step_ns"] = s.last_step_ns;
  d["last_step_wait_ns"] = s.last_step_wait_ns;
  d["last_optimizer_ns"] = s.last_optimizer_ns;
  d["last_gather_ns"] = s.last_gather_ns;
  return d;
}

py::dict layout_dict(const ZeroLayout& l) {
  py::dict d;
  d["ranks"] = l.ranks();
  d["alignment"] = l.alignment();
  d["groups"] = l.groups().size();
  d["elements"] = l.elements();
  d["padded_elements"] = l.padded_elements();
  d["shard_elements"] = l.shard_elements();
  return d;
}

std::string directory_of(const py::object& directory) {
  return py::str(py::module_::import("os").attr("fspath")(directory)).cast<std::string>();
}

}  // namespace

void bind_zero(py::module_& m) {
  const ZeroOptions d;
  const OffloadOptimizerOptions& od = d.optimizer;
  py::class_<PyZeroEngine, std::shared_ptr<PyZeroEngine>>(m, "ZeroEngine", R"doc(
ZeRO-DP stages 1 and 2 over strata's tiers: each of the communicator's ranks keeps the fp32
master weights and Adam moments of 1/N of the parameters (stage 1), and only the reduced
gradients of that slice (stage 2). Every rank creates it with the same parameters and options
and adds the gradients of the same parameters in the same order.)doc")
      .def(py::init(&make_engine), py::arg("runtime"), py::arg("comm"), py::arg("params"),
           py::arg("stage") = d.stage, py::arg("param_dtype") = "float16",
           py::arg("grad_dtype") = "float16", py::arg("bucket_bytes") = d.bucket_bytes,
           py::arg("gradient_buckets") = d.gradient_buckets, py::arg("alignment") = d.alignment,
           py::arg("param_home") = "gpu", py::arg("accumulation_steps") = d.accumulation_steps,
           py::arg("state_home") = "cpu", py::arg("lr") = od.defaults.lr,
           py::arg("betas") = std::pair<float, float>(od.defaults.beta1, od.defaults.beta2),
           py::arg("eps") = od.defaults.eps, py::arg("weight_decay") = od.defaults.weight_decay,
           py::arg("decoupled") = od.defaults.decoupled,
           py::arg("max_grad_norm") = od.max_grad_norm,
           py::arg("loss_scale") = od.loss_scaling.scale,
           py::arg("dynamic_loss_scale") = od.loss_scaling.dynamic,
           py::arg("skip_on_overflow") = od.skip_on_overflow,
           py::arg("chunk_elements") = od.chunk_elements, py::arg("groups") = py::none(),
           R"doc(
params: [(name, shape), (name, shape, initial), (name, shape, initial, group), ...]; initial is
fp32 values (numpy, torch, any buffer; None: zeros), the same on every rank; group indexes
`groups`, a list of dicts of lr/betas/eps/weight_decay/decoupled over the defaults (None: one
group of the keyword defaults). bucket_bytes: an int or a size ("32MiB").)doc")
      .def(
          "find",
          [](PyZeroEngine& e, const std::string& name) {
            return static_cast<int64_t>(check(e.engine->find(name)).index);
          },
          py::arg("name"))
      .def("__len__", [](PyZeroEngine& e) { return e.engine->param_count(); })
      .def_property_readonly("params",
                             [](PyZeroEngine& e) {
                               py::list names;
                               for (const ZeroLayoutParam& p : e.engine->layout().params()) {
                                 names.append(p.name);
                               }
                               return names;
                             })
      .def(
          "param_info",
          [](PyZeroEngine& e, const py::handle& p) {
            const ZeroLayoutParam& lp = layout_param(e, param_id(e, p));
            py::dict info;
            info["name"] = lp.name;
            info["shape"] = shape_tuple(lp);
            info["count"] = lp.count;
            info["group"] = lp.adam_group;
            return info;
          },
          py::arg("param"))
      .def("read_param", &read_param, py::arg("param"),
           "A copy of the parameter's value as a float32 numpy array of its shape.")
      .def("acquire_param", &acquire_param, py::arg("param"), py::arg("tier") = "cpu",
           py::arg("mode") = "r",
           "The parameter's memory (its shape and param dtype) as an Acquisition, as "
           "Tensor.acquire() gives: a DLPack view until release() or the end of the `with`.")
      .def("add_grad", &add_grad, py::arg("param"), py::arg("gradient"),
           "Adds this micro-step's gradient of the parameter (numpy, torch; its element count) "
           "into the engine's buffer, rounded to grad_dtype, and marks it ready.")
      .def("step",
           [](PyZeroEngine& e) {
             absl::StatusOr<StepResult> result;
             {
               py::gil_scoped_release unlocked;
               result = e.engine->step();
             }
             return step_result_dict(check(std::move(result)));
           })
      .def("zero_grad",
           [](PyZeroEngine& e) { unlocked_check([&] { return e.engine->zero_grad(); }); })
      .def(
          "save",
          [](PyZeroEngine& e, const py::object& directory) {
            const std::string dir = directory_of(directory);
            unlocked_check([&] { return e.engine->save(dir); });
          },
          py::arg("directory"), "Collective: every rank calls it with the same directory.")
      .def(
          "load",
          [](PyZeroEngine& e, const py::object& directory) {
            const std::string dir = directory_of(directory);
            unlocked_check([&] { return e.engine->load(dir); });
          },
          py::arg("directory"),
          "Collective: loads a checkpoint saved at any world size for the same parameters.")
      .def(
          "read_state",
          [](PyZeroEngine& e, const py::handle& p) {
            const ZeroParamId id = param_id(e, p);
            const ZeroLayoutParam& lp = layout_param(e, id);
            const std::vector<py::ssize_t> shape(lp.shape.begin(), lp.shape.end());
            py::array_t<float> master(shape), exp_avg(shape), exp_avg_sq(shape);
            const auto n = static_cast<size_t>(lp.count);
            std::span<float> a(master.mutable_data(), n);
            std::span<float> b(exp_avg.mutable_data(), n);
            std::span<float> c(exp_avg_sq.mutable_data(), n);
            unlocked_check([&] { return e.engine->read_state(id, a, b, c); });
            return py::make_tuple(master, exp_avg, exp_avg_sq);
          },
          py::arg("param"),
          "Collective: (master, exp_avg, exp_avg_sq) of the whole parameter, float32, shaped.")
      .def(
          "memory", [](PyZeroEngine& e) { return memory_dict(e.engine->memory()); },
          "This rank's model-state bytes by kind and tier, and model_states, their total.")
      .def("stats", [](PyZeroEngine& e) { return stats_dict(e.engine->stats()); })
      .def("layout", [](PyZeroEngine& e) { return layout_dict(e.engine->layout()); })
      .def_property_readonly("stage", [](PyZeroEngine& e) { return e.engine->options().stage; })
      .def_property_readonly("loss_scale",
                             [](PyZeroEngine& e) { return e.engine->optimizer().loss_scale(); })
      .def_property_readonly("step_count",
                             [](PyZeroEngine& e) { return e.engine->optimizer().step_count(); })
      .def_property_readonly("runtime", [](PyZeroEngine& e) { return e.rt; })
      .def_property_readonly("communicator", [](PyZeroEngine& e) { return e.comm; });
}

}  // namespace strata::python
