#include "zero_options.h"

#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "errors.h"
#include "names.h"
#include "optimizer.h"

namespace py = pybind11;

namespace strata::python {
namespace {

std::string repr_of(const py::handle& value) { return py::repr(value).cast<std::string>(); }

std::string text_of(double x) { return py::repr(py::float_(x)).cast<std::string>(); }

[[noreturn]] void bad_type(const std::string& field, const py::handle& value, const char* want) {
  throw py::type_error(field + "=" + repr_of(value) + " (" +
                       py::str(py::type::of(value).attr("__name__")).cast<std::string>() +
                       "): use " + want);
}

// A field's value checked for its C++ type: bool only from bool, integers from int (not bool)
// within [lo, hi], floats from int or float (finite). `field` ("ZeroOptions.stage") names it.
template <typename T>
T number(const py::handle& value, const std::string& field, T lo = std::numeric_limits<T>::lowest(),
         T hi = std::numeric_limits<T>::max()) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!py::isinstance<py::bool_>(value)) bad_type(field, value, "True or False");
    return value.cast<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value)) {
      bad_type(field, value, "an int");
    }
    const auto n = value.cast<py::int_>();
    // Through Python's own comparison: a huge int must not wrap on its way to int64.
    if (n < py::int_(lo) || n > py::int_(hi)) {
      raise(absl::StatusCode::kInvalidArgument, field + "=" + repr_of(value) + ": use " +
                                                    std::to_string(lo) + " to " +
                                                    std::to_string(hi));
    }
    return n.cast<T>();
  } else {
    if (py::isinstance<py::bool_>(value) ||
        !(py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value))) {
      bad_type(field, value, "a number");
    }
    const double x = value.cast<double>();
    if (!std::isfinite(x) || x < lo || x > hi) {
      raise(absl::StatusCode::kInvalidArgument, field + "=" + repr_of(value) +
                                                    ": use a finite number from " + text_of(lo) +
                                                    " to " + text_of(hi));
    }
    return static_cast<T>(x);
  }
}

template <typename C, typename T>
void number_field(py::class_<C>& cls, const char* cls_name, const char* name, T C::*member,
                  T lo = std::numeric_limits<T>::lowest(), T hi = std::numeric_limits<T>::max()) {
  const std::string field = std::string(cls_name) + "." + name;
  cls.def_property(
      name, [member](const C& c) { return c.*member; },
      [member, field, lo, hi](C& c, const py::handle& v) {
        c.*member = number<T>(v, field, lo, hi);
      });
}

// A byte count: an int or a size string ("32MiB").
template <typename C>
void size_field(py::class_<C>& cls, const char* cls_name, const char* name, uint64_t C::*member,
                bool allow_zero) {
  const std::string field = std::string(cls_name) + "." + name;
  cls.def_property(
      name, [member](const C& c) { return c.*member; },
      [member, field, allow_zero](C& c, const py::object& v) {
        if (py::isinstance<py::bool_>(v) ||
            !(py::isinstance<py::int_>(v) || py::isinstance<py::str>(v))) {
          bad_type(field, v, "a byte count (int) or a size ('32MiB')");
        }
        c.*member = size_arg(v, field.c_str(), allow_zero);
      });
}

// A tier by name: 'gpu' (unless !allow_gpu), 'cpu' or 'nvme'.
TierKind tier_of(const py::handle& value, const std::string& field, bool allow_gpu = true) {
  const char* choices = allow_gpu ? "'gpu', 'cpu' or 'nvme'" : "'cpu' or 'nvme'";
  if (!py::isinstance<py::str>(value)) bad_type(field, value, choices);
  const auto text = value.cast<std::string>();
  if ((text != "gpu" || !allow_gpu) && text != "cpu" && text != "nvme") {
    raise(absl::StatusCode::kInvalidArgument,
          field + "=" + repr_of(value) + ": use " + choices +
              (text == "gpu" ? " (the optimizer states live in the CPU tier or on NVMe)" : ""));
  }
  return parse_tier(text, /*allow_nvme=*/true);
}

