// The C API's offload optimizer: OffloadOptimizer behind a handle, every argument checked.
#include <absl/strings/str_cat.h>

#include <span>

#include "c_api_internal.h"
#include "strata/base/mutex.h"
#include "strata/optimizer/offload_optimizer.h"

namespace strata::c_api {
namespace {

struct OptimizerState final : Child {
  void destroy_payload() override { optimizer.reset(); }
  std::unique_ptr<OffloadOptimizer> optimizer;
};

// The optimizer behind a handle, after entering it (and its runtime) for this call.
absl::StatusOr<OptimizerState*> optimizer_of(Call& call, strata_optimizer_t* handle) {
  auto child = call.child(id_of(handle), Kind::kOptimizer, "optimizer");
  if (!child.ok()) return child.status();
  return static_cast<OptimizerState*>(*child);
}

absl::Status check_param(const OptimizerState& state, strata_param_t param) {
  const uint64_t params = state.optimizer->stats().params;
  if (param.index >= params) {
    return absl::NotFoundError(absl::StrCat("param ", param.index,
                                            " is not a parameter of this "
                                            "optimizer (",
                                            params, " are registered)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CpuIsa> isa_from(strata_cpu_isa_t isa, absl::string_view param) {
  switch (isa) {
    case STRATA_CPU_ISA_AUTO:
      return CpuIsa::kAuto;
    case STRATA_CPU_ISA_SCALAR:
      return CpuIsa::kScalar;
    case STRATA_CPU_ISA_AVX2:
      return CpuIsa::kAvx2;
    case STRATA_CPU_ISA_AVX512:
      return CpuIsa::kAvx512;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(param, " is ", isa, ": use one of the STRATA_CPU_ISA_* values"));
  }
}

}  // namespace

AdamGroup group_from(const strata_adam_group_t& g) {
  return AdamGroup{g.lr, g.beta1, g.beta2, g.eps, g.weight_decay, g.decoupled != 0};
}

strata_adam_group_t group_to_c(const AdamGroup& g) {
  return strata_adam_group_t{g.lr, g.beta1, g.beta2, g.eps, g.weight_decay, g.decoupled ? 1 : 0};
}

absl::StatusOr<ParamType> param_type_from(strata_param_type_t type, absl::string_view param) {
  switch (type) {
    case STRATA_PARAM_F32:
      return ParamType::kF32;
    case STRATA_PARAM_F16:
      return ParamType::kF16;
    case STRATA_PARAM_BF16:
      return ParamType::kBF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(param, " is ", type,
                                                     ": use STRATA_PARAM_F32, STRATA_PARAM_F16 or "
                                                     "STRATA_PARAM_BF16"));
  }
}

absl::StatusOr<GradType> grad_type_from(strata_grad_type_t type, absl::string_view param) {
  switch (type) {
    case STRATA_GRAD_F32:
      return GradType::kF32;
    case STRATA_GRAD_F16:
      return GradType::kF16;
    case STRATA_GRAD_BF16:
      return GradType::kBF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(param, " is ", type,
                                                     ": use STRATA_GRAD_F32, STRATA_GRAD_F16 or "
                                                     "STRATA_GRAD_BF16"));
  }
}

absl::StatusOr<OffloadOptimizerOptions> optimizer_options_from(const strata_optimizer_options_t& o,
                                                               absl::string_view prefix) {
  OffloadOptimizerOptions options;
  auto home = tier_from(o.state_home, absl::StrCat(prefix, "state_home"));
  if (!home.ok()) return home.status();
  auto isa = isa_from(o.isa, absl::StrCat(prefix, "isa"));
  if (!isa.ok()) return isa.status();
  options.state_home = *home;
  options.defaults = group_from(o.defaults);
  options.max_grad_norm = o.max_grad_norm;
  options.skip_on_overflow = o.skip_on_overflow != 0;
  const strata_loss_scaling_t& ls = o.loss_scaling;
  options.loss_scaling = LossScaling{ls.scale,          ls.dynamic != 0,    ls.growth_factor,
                                     ls.backoff_factor, ls.growth_interval, ls.min_scale};
  options.chunk_elements = o.chunk_elements;
  options.isa = *isa;
  options.overlap = OverlapOptions{o.overlap.enabled != 0, o.overlap.max_host_bytes};
  return options;
}

strata_optimizer_options_t optimizer_options_to_c(const OffloadOptimizerOptions& d) {
  const LossScaling& ls = d.loss_scaling;
  strata_optimizer_options_t options{};
  options.state_home = d.state_home == TierKind::kNvme ? STRATA_TIER_NVME : STRATA_TIER_CPU;
  options.defaults = group_to_c(d.defaults);
  options.max_grad_norm = d.max_grad_norm;
  options.skip_on_overflow = d.skip_on_overflow ? 1 : 0;
  options.loss_scaling =
      strata_loss_scaling_t{ls.scale,          ls.dynamic ? 1 : 0, ls.growth_factor,
                            ls.backoff_factor, ls.growth_interval, ls.min_scale};
  options.chunk_elements = d.chunk_elements;
  options.isa = STRATA_CPU_ISA_AUTO;
  options.overlap = strata_overlap_options_t{d.overlap.enabled ? 1 : 0, d.overlap.max_host_bytes};
  return options;
}

strata_step_result_t step_result_to_c(const StepResult& r) {
  return strata_step_result_t{
      r.skipped ? 1 : 0, r.grad_norm,      r.clip_coef,          r.params_updated, r.step,
      r.loss_scale,      r.early_elements, r.rolled_back ? 1 : 0};
}

}  // namespace strata::c_api

