#include "zero.h"

#include <pybind11/stl.h>

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "acquisition.h"
#include "errors.h"
#include "float16.h"
#include "host_array.h"
#include "names.h"
#include "optimizer.h"
#include "stats.h"
#include "strata/base/size.h"
#include "stream.h"
#include "tensor.h"
#include "zero_options.h"

namespace py = pybind11;

namespace strata::python {
namespace {

std::string type_name(const py::handle& value) {
  return py::str(py::type::of(value).attr("__name__")).cast<std::string>();
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

// One (name, shape[, initial[, group]]) entry; `keep` holds the initial values readable.
ZeroParam param_of(const py::handle& item, size_t i,
                   std::vector<std::unique_ptr<Float32Values>>& keep) {
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
  if (entry.size() >= 3 && PyCallable_Check(entry[2].ptr()) != 0) {
    // initial() is called when the engine sets up the parameter's group: the caller's values
    // for one group at a time, never the whole model's.
    param.fill = [fn = py::reinterpret_borrow<py::object>(entry[2]),
                  what = where + " ('" + param.name + "') initial()"](std::span<float> out) {
      py::gil_scoped_acquire gil;
      try {
        const Float32Values values(fn(), what, out.size(), "the shape's element count");
        std::copy(values.span().begin(), values.span().end(), out.begin());
        return absl::OkStatus();
      } catch (const std::exception& e) {  // a Python error, or a refused array
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what()));
      }
    };
  } else if (entry.size() >= 3 && !entry[2].is_none()) {
    uint64_t count = 1;
    for (int64_t d : param.shape) count *= d > 0 ? static_cast<uint64_t>(d) : 0;
    keep.push_back(std::make_unique<Float32Values>(
        entry[2], where + " ('" + param.name + "') initial", count, "the shape's element count"));
    param.initial = keep.back()->span();
  }
  return param;
}

std::shared_ptr<PyZeroEngine> make_engine(const std::shared_ptr<PyRuntime>& rt,
                                          const std::shared_ptr<PyCommunicator>& comm,
                                          const py::iterable& params, const py::object& options,
                                          const py::kwargs& fields) {
  if (comm->rt != nullptr && comm->rt != rt) {
    raise(absl::StatusCode::kInvalidArgument,
          "the Communicator was created with another Runtime than the engine's: create it with "
          "Communicator.from_environment(runtime)");
  }
  ZeroOptions o = zero_options_from(options, fields);
  std::vector<std::unique_ptr<Float32Values>> keep;
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
py::object read_param(PyZeroEngine& e, const py::handle& p) {
  const ZeroParamId id = param_id(e, p);
  const ZeroLayoutParam& lp = layout_param(e, id);
  auto out = std::make_shared<HostBuffer>(dtype_named("float32"), lp.shape);
  auto* dst = static_cast<float*>(out->data());
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
  return to_python(std::move(out));
}

// A PyTensor that describes a parameter's memory for an Acquisition (its shape and `dtype`);
// `handle` is its group tensor where it has a view, else none (stage 3's gathered copy, a
// gradient buffer): either way acquire, prefetch, evict and destroy are refused.
std::shared_ptr<PyTensor> engine_tensor(PyZeroEngine& e, ZeroParamId id, const DType& dtype,
                                        const std::string& suffix) {
  const ZeroLayoutParam& lp = layout_param(e, id);
  TensorHandle handle;
  if (suffix.empty()) {
    if (absl::StatusOr<ZeroTensorView> view = e.engine->param_view(id); view.ok()) {
      handle = view->tensor;
    }
  }
  auto tensor =
      std::make_shared<PyTensor>(e.rt, handle, lp.name + suffix, lp.shape, dtype,
                                 lp.count * dtype.itemsize, e.engine->options().param_home);
  tensor->engine_view = true;
  return tensor;
}

// The stream an engine acquisition is made for: the consumer's (`stream` as __dlpack__ takes
// it: a strata.Stream, a torch.cuda.Stream, a handle), which the engine then orders after its
// own work directly; or, for None, strata's stream with a ready event for the consumers.
// Returns null for None.
Stream* consumer_stream(PyRuntime& rt, const py::handle& stream, TierKind tier, const char* what) {
  const StreamChoice choice = parse_stream(rt, stream, what);
  if (choice.kind == StreamChoice::kNoSync) {
    raise(absl::StatusCode::kInvalidArgument,
          std::string(what) +
              ": stream=-1 cannot be ordered after the engine's work; pass the "
              "stream that will use the memory, or None");
  }
  if (choice.kind != StreamChoice::kHandle || tier != TierKind::kGpu) return nullptr;
  return check(rt.external_stream(choice.handle));
}

// A DLPack-able Acquisition of the parameter (its own shape and dtype, zero copy); released
// through the engine (stage 3: the gathered group may then be dropped).
std::shared_ptr<Acquisition> acquire_param(const std::shared_ptr<PyZeroEngine>& engine,
                                           const py::handle& p, const std::string& tier_text,
                                           const std::string& mode_text,
                                           const py::handle& stream_arg) {
  PyZeroEngine& e = *engine;
  const ZeroParamId id = param_id(e, p);
  const TierKind tier = parse_tier(tier_text, /*allow_nvme=*/false);
  const AccessMode mode = parse_mode(mode_text);
  auto tensor = engine_tensor(e, id, dtype_of(e.engine->options().param_type), "");
  PyRuntime& rt = *e.rt;
  Stream* consumer = consumer_stream(rt, stream_arg, tier, "acquire_param");
  Stream& on = consumer != nullptr ? *consumer : rt.stream();
  absl::StatusOr<void*> data;
  std::unique_ptr<Event> ready;
  {
    py::gil_scoped_release unlocked;
    data = e.engine->acquire_param(id, tier, on, mode);
    // The consumer's stream is ordered by the engine itself; strata's stream gets an event
    // that consumers wait on at __dlpack__.
    if (data.ok() && tier == TierKind::kGpu && consumer == nullptr) {
      absl::StatusOr<std::unique_ptr<Event>> event = ready_event(rt);
      if (event.ok()) {
        ready = *std::move(event);
      } else {
        (void)e.engine->release_param(id, rt.stream());
        data = event.status();
      }
    }
  }
  void* address = check(std::move(data));
  tensor->acquired++;
  auto acquisition = std::make_shared<Acquisition>(tensor, address, tier, mode, std::move(ready));
  if (consumer != nullptr) {
    acquisition->consumers.push_back(parse_stream(rt, stream_arg, "acquire_param").handle);
  }
  acquisition->release_with = [engine, id](Stream& stream) {
    return engine->engine->release_param(id, stream);
  };
  return acquisition;
}

const DType& dtype_of(GradType type) {
  return dtype_of(type == GradType::kF32   ? ParamType::kF32
                  : type == GradType::kF16 ? ParamType::kF16
                                           : ParamType::kBF16);
}

// This micro-step's gradient buffer of the parameter as a writable Acquisition (the parameter's
// shape, grad dtype): add the gradient into it; its release marks the gradient ready
// (grad_ready, ordered after the work on the releasing stream).
std::shared_ptr<Acquisition> acquire_grad(const std::shared_ptr<PyZeroEngine>& engine,
                                          const py::handle& p, const std::string& tier_text,
                                          const py::handle& stream_arg) {
  PyZeroEngine& e = *engine;
  const ZeroParamId id = param_id(e, p);
  const TierKind tier = parse_tier(tier_text, /*allow_nvme=*/false);
  auto tensor = engine_tensor(e, id, dtype_of(e.engine->options().grad_type), ".grad");
  PyRuntime& rt = *e.rt;
  Stream* consumer = consumer_stream(rt, stream_arg, tier, "acquire_grad");
  Stream& on = consumer != nullptr ? *consumer : rt.stream();
  absl::StatusOr<void*> data;
  std::unique_ptr<Event> ready;
  {
    py::gil_scoped_release unlocked;
    data = e.engine->acquire_grad(id, tier, on);
    // The buffer may still be read by the previous reduce-scatter's copies on the stream: the
    // consumer's stream is ordered by the engine; other GPU-tier consumers wait on an event;
    // the CPU tier's (the host) wait here.
    absl::Status status = data.status();
    if (status.ok() && tier == TierKind::kGpu && consumer == nullptr) {
      absl::StatusOr<std::unique_ptr<Event>> event = ready_event(rt);
      status = event.status();
      if (event.ok()) ready = *std::move(event);
    } else if (status.ok() && tier != TierKind::kGpu) {
      status = rt.device().synchronize(rt.stream());
    }
    if (data.ok() && !status.ok()) {
      (void)e.engine->grad_ready(id, rt.stream());
      data = status;
    }
  }
  void* address = check(std::move(data));
  tensor->acquired++;
  auto acquisition =
      std::make_shared<Acquisition>(tensor, address, tier, AccessMode::kWrite, std::move(ready));
  if (consumer != nullptr) {
    acquisition->consumers.push_back(parse_stream(rt, stream_arg, "acquire_grad").handle);
  }
  acquisition->release_with = [engine, id](Stream& stream) {
    return engine->engine->grad_ready(id, stream);
  };
  return acquisition;
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
  const Float32Values g(gradient, "add_grad: parameter '" + lp.name + "': gradient", lp.count,
                        "the parameter's element count");
  const float* src = g.span().data();
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
  d["gathered"] = m.gathered;
  d["retiring"] = m.retiring;
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
  d["fetches"] = s.fetches;
  d["gathers_on_demand"] = s.gathers_on_demand;
  d["gathers_prefetched"] = s.gathers_prefetched;
  d["prefetch_late"] = s.prefetch_late;
  d["reuses"] = s.reuses;
  d["gathers_dropped_unused"] = s.gathers_dropped_unused;
  d["order_changes"] = s.order_changes;
  d["gathered_bytes"] = s.gathered_bytes;
  d["retiring_bytes"] = s.retiring_bytes;
  d["gathered_peak_bytes"] = s.gathered_peak_bytes;
  d["fetch_wait_ns"] = s.fetch_wait_ns;
  d["bucket_wait_ns"] = s.bucket_wait_ns;
  d["global_gather_bytes"] = s.global_gather_bytes;
  d["node_gather_bytes"] = s.node_gather_bytes;
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
  bind_zero_options(m);
  py::class_<PyZeroEngine, std::shared_ptr<PyZeroEngine>>(m, "ZeroEngine", R"doc(
ZeRO-DP stages 1, 2 and 3 over strata's tiers: each of the communicator's ranks keeps the fp32
master weights and Adam moments of 1/N of the parameters (stage 1), only the reduced gradients of
that slice (stage 2), and only its shard of the parameters (stage 3: acquire_param gathers a
parameter's group for its use, ahead of need along the recorded order). Every rank creates it
with the same parameters and options and makes the same acquire/release/gradient calls in the
same order (they are collectives).)doc")
      .def(py::init(&make_engine), py::arg("runtime"), py::arg("comm"), py::arg("params"),
           py::arg("options") = py::none(),
           R"doc(
params: [(name, shape), (name, shape, initial), (name, shape, initial, group), ...]; initial is
float32 values (numpy, torch CPU, array.array('f'), any buffer; float16 and bfloat16 are widened,
other types refused; None: zeros), the same on every rank, or a callable returning them,
called once while the engine sets up the parameter's group (so that the whole model's values
never exist at once: meta-device models); group indexes options.groups.
options: a strata.ZeroOptions (None: the defaults); keyword fields set over it: any ZeroOptions
field (stage=3, bucket_bytes="4MiB", param_home="cpu", ...) and the optimizer's by their short
names (lr, betas, eps, weight_decay, decoupled, max_grad_norm, skip_on_overflow,
chunk_elements, state_home, loss_scale, dynamic_loss_scale, groups: a list of AdamGroup or of
dicts over the defaults). The engine's options are engine.options (a copy).)doc")
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
            // Stage 3: whole on every rank (below persist_below_bytes), or partitioned.
            info["partitioned"] = e.engine->options().stage == 3 && !lp.persistent;
            return info;
          },
          py::arg("param"))
      .def("read_param", &read_param, py::arg("param"),
           "A copy of the parameter's value as a float32 numpy array of its shape (a memoryview "
           "without numpy).")
      .def("acquire_param", &acquire_param, py::arg("param"), py::arg("tier") = "cpu",
           py::arg("mode") = "r", py::arg("stream") = py::none(),
           "The parameter's memory (its shape and param dtype) as an Acquisition, as "
           "Tensor.acquire() gives: a DLPack view until release() or the end of the `with`. "
           "`stream` (GPU tier; as __dlpack__ takes it, e.g. torch.cuda.current_stream()): the "
           "stream that will use the memory, which the engine orders after its gather or copy "
           "directly (no event, no host wait; release() then defaults to it); None: strata's "
           "stream, and consumers wait on an event at __dlpack__. "
           "Stage 3 gathers the parameter's group (a collective) and the view is read-only: "
           "mode 'w' is refused, and writes through it are lost when the group is dropped "
           "(and may differ between ranks). Release every parameter before step().")
      .def("acquire_grad", &acquire_grad, py::arg("param"), py::arg("tier") = "cpu",
           py::arg("stream") = py::none(),
           "This micro-step's gradient buffer of the parameter (its shape, grad dtype) as a "
           "writable Acquisition (`stream`: as acquire_param's): add (+=) the gradient into it "
           "through DLPack; its release "
           "(or the end of the `with`) marks the gradient ready, ordered after the work on the "
           "stream given to release() (or seen at __dlpack__). A group whose every gradient is "
           "ready is reduce-scattered at once.")
      .def(
          "set_fetch_order",
          [](PyZeroEngine& e, const py::iterable& order) {
            std::vector<ZeroParamId> ids;
            for (const py::handle p : order) ids.push_back(param_id(e, p));
            unlocked_check([&] { return e.engine->set_fetch_order(ids); });
          },
          py::arg("order"),
          "Stage 3: the parameters (names or ids) in the order the next steps use them, repeats "
          "allowed (forward, then backward), replacing the recorded order; every rank gives the "
          "same.")
      .def("add_grad", &add_grad, py::arg("param"), py::arg("gradient"),
           "Adds this micro-step's gradient of the parameter (float32, or float16/bfloat16 "
           "widened; numpy, torch CPU or any buffer of its element count) "
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
          "group",
          [](PyZeroEngine& e, uint32_t g) { return group_dict(check(e.engine->group(g))); },
          py::arg("group") = 0,
          "The hyper-parameter group's settings now: {lr, betas, eps, weight_decay, decoupled}.")
      .def(
          "set_group",
          [](PyZeroEngine& e, uint32_t group, const py::kwargs& kwargs) {
            AdamGroup g = check(e.engine->group(group));
            apply_group_kwargs(g, kwargs);
            unlocked_check([&] { return e.engine->set_group(group, g); });
          },
          py::arg("group") = 0,
          "Changes a hyper-parameter group (keywords lr, betas, eps, weight_decay, decoupled) "
          "for the steps to come; every rank calls it with the same values, between step() "
          "and the next backward.")
      .def(
          "set_lr",
          [](PyZeroEngine& e, float lr, uint32_t group) {
            AdamGroup g = check(e.engine->group(group));
            g.lr = lr;
            unlocked_check([&] { return e.engine->set_group(group, g); });
          },
          py::arg("lr"), py::arg("group") = 0,
          "set_group(group, lr=lr): a learning-rate schedule's call, on every rank, between "
          "step() and the next backward.")
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
            const DType& f32 = dtype_named("float32");
            auto master = std::make_shared<HostBuffer>(f32, lp.shape);
            auto exp_avg = std::make_shared<HostBuffer>(f32, lp.shape);
            auto exp_avg_sq = std::make_shared<HostBuffer>(f32, lp.shape);
            const auto n = static_cast<size_t>(lp.count);
            std::span<float> a(static_cast<float*>(master->data()), n);
            std::span<float> b(static_cast<float*>(exp_avg->data()), n);
            std::span<float> c(static_cast<float*>(exp_avg_sq->data()), n);
            unlocked_check([&] { return e.engine->read_state(id, a, b, c); });
            return py::make_tuple(to_python(master), to_python(exp_avg), to_python(exp_avg_sq));
          },
          py::arg("param"),
          "Collective: (master, exp_avg, exp_avg_sq) of the whole parameter, float32, shaped.")
      .def(
          "memory", [](PyZeroEngine& e) { return memory_dict(e.engine->memory()); },
          "This rank's model-state bytes by kind and tier, and model_states, their total.")
      .def("stats", [](PyZeroEngine& e) { return stats_dict(e.engine->stats()); })
      .def(
          "optimizer_stats",
          [](PyZeroEngine& e) { return optimizer_stats(e.engine->optimizer().stats()); },
          "This rank's optimizer's statistics (OffloadOptimizer.stats()): with "
          "options.optimizer.overlap, last_step_ns is the step's time exposed after backward.")
      .def(
          "wait_for_early_steps",
          [](PyZeroEngine& e) {
            py::gil_scoped_release unlocked;
            e.engine->optimizer().wait_for_early_steps();
          },
          "Overlap: blocks until this rank's early steps queued so far have run (tests and "
          "benchmarks; training never needs it).")
      .def("layout", [](PyZeroEngine& e) { return layout_dict(e.engine->layout()); })
      .def_property_readonly("stage", [](PyZeroEngine& e) { return e.engine->options().stage; })
      .def_property_readonly(
          "options", [](PyZeroEngine& e) { return e.engine->options(); },
          "A copy of the ZeroOptions the engine was created with.")
      .def_property_readonly("loss_scale",
                             [](PyZeroEngine& e) { return e.engine->optimizer().loss_scale(); })
      .def_property_readonly("step_count",
                             [](PyZeroEngine& e) { return e.engine->optimizer().step_count(); })
      .def_property_readonly("runtime", [](PyZeroEngine& e) { return e.rt; })
      .def_property_readonly("communicator", [](PyZeroEngine& e) { return e.comm; });
}

}  // namespace strata::python