std::string dtype_text(ParamType type) {
  return type == ParamType::kF32 ? "float32" : type == ParamType::kF16 ? "float16" : "bfloat16";
}

ParamType param_type_named(const py::handle& value, const std::string& field) {
  std::string name;
  try {
    name = parse_dtype(value).name;
  } catch (const py::error_already_set&) {
    name = "";
  }
  if (name == "float32") return ParamType::kF32;
  if (name == "float16") return ParamType::kF16;
  if (name == "bfloat16") return ParamType::kBF16;
  raise(absl::StatusCode::kInvalidArgument,
        field + "=" + repr_of(value) + ": use float32, float16 or bfloat16");
}

GradType grad_type_of(ParamType t) {
  return t == ParamType::kF32   ? GradType::kF32
         : t == ParamType::kF16 ? GradType::kF16
                                : GradType::kBF16;
}

ParamType param_type_of(GradType t) {
  return t == GradType::kF32   ? ParamType::kF32
         : t == GradType::kF16 ? ParamType::kF16
                               : ParamType::kBF16;
}

AdamGroup group_from(const py::handle& value, const AdamGroup& defaults, size_t i) {
  if (py::isinstance<AdamGroup>(value)) return value.cast<AdamGroup>();
  if (!py::isinstance<py::dict>(value)) {
    bad_type("ZeroOptions.groups[" + std::to_string(i) + "]", value,
             "a strata.AdamGroup or a dict of lr/betas/eps/weight_decay/decoupled");
  }
  AdamGroup group = defaults;
  apply_group_kwargs(group, value.cast<py::dict>());
  return group;
}

// Sets `name` on the object `target` (a bound options struct), or raises naming `where`.
void set_field(py::object target, const std::string& where, const std::string& name,
               const py::handle& value) {
  if (name.empty() || name[0] == '_' || !py::hasattr(py::type::of(target), name.c_str())) {
    throw py::type_error("'" + name + "' is not a field of " + where);
  }
  target.attr(name.c_str()) = value;
}

std::string repr_fields(const py::object& self, const char* cls,
                        const std::vector<const char*>& names) {
  std::string out = std::string(cls) + "(";
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i ? ", " : "") + std::string(names[i]) + "=" + repr_of(self.attr(names[i]));
  }
  return out + ")";
}

// The optimizer's fields ZeroEngine also takes by their short (pre-ZeroOptions) names:
// (name, path of attributes under ZeroOptions).
const std::vector<std::pair<const char*, std::vector<const char*>>>& short_names() {
  static const std::vector<std::pair<const char*, std::vector<const char*>>> names = {
      {"lr", {"optimizer", "defaults", "lr"}},
      {"betas", {"optimizer", "defaults", "betas"}},
      {"eps", {"optimizer", "defaults", "eps"}},
      {"weight_decay", {"optimizer", "defaults", "weight_decay"}},
      {"decoupled", {"optimizer", "defaults", "decoupled"}},
      {"max_grad_norm", {"optimizer", "max_grad_norm"}},
      {"skip_on_overflow", {"optimizer", "skip_on_overflow"}},
      {"chunk_elements", {"optimizer", "chunk_elements"}},
      {"state_home", {"optimizer", "state_home"}},
      {"loss_scale", {"optimizer", "loss_scaling", "scale"}},
      {"dynamic_loss_scale", {"optimizer", "loss_scaling", "dynamic"}},
  };
  return names;
}

template <typename C>
void init_from_kwargs(py::class_<C>& cls, const char* cls_name) {
  const std::string where = std::string("strata.") + cls_name;
  cls.def(py::init([where](const py::kwargs& fields) {
            auto object = py::cast(C{});
            for (auto [key, value] : fields) {
              set_field(object, where, std::string(py::str(key)), value);
            }
            return object.template cast<C>();
          }),
          "Every field by keyword (the rest keep the C++ defaults).");
}

}  // namespace

