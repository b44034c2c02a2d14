#include "optimizer.h"

#include <pybind11/stl.h>

#include <optional>
#include <span>
#include <string>
#include <utility>

#include "errors.h"
#include "host_array.h"
#include "names.h"
#include "stats.h"
#include "tensor.h"

namespace py = pybind11;

namespace strata::python {
namespace {

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

// overlap=: False/None (off), True (on, no cap of its own) or a strata.OverlapOptions.
OverlapOptions overlap_options(const py::object& overlap) {
  if (overlap.is_none()) return {};
  if (py::isinstance<py::bool_>(overlap)) return {.enabled = overlap.cast<bool>()};
  if (py::isinstance<OverlapOptions>(overlap)) return overlap.cast<OverlapOptions>();
  raise(absl::StatusCode::kInvalidArgument,
        "overlap=" + py::repr(overlap).cast<std::string>() +
            ": use True, False or a strata.OverlapOptions(enabled=..., max_host_bytes=...)");
}

// A landing's completion hint: None (set_final_micro_step's setting), 'final' or 'more'.
GradCompletion completion_of(const py::object& completion) {
  if (completion.is_none()) return GradCompletion::kOptimizerDefault;
  if (py::isinstance<py::str>(completion)) {
    const auto text = completion.cast<std::string>();
    if (text == "final") return GradCompletion::kFinal;
    if (text == "more") return GradCompletion::kMore;
  }
  raise(absl::StatusCode::kInvalidArgument,
        "completion=" + py::repr(completion).cast<std::string>() +
            ": use 'final' (the step's last landing of this gradient), 'more' (a micro-step "
            "that later landings add to) or None (set_final_micro_step's setting)");
}

std::shared_ptr<PyOptimizer> make_optimizer(const std::shared_ptr<PyRuntime>& rt,
                                            const std::string& state_home, float lr,
                                            std::pair<float, float> betas, float eps,
                                            float weight_decay, bool decoupled, float max_grad_norm,
                                            float loss_scale, bool dynamic_loss_scale,
                                            bool skip_on_overflow, uint64_t chunk_elements,
                                            const py::object& overlap) {
  OffloadOptimizerOptions o;
  o.state_home = parse_tier(state_home, /*allow_nvme=*/true);
  o.defaults = {.lr = lr,
                .beta1 = betas.first,
                .beta2 = betas.second,
                .eps = eps,
                .weight_decay = weight_decay,
                .decoupled = decoupled};
  o.max_grad_norm = max_grad_norm;
  o.skip_on_overflow = skip_on_overflow;
  o.loss_scaling.scale = loss_scale;
  o.loss_scaling.dynamic = dynamic_loss_scale;
  o.chunk_elements = chunk_elements;
  o.overlap = overlap_options(overlap);
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
  std::optional<Float32Values> master;  // keeps the values readable until add_param copied them
  if (!initial_master.is_none()) {
    master.emplace(initial_master, "parameter '" + name + "': initial_master", spec.count,
                   "the parameter's element count");
    spec.initial_master = master->span();
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

}  // namespace

py::dict group_dict(const AdamGroup& g) {
  py::dict d;
  d["lr"] = g.lr;
  d["betas"] = py::make_tuple(g.beta1, g.beta2);
  d["eps"] = g.eps;
  d["weight_decay"] = g.weight_decay;
  d["decoupled"] = g.decoupled;
  return d;
}

void apply_group_kwargs(AdamGroup& g, const py::dict& kwargs) {
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

py::dict step_result_dict(const StepResult& r) {
  py::dict d;
  d["skipped"] = r.skipped;
  d["grad_norm"] = r.grad_norm;
  d["clip_coef"] = r.clip_coef;
  d["params_updated"] = r.params_updated;
  d["step"] = r.step;
  d["loss_scale"] = r.loss_scale;
  d["early_elements"] = r.early_elements;
  d["rolled_back"] = r.rolled_back;
  return d;
}

void bind_optimizer(py::module_& m) {
  py::class_<PyOptimizer, std::shared_ptr<PyOptimizer>>(m, "OffloadOptimizer", R"doc(
ZeRO-Offload's optimizer: fp32 master weights and Adam moments in the CPU tier (or on NVMe),
the Adam step on the CPU, gradients handed over as backward produces them (grad_ready).)doc")
      .def(py::init(&make_optimizer), py::arg("runtime"), py::arg("state_home") = "cpu",
           py::arg("lr") = 1e-3F, py::arg("betas") = std::pair<float, float>(0.9F, 0.999F),
           py::arg("eps") = 1e-8F, py::arg("weight_decay") = 0.0F, py::arg("decoupled") = true,
           py::arg("max_grad_norm") = 0.0F, py::arg("loss_scale") = 1.0F,
           py::arg("dynamic_loss_scale") = false, py::arg("skip_on_overflow") = true,
           py::arg("chunk_elements") = 0, py::arg("overlap") = py::none(),
           "overlap: the overlapped step (True, or a strata.OverlapOptions with a cap on its "
           "host bytes): each parameter's Adam runs as its gradient is final, during backward; "
           "step() keeps the work or rolls it back; the result is bitwise the plain step's.")
      .def("add_param", &add_param, py::arg("name"), py::arg("param"), py::arg("grad"),
           py::arg("initial_master") = py::none(), py::arg("group") = 0,
           "Registers a parameter (its tensor and its gradient's, same element count) and "
           "returns its id. initial_master: the parameter's element count of float32 values (a "
           "numpy array, torch tensor, array.array('f') or any buffer; float16 and bfloat16 are "
           "widened, other types refused); None widens the parameter tensor's current "
           "contents.")
      .def("find_param",
           [](PyOptimizer& o, const std::string& name) {
             return static_cast<int64_t>(check(o.opt->find_param(name)).index);
           })
      .def(
          "grad_ready",
          [](PyOptimizer& o, int64_t id, const py::object& completion) {
            const ParamId pid = param_id(o, id);
            const GradCompletion c = completion_of(completion);
            unlocked_check([&] { return o.opt->grad_ready(pid, o.rt->stream(), c); });
          },
          py::arg("param"), py::arg("completion") = py::none(),
          "The parameter's gradient tensor holds its gradient (released): it is copied now, "
          "and accumulates with earlier ones since the last step. completion (overlap): "
          "'final' when this is the step's last landing of the gradient (its Adam may start), "
          "'more' for a micro-step that later ones add to, None for set_final_micro_step's "
          "setting. A wrong hint never changes the result, only wastes the early work.")
      .def(
          "set_final_micro_step",
          [](PyOptimizer& o, bool final) { o.opt->set_final_micro_step(final); }, py::arg("final"),
          "Overlap: whether landings without a completion hint complete this step's gradients "
          "(True, the default, set again by every step()) or belong to a micro-step that later "
          "ones add to (False).")
      .def(
          "wait_for_early_steps",
          [](PyOptimizer& o) {
            py::gil_scoped_release unlocked;
            o.opt->wait_for_early_steps();
          },
          "Blocks until every early step queued so far has run (tests and benchmarks that "
          "separate the early work from step()'s; training never needs it).")
      .def("zero_grad", [](PyOptimizer& o) { unlocked_check([&] { return o.opt->zero_grad(); }); })
      .def("step",
           [](PyOptimizer& o) {
             absl::StatusOr<StepResult> result;
             {
               py::gil_scoped_release unlocked;
               result = o.opt->step();
             }
             return step_result_dict(check(std::move(result)));
           })
      .def(
          "save",
          [](PyOptimizer& o, const py::object& directory) {
            const auto dir =
                py::str(py::module_::import("os").attr("fspath")(directory)).cast<std::string>();
            unlocked_check([&] { return o.opt->save(dir); });
          },
          py::arg("directory"))
      .def(
          "load",
          [](PyOptimizer& o, const py::object& directory) {
            const auto dir =
                py::str(py::module_::import("os").attr("fspath")(directory)).cast<std::string>();
            unlocked_check([&] { return o.opt->load(dir); });
          },
          py::arg("directory"))
      .def(
          "read_state",
          [](PyOptimizer& o, int64_t id) {
            const ParamId pid = param_id(o, id);
            const auto n = static_cast<int64_t>(o.counts[pid.index]);
            const DType& f32 = dtype_named("float32");
            auto master = std::make_shared<HostBuffer>(f32, std::vector<int64_t>{n});
            auto exp_avg = std::make_shared<HostBuffer>(f32, std::vector<int64_t>{n});
            auto exp_avg_sq = std::make_shared<HostBuffer>(f32, std::vector<int64_t>{n});
            const auto count = static_cast<size_t>(n);
            std::span<float> a(static_cast<float*>(master->data()), count);
            std::span<float> b(static_cast<float*>(exp_avg->data()), count);
            std::span<float> c(static_cast<float*>(exp_avg_sq->data()), count);
            unlocked_check([&] { return o.opt->read_state(pid, a, b, c); });
            return py::make_tuple(to_python(master), to_python(exp_avg), to_python(exp_avg_sq));
          },
          py::arg("param"),
          "(master, exp_avg, exp_avg_sq) as float32 numpy arrays (memoryviews without numpy).")
      .def(
          "write_state",
          [](PyOptimizer& o, int64_t id, const py::object& master, const py::object& exp_avg,
             const py::object& exp_avg_sq, uint64_t steps) {
            const ParamId pid = param_id(o, id);
            const uint64_t n = o.counts[pid.index];
            const std::string what = "parameter " + std::to_string(id) + ": ";
            const Float32Values master_values(master, what + "master", n,
                                              "the parameter's element count");
            const Float32Values exp_avg_values(exp_avg, what + "exp_avg", n,
                                               "the parameter's element count");
            const Float32Values exp_avg_sq_values(exp_avg_sq, what + "exp_avg_sq", n,
                                                  "the parameter's element count");
            unlocked_check([&] {
              return o.opt->write_state(pid, master_values.span(), exp_avg_values.span(),
                                        exp_avg_sq_values.span(), steps);
            });
          },
          py::arg("param"), py::arg("master"), py::arg("exp_avg"), py::arg("exp_avg_sq"),
          py::arg("steps"),
          "Replaces the parameter's fp32 state (three arrays of its element count, as read_state "
          "returns them) and its step count, then sets its tensor to the rounded master.")
      .def(
          "scaler_state",
          [](PyOptimizer& o) {
            const OffloadOptimizer::ScalerState st = o.opt->scaler_state();
            py::dict d;
            d["step"] = st.step;
            d["loss_scale"] = st.loss_scale;
            d["good_steps"] = st.good_steps;
            return d;
          },
          "The step counter and the loss scaler's state: {step, loss_scale, good_steps}.")
      .def(
          "set_scaler_state",
          [](PyOptimizer& o, uint64_t step, float loss_scale, uint64_t good_steps) {
            check(o.opt->set_scaler_state({step, loss_scale, good_steps}));
          },
          py::arg("step"), py::arg("loss_scale"), py::arg("good_steps"))
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

}  // namespace strata::python