using namespace strata::c_api;  // NOLINT(build/namespaces): this file implements it

extern "C" {

strata_status_t strata_adam_group_init(strata_adam_group_t* group) {
  return boundary("strata_adam_group_init", [&]() -> absl::Status {
    if (group == nullptr) return null_argument("group");
    *group = group_to_c(strata::AdamGroup{});
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_options_init(strata_optimizer_options_t* options) {
  return boundary("strata_optimizer_options_init", [&]() -> absl::Status {
    if (options == nullptr) return null_argument("options");
    // The C++ defaults, so that the two never disagree.
    *options = optimizer_options_to_c(strata::OffloadOptimizerOptions{});
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_create(strata_runtime_t* runtime,
                                        const strata_optimizer_options_t* options,
                                        strata_optimizer_t** out) {
  return boundary("strata_optimizer_create", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    strata::OffloadOptimizerOptions cpp;
    if (options != nullptr) {
      auto converted = optimizer_options_from(*options, "options->");
      if (!converted.ok()) return converted.status();
      cpp = *converted;
    }
    auto optimizer = strata::OffloadOptimizer::create(*(*state)->runtime, cpp);
    if (!optimizer.ok()) return optimizer.status();
    auto child = std::make_shared<OptimizerState>();
    child->kind = Kind::kOptimizer;
    child->owner = (*state)->shared_from_this();
    child->optimizer = *std::move(optimizer);
    // Registered under the runtime's lock: its destroy then sees the child in its list.
    strata::MutexLock lock(&(*state)->mu);
    (*state)->children.push_back(Registry::get().add(Entry{Kind::kOptimizer, nullptr, child}));
    *out = handle_of<strata_optimizer_t>(child->id);
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_destroy(strata_optimizer_t* optimizer) {
  return boundary("strata_optimizer_destroy",
                  [&] { return destroy_child(id_of(optimizer), Kind::kOptimizer, "optimizer"); });
}

strata_status_t strata_optimizer_add_group(strata_optimizer_t* optimizer,
                                           const strata_adam_group_t* group, uint32_t* out) {
  return boundary("strata_optimizer_add_group", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (group == nullptr) return null_argument("group");
    if (out == nullptr) return null_argument("out");
    auto index = (*state)->optimizer->add_group(group_from(*group));
    if (!index.ok()) return index.status();
    *out = *index;
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_set_group(strata_optimizer_t* optimizer, uint32_t group,
                                           const strata_adam_group_t* hyper) {
  return boundary("strata_optimizer_set_group", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (hyper == nullptr) return null_argument("hyper");
    return (*state)->optimizer->set_group(group, group_from(*hyper));
  });
}

strata_status_t strata_optimizer_get_group(strata_optimizer_t* optimizer, uint32_t group,
                                           strata_adam_group_t* out) {
  return boundary("strata_optimizer_get_group", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    auto hyper = (*state)->optimizer->group(group);
    if (!hyper.ok()) return hyper.status();
    *out = group_to_c(*hyper);
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_set_loss_scale(strata_optimizer_t* optimizer, float scale) {
  return boundary("strata_optimizer_set_loss_scale", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    return (*state)->optimizer->set_loss_scale(scale);
  });
}

strata_status_t strata_optimizer_loss_scale(strata_optimizer_t* optimizer, float* out) {
  return boundary("strata_optimizer_loss_scale", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    *out = (*state)->optimizer->loss_scale();
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_step_count(strata_optimizer_t* optimizer, uint64_t* out) {
  return boundary("strata_optimizer_step_count", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    *out = (*state)->optimizer->step_count();
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_add_param(strata_optimizer_t* optimizer,
                                           const strata_param_spec_t* spec, strata_param_t* out) {
  return boundary("strata_optimizer_add_param", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = strata_param_t{UINT32_MAX};
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (spec == nullptr) return null_argument("spec");
    if (spec->name == nullptr) return null_argument("spec->name");
    for (const auto& [tensor, what] :
         {std::pair{spec->param, "spec->param"}, std::pair{spec->grad, "spec->grad"}}) {
      if (tensor.runtime != (*state)->owner->id) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, tensor.runtime == 0 ? " is a null handle"
                                      : " belongs to another runtime than the optimizer"));
      }
    }
    auto param_type = param_type_from(spec->param_type, "spec->param_type");
    if (!param_type.ok()) return param_type.status();
    auto grad_type = grad_type_from(spec->grad_type, "spec->grad_type");
    if (!grad_type.ok()) return grad_type.status();
    strata::ParamSpec cpp;
    cpp.name = spec->name;
    cpp.param = to_handle(spec->param);
    cpp.grad = to_handle(spec->grad);
    cpp.param_type = *param_type;
    cpp.grad_type = *grad_type;
    cpp.count = spec->count;
    cpp.group = spec->group;
    if (spec->initial_master != nullptr) {
      cpp.initial_master = std::span<const float>(spec->initial_master, spec->count);
    }
    auto id = (*state)->optimizer->add_param(cpp);
    if (!id.ok()) return id.status();
    *out = strata_param_t{id->index};
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_find_param(strata_optimizer_t* optimizer, const char* name,
                                            strata_param_t* out) {
  return boundary("strata_optimizer_find_param", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = strata_param_t{UINT32_MAX};
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (name == nullptr) return null_argument("name");
    auto id = (*state)->optimizer->find_param(name);
    if (!id.ok()) return id.status();
    *out = strata_param_t{id->index};
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_param_step_count(strata_optimizer_t* optimizer,
                                                  strata_param_t param, uint64_t* out) {
  return boundary("strata_optimizer_param_step_count", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    if (auto status = check_param(**state, param); !status.ok()) return status;
    *out = (*state)->optimizer->param_step_count(strata::ParamId{param.index});
    return absl::OkStatus();
  });
}

namespace {

absl::Status grad_ready(strata_optimizer_t* optimizer, strata_param_t param,
                        strata_stream_t* stream, strata::GradCompletion completion) {
  Call call;
  auto state = optimizer_of(call, optimizer);
  if (!state.ok()) return state.status();
  auto s = call.stream(stream, "stream");
  if (!s.ok()) return s.status();
  if ((*s)->owner != (*state)->owner) {
    return absl::InvalidArgumentError("stream belongs to another runtime than optimizer");
  }
  return (*state)->optimizer->grad_ready(strata::ParamId{param.index}, *(*s)->stream, completion);
}

}  // namespace

strata_status_t strata_optimizer_grad_ready(strata_optimizer_t* optimizer, strata_param_t param,
                                            strata_stream_t* stream) {
  return boundary("strata_optimizer_grad_ready", [&]() -> absl::Status {
    return grad_ready(optimizer, param, stream, strata::GradCompletion::kOptimizerDefault);
  });
}

strata_status_t strata_optimizer_grad_ready_hint(strata_optimizer_t* optimizer,
                                                 strata_param_t param, strata_stream_t* stream,
                                                 strata_grad_completion_t completion) {
  return boundary("strata_optimizer_grad_ready_hint", [&]() -> absl::Status {
    switch (completion) {
      case STRATA_GRAD_COMPLETION_DEFAULT:
        return grad_ready(optimizer, param, stream, strata::GradCompletion::kOptimizerDefault);
      case STRATA_GRAD_COMPLETION_FINAL:
        return grad_ready(optimizer, param, stream, strata::GradCompletion::kFinal);
      case STRATA_GRAD_COMPLETION_MORE:
        return grad_ready(optimizer, param, stream, strata::GradCompletion::kMore);
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("completion is ", completion,
                         ": use STRATA_GRAD_COMPLETION_DEFAULT, STRATA_GRAD_COMPLETION_FINAL or "
                         "STRATA_GRAD_COMPLETION_MORE"));
    }
  });
}

strata_status_t strata_optimizer_set_final_micro_step(strata_optimizer_t* optimizer,
                                                      int32_t final_micro_step) {
  return boundary("strata_optimizer_set_final_micro_step", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    (*state)->optimizer->set_final_micro_step(final_micro_step != 0);
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_wait_for_early_steps(strata_optimizer_t* optimizer) {
  return boundary("strata_optimizer_wait_for_early_steps", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    (*state)->optimizer->wait_for_early_steps();
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_zero_grad(strata_optimizer_t* optimizer) {
  return boundary("strata_optimizer_zero_grad", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    return (*state)->optimizer->zero_grad();
  });
}

strata_status_t strata_optimizer_step(strata_optimizer_t* optimizer, strata_step_result_t* out) {
  return boundary("strata_optimizer_step", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    auto result = (*state)->optimizer->step();
    if (!result.ok()) return result.status();
    if (out != nullptr) {
      *out = step_result_to_c(*result);
    }
    return absl::OkStatus();
  });
}

strata_status_t strata_optimizer_save(strata_optimizer_t* optimizer, const char* directory) {
  return boundary("strata_optimizer_save", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (directory == nullptr) return null_argument("directory");
    return (*state)->optimizer->save(directory);
  });
}

strata_status_t strata_optimizer_load(strata_optimizer_t* optimizer, const char* directory) {
  return boundary("strata_optimizer_load", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (directory == nullptr) return null_argument("directory");
    return (*state)->optimizer->load(directory);
  });
}

strata_status_t strata_optimizer_read_state(strata_optimizer_t* optimizer, strata_param_t param,
                                            float* master, float* exp_avg, float* exp_avg_sq,
                                            uint64_t count) {
  return boundary("strata_optimizer_read_state", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    const auto span = [&](float* data) {
      return data == nullptr ? std::span<float>() : std::span<float>(data, count);
    };
    return (*state)->optimizer->read_state(strata::ParamId{param.index}, span(master),
                                           span(exp_avg), span(exp_avg_sq));
  });
}

strata_status_t strata_optimizer_stats(strata_optimizer_t* optimizer,
                                       strata_optimizer_stats_t* out) {
  return boundary("strata_optimizer_stats", [&]() -> absl::Status {
    Call call;
    auto state = optimizer_of(call, optimizer);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    const strata::OffloadOptimizerStats s = (*state)->optimizer->stats();
    *out = strata_optimizer_stats_t{s.steps,
                                    s.skipped_steps,
                                    s.failed_steps,
                                    s.grads_landed,
                                    s.grad_bytes_landed,
                                    s.params,
                                    s.elements,
                                    s.chunk_elements,
                                    s.chunks,
                                    s.last_step_ns,
                                    s.last_step_wait_ns,
                                    s.last_adam_ns,
                                    s.last_nvme_wait_ns,
                                    s.nvme_bytes_read,
                                    s.nvme_bytes_written,
                                    s.peak_staging_chunks,
                                    s.overlap_early_steps,
                                    s.overlap_rollbacks,
                                    s.last_early_elements,
                                    s.last_redone_elements,
                                    s.last_early_adam_ns,
                                    s.last_rollback_ns,
                                    s.last_early_wait_ns,
                                    s.overlap_host_bytes,
                                    s.overlap_budget_misses};
    return absl::OkStatus();
  });
}

}  // extern "C"