ZeroOptions zero_options_from(const py::object& options, const py::kwargs& fields) {
  ZeroOptions o;
  if (!options.is_none()) {
    if (!py::isinstance<ZeroOptions>(options)) {
      bad_type("options", options, "a strata.ZeroOptions (or None and keyword fields)");
    }
    o = options.cast<ZeroOptions>();
  }
  auto object = py::cast(&o, py::return_value_policy::reference);
  py::object groups;
  for (auto [key, value] : fields) {
    const auto name = key.cast<std::string>();
    if (name == "groups") {  // last: dicts apply over the defaults the other fields set
      groups = py::reinterpret_borrow<py::object>(value);
      continue;
    }
    bool done = false;
    for (const auto& [short_name, path] : short_names()) {
      if (name != short_name) continue;
      py::object target = object;
      for (size_t i = 0; i + 1 < path.size(); ++i) target = target.attr(path[i]);
      target.attr(path.back()) = value;
      done = true;
    }
    if (!done) {
      if (!py::hasattr(py::type::of(object), name.c_str()) || name[0] == '_') {
        throw py::type_error("'" + name +
                             "' is not a ZeroEngine option: use a field of strata.ZeroOptions "
                             "or lr, betas, eps, weight_decay, decoupled, max_grad_norm, "
                             "skip_on_overflow, chunk_elements, state_home, loss_scale, "
                             "dynamic_loss_scale, groups");
      }
      object.attr(name.c_str()) = value;
    }
  }
  if (groups && !groups.is_none()) object.attr("groups") = groups;
  return o;
}

void bind_zero_options(py::module_& m) {
  py::class_<AdamGroup> adam(m, "AdamGroup",
                             "Adam/AdamW hyper-parameters of a parameter group "
                             "(include/strata/optimizer/cpu_adam.h, AdamHyper).");
  init_from_kwargs(adam, "AdamGroup");
  number_field(adam, "AdamGroup", "lr", &AdamGroup::lr, 0.0F);
  number_field(adam, "AdamGroup", "beta1", &AdamGroup::beta1, 0.0F, 1.0F);
  number_field(adam, "AdamGroup", "beta2", &AdamGroup::beta2, 0.0F, 1.0F);
  number_field(adam, "AdamGroup", "eps", &AdamGroup::eps, 0.0F);
  number_field(adam, "AdamGroup", "weight_decay", &AdamGroup::weight_decay, 0.0F);
  number_field(adam, "AdamGroup", "decoupled", &AdamGroup::decoupled);
  adam.def_property(
      "betas", [](const AdamGroup& g) { return py::make_tuple(g.beta1, g.beta2); },
      [](AdamGroup& g, const py::handle& v) {
        if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v) || py::len(v) != 2) {
          bad_type("AdamGroup.betas", v, "a pair (beta1, beta2)");
        }
        const auto pair = v.cast<py::sequence>();
        g.beta1 = number<float>(pair[0], "AdamGroup.betas[0]", 0.0F, 1.0F);
        g.beta2 = number<float>(pair[1], "AdamGroup.betas[1]", 0.0F, 1.0F);
      });
  adam.def("__repr__", [](const py::object& self) {
    return repr_fields(self, "AdamGroup", {"lr", "betas", "eps", "weight_decay", "decoupled"});
  });

  py::class_<LossScaling> scaling(m, "LossScaling", "fp16 loss scaling (offload_optimizer.h).");
  init_from_kwargs(scaling, "LossScaling");
  number_field(scaling, "LossScaling", "scale", &LossScaling::scale, 0.0F);
  number_field(scaling, "LossScaling", "dynamic", &LossScaling::dynamic);
  number_field(scaling, "LossScaling", "growth_factor", &LossScaling::growth_factor, 1.0F);
  number_field(scaling, "LossScaling", "backoff_factor", &LossScaling::backoff_factor, 0.0F, 1.0F);
  number_field(scaling, "LossScaling", "growth_interval", &LossScaling::growth_interval,
               uint32_t{1});
  number_field(scaling, "LossScaling", "min_scale", &LossScaling::min_scale, 0.0F);
  scaling.def("__repr__", [](const py::object& self) {
    return repr_fields(
        self, "LossScaling",
        {"scale", "dynamic", "growth_factor", "backoff_factor", "growth_interval", "min_scale"});
  });

  py::class_<OverlapOptions> overlap(
      m, "OverlapOptions",
      "The overlapped optimizer step (offload_optimizer.h): enabled starts each parameter's "
      "Adam as its gradient is final, during backward, validated (and, when clipping or an "
      "overflow says so, rolled back and redone) by step(), bitwise the plain step; "
      "max_host_bytes caps the backups and held copies it allocates in the CPU tier (0: the "
      "tier's capacity).");
  init_from_kwargs(overlap, "OverlapOptions");
  number_field(overlap, "OverlapOptions", "enabled", &OverlapOptions::enabled);
  size_field(overlap, "OverlapOptions", "max_host_bytes", &OverlapOptions::max_host_bytes, true);
  overlap.def("__repr__", [](const py::object& self) {
    return repr_fields(self, "OverlapOptions", {"enabled", "max_host_bytes"});
  });

  py::class_<OffloadOptimizerOptions> opt(
      m, "OffloadOptimizerOptions",
      "The optimizer of each rank's slice (offload_optimizer.h): state home, the defaults (group "
      "0), clipping, loss scaling, chunking, the overlapped step.");
  init_from_kwargs(opt, "OffloadOptimizerOptions");
  opt.def_property(
      "state_home", [](const OffloadOptimizerOptions& o) { return tier_name(o.state_home); },
      [](OffloadOptimizerOptions& o, const py::handle& v) {
        o.state_home = tier_of(v, "OffloadOptimizerOptions.state_home", /*allow_gpu=*/false);
      });
  opt.def_readwrite("defaults", &OffloadOptimizerOptions::defaults);
  number_field(opt, "OffloadOptimizerOptions", "max_grad_norm",
               &OffloadOptimizerOptions::max_grad_norm, 0.0F);
  number_field(opt, "OffloadOptimizerOptions", "skip_on_overflow",
               &OffloadOptimizerOptions::skip_on_overflow);
  opt.def_readwrite("loss_scaling", &OffloadOptimizerOptions::loss_scaling);
  number_field(opt, "OffloadOptimizerOptions", "chunk_elements",
               &OffloadOptimizerOptions::chunk_elements, uint64_t{0});
  opt.def_readwrite("overlap", &OffloadOptimizerOptions::overlap);
  opt.def("__repr__", [](const py::object& self) {
    return repr_fields(self, "OffloadOptimizerOptions",
                       {"state_home", "defaults", "max_grad_norm", "skip_on_overflow",
                        "loss_scaling", "chunk_elements", "overlap"});
  });

  py::class_<ZeroOptions> zero(m, "ZeroOptions", R"doc(
The options strata.ZeroEngine is created with: include/strata/zero/zero_engine.h's
ZeroOptions, field by field (readwrite; the defaults are the C++ ones). Byte counts take an int
or a size string ("32MiB"); tiers 'gpu', 'cpu' or 'nvme'; dtypes float32, float16, bfloat16
(names, numpy or torch dtypes). A value of the wrong type or out of range raises, naming the
field. Nested: optimizer (OffloadOptimizerOptions: state_home, defaults (AdamGroup),
max_grad_norm, loss_scaling (LossScaling), overlap (OverlapOptions), ...).)doc");
  init_from_kwargs(zero, "ZeroOptions");
  number_field(zero, "ZeroOptions", "stage", &ZeroOptions::stage, uint32_t{1}, uint32_t{3});
  zero.def_property(
      "param_dtype", [](const ZeroOptions& o) { return dtype_text(o.param_type); },
      [](ZeroOptions& o, const py::handle& v) {
        o.param_type = param_type_named(v, "ZeroOptions.param_dtype");
      });
  zero.def_property(
      "grad_dtype", [](const ZeroOptions& o) { return dtype_text(param_type_of(o.grad_type)); },
      [](ZeroOptions& o, const py::handle& v) {
        o.grad_type = grad_type_of(param_type_named(v, "ZeroOptions.grad_dtype"));
      });
  size_field(zero, "ZeroOptions", "bucket_bytes", &ZeroOptions::bucket_bytes, false);
  number_field(zero, "ZeroOptions", "gradient_buckets", &ZeroOptions::gradient_buckets,
               uint32_t{1});
  number_field(zero, "ZeroOptions", "alignment", &ZeroOptions::alignment, uint32_t{1});
  zero.def_property(
      "param_home", [](const ZeroOptions& o) { return tier_name(o.param_home); },
      [](ZeroOptions& o, const py::handle& v) {
        o.param_home = tier_of(v, "ZeroOptions.param_home");  // NVMe: stage 3 (the engine checks)
      });
  size_field(zero, "ZeroOptions", "persist_below_bytes", &ZeroOptions::persist_below_bytes, true);
  size_field(zero, "ZeroOptions", "prefetch_bytes", &ZeroOptions::prefetch_bytes, true);
  // None (the default): automatic, fitted to the GPU tier without a warning.
  zero.def_property(
      "max_live_bytes",
      [](const ZeroOptions& o) -> py::object {
        return o.max_live_bytes ? py::object(py::int_(*o.max_live_bytes)) : py::none();
      },
      [](ZeroOptions& o, const py::object& v) {
        if (v.is_none()) {
          o.max_live_bytes.reset();
          return;
        }
        if (py::isinstance<py::bool_>(v) ||
            !(py::isinstance<py::int_>(v) || py::isinstance<py::str>(v))) {
          bad_type("ZeroOptions.max_live_bytes", v,
                   "None (automatic), a byte count (int) or a size ('1GiB')");
        }
        o.max_live_bytes = size_arg(v, "ZeroOptions.max_live_bytes", /*allow_zero=*/false);
      });
  size_field(zero, "ZeroOptions", "reuse_window_bytes", &ZeroOptions::reuse_window_bytes, true);
  number_field(zero, "ZeroOptions", "accumulation_steps", &ZeroOptions::accumulation_steps,
               uint32_t{1});
  number_field(zero, "ZeroOptions", "hpz_node_ranks", &ZeroOptions::hpz_node_ranks, uint32_t{0});
  zero.def_property(
      "groups", [](const ZeroOptions& o) { return py::cast(o.groups); },
      [](ZeroOptions& o, const py::handle& v) {
        if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v)) {
          bad_type("ZeroOptions.groups", v, "a list of strata.AdamGroup or dicts");
        }
        std::vector<AdamGroup> groups;
        for (const py::handle g : v) {
          groups.push_back(group_from(g, o.optimizer.defaults, groups.size()));
        }
        o.groups = std::move(groups);
      },
      "Hyper-parameter groups (empty: one, optimizer.defaults); a dict applies over "
      "optimizer.defaults as they are when it is set.");
  zero.def_readwrite("optimizer", &ZeroOptions::optimizer);
  zero.def("__repr__", [](const py::object& self) {
    return repr_fields(
        self, "ZeroOptions",
        {"stage", "param_dtype", "grad_dtype", "bucket_bytes", "gradient_buckets", "alignment",
         "param_home", "persist_below_bytes", "prefetch_bytes", "max_live_bytes",
         "reuse_window_bytes", "accumulation_steps", "hpz_node_ranks", "groups", "optimizer"});
  });
}

}  // namespace strata::python
