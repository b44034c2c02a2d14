// The C API's ZeRO-DP engine: ZeroEngine behind a handle, every argument checked.
#include <absl/strings/str_cat.h>

#include <limits>
#include <span>
#include <string>
#include <vector>

#include "c_api_comm.h"
#include "strata/zero/zero_engine.h"

namespace strata::c_api {
namespace {

struct EngineState final : Child {
  void destroy_payload() override {
    engine.reset();  // before the communicator it uses
    comm.reset();
  }
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<ZeroEngine> engine;
};

// The engine behind a handle, after entering it (and its runtime) for this call.
absl::StatusOr<EngineState*> engine_of(Call& call, strata_zero_engine_t* handle) {
  auto child = call.child(id_of(handle), Kind::kZeroEngine, "engine");
  if (!child.ok()) return child.status();
  return static_cast<EngineState*>(*child);
}

absl::StatusOr<ZeroParamId> param_of(const EngineState& state, strata_zero_param_t param) {
  const uint32_t params = state.engine->param_count();
  if (param.index >= params) {
    return absl::NotFoundError(absl::StrCat(
        "param ", param.index, " is not a parameter of this engine (it has ", params, ")"));
  }
  return ZeroParamId{param.index};
}

// A stream of the engine's runtime.
absl::StatusOr<Stream*> stream_of(Call& call, const EngineState& state, strata_stream_t* handle) {
  auto s = call.stream(handle, "stream");
  if (!s.ok()) return s.status();
  if ((*s)->owner != state.owner) {
    return absl::InvalidArgumentError("stream belongs to another runtime than engine");
  }
  return (*s)->stream.get();
}

strata_param_type_t param_type_to_c(ParamType type) {
  switch (type) {
    case ParamType::kF32:
      return STRATA_PARAM_F32;
    case ParamType::kF16:
      return STRATA_PARAM_F16;
    case ParamType::kBF16:
      return STRATA_PARAM_BF16;
  }
  return STRATA_PARAM_F16;
}

strata_grad_type_t grad_type_to_c(GradType type) {
  switch (type) {
    case GradType::kF32:
      return STRATA_GRAD_F32;
    case GradType::kF16:
      return STRATA_GRAD_F16;
    case GradType::kBF16:
      return STRATA_GRAD_BF16;
  }
  return STRATA_GRAD_F16;
}

absl::StatusOr<ZeroOptions> options_from(const strata_zero_options_t& o) {
  ZeroOptions options;
  if (o.stage < 1 || o.stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("options->stage is ", o.stage,
                     ": use 1 (optimizer states partitioned), 2 (gradients partitioned too) or "
                     "3 (parameters partitioned too)"));
  }
  options.stage = o.stage;
  auto param_type = param_type_from(o.param_type, "options->param_type");
  if (!param_type.ok()) return param_type.status();
  auto grad_type = grad_type_from(o.grad_type, "options->grad_type");
  if (!grad_type.ok()) return grad_type.status();
  auto home = tier_from(o.param_home, "options->param_home");
  if (!home.ok()) return home.status();
  if (*home == TierKind::kNvme && o.stage != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->param_home is STRATA_TIER_NVME at stage ", o.stage,
        ": the flat parameter tensors of stages 1 and 2 are homed in STRATA_TIER_GPU or "
        "STRATA_TIER_CPU (stage 3 homes each rank's shard on NVMe; optimizer.state_home puts "
        "the states there)"));
  }
  if (o.groups == nullptr && o.group_count > 0) {
    return null_argument("options->groups (with group_count > 0)");
  }
  auto optimizer = optimizer_options_from(o.optimizer, "options->optimizer.");
  if (!optimizer.ok()) return optimizer.status();
  options.param_type = *param_type;
  options.grad_type = *grad_type;
  options.bucket_bytes = o.bucket_bytes;
  options.gradient_buckets = o.gradient_buckets;
  options.alignment = o.alignment;
  options.param_home = *home;
  options.accumulation_steps = o.accumulation_steps;
  options.persist_below_bytes = o.persist_below_bytes;
  options.prefetch_bytes = o.prefetch_bytes;
  // 0: automatic (the C++ default, unset).
  if (o.max_live_bytes != 0) options.max_live_bytes = o.max_live_bytes;
  options.reuse_window_bytes = o.reuse_window_bytes;
  for (size_t i = 0; i < o.group_count; ++i) options.groups.push_back(group_from(o.groups[i]));
  options.optimizer = *std::move(optimizer);
  return options;
}

// The C++ parameter of one spec; `initial` points into the caller's array.
absl::StatusOr<ZeroParam> param_from(const strata_zero_param_spec_t& spec, size_t i) {
  const std::string where = absl::StrCat("params[", i, "]");
  if (spec.name == nullptr) return null_argument(absl::StrCat(where, ".name"));
  if (spec.ndim > STRATA_MAX_NDIM) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".ndim is ", spec.ndim, ": at most STRATA_MAX_NDIM (", STRATA_MAX_NDIM, ")"));
  }
  if (spec.shape == nullptr && spec.ndim > 0) {
    return null_argument(absl::StrCat(where, ".shape (with ndim > 0)"));
  }
  ZeroParam param;
  param.name = spec.name;
  param.group = spec.group;
  uint64_t count = 1;
  for (size_t d = 0; d < spec.ndim; ++d) {
    const int64_t dim = spec.shape[d];
    if (dim <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, " ('", param.name, "'): shape[", d,
                                                     "] is ", dim, ": dimensions must be > 0"));
    }
    if (count > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " ('", param.name, "'): the shape's element count does not fit in 64 bits"));
    }
    count *= static_cast<uint64_t>(dim);
    param.shape.push_back(dim);
  }
  if (spec.initial != nullptr) param.initial = std::span<const float>(spec.initial, count);
  return param;
}

}  // namespace
}  // namespace strata::c_api

using namespace strata::c_api;  // NOLINT(build/namespaces): this file implements it
using strata::ZeroParamId;

extern "C" {

strata_status_t strata_zero_options_init(strata_zero_options_t* options) {
  return boundary("strata_zero_options_init", [&]() -> absl::Status {
    if (options == nullptr) return null_argument("options");
    // The C++ defaults, so that the two never disagree.
    const strata::ZeroOptions d;
    *options = strata_zero_options_t{};
    options->stage = d.stage;
    options->param_type = param_type_to_c(d.param_type);
    options->grad_type = grad_type_to_c(d.grad_type);
    options->bucket_bytes = d.bucket_bytes;
    options->gradient_buckets = d.gradient_buckets;
    options->alignment = d.alignment;
    options->param_home = tier_to_c(d.param_home);
    options->accumulation_steps = d.accumulation_steps;
    options->groups = nullptr;
    options->group_count = 0;
    options->optimizer = optimizer_options_to_c(d.optimizer);
    options->persist_below_bytes = d.persist_below_bytes;
    options->prefetch_bytes = d.prefetch_bytes;
    options->max_live_bytes = d.max_live_bytes.value_or(0);  // 0: automatic
    options->reuse_window_bytes = d.reuse_window_bytes;
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_create(strata_runtime_t* runtime, strata_communicator_t* comm,
                                          const strata_zero_param_spec_t* params, size_t count,
                                          const strata_zero_options_t* options,
                                          strata_zero_engine_t** out) {
  return boundary("strata_zero_engine_create", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    auto c = comm_of(call, comm, "comm");
    if (!c.ok()) return c.status();
    if ((*c)->owner.get() != *state) {
      return absl::InvalidArgumentError("comm belongs to another runtime than runtime");
    }
    if (params == nullptr && count > 0) return null_argument("params (with count > 0)");
    std::vector<strata::ZeroParam> cpp_params;
    cpp_params.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      auto param = param_from(params[i], i);
      if (!param.ok()) return param.status();
      cpp_params.push_back(*std::move(param));
    }
    strata::ZeroOptions cpp_options;
    if (options != nullptr) {
      auto converted = options_from(*options);
      if (!converted.ok()) return converted.status();
      cpp_options = *std::move(converted);
    }
    auto child = std::make_shared<EngineState>();
    child->comm = (*c)->comm;
    auto engine = strata::ZeroEngine::create(*(*state)->runtime, *child->comm, cpp_params,
                                             std::move(cpp_options));
    if (!engine.ok()) return engine.status();
    child->engine = *std::move(engine);
    *out = handle_of<strata_zero_engine_t>(add_child(**state, Kind::kZeroEngine, child));
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_destroy(strata_zero_engine_t* engine) {
  return boundary("strata_zero_engine_destroy",
                  [&] { return destroy_child(id_of(engine), Kind::kZeroEngine, "engine"); });
}

strata_status_t strata_zero_engine_find(strata_zero_engine_t* engine, const char* name,
                                        strata_zero_param_t* out) {
  return boundary("strata_zero_engine_find", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = strata_zero_param_t{UINT32_MAX};
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (name == nullptr) return null_argument("name");
    auto id = (*state)->engine->find(name);
    if (!id.ok()) return id.status();
    *out = strata_zero_param_t{id->index};
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_param_count(strata_zero_engine_t* engine, uint32_t* out) {
  return boundary("strata_zero_engine_param_count", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    *out = (*state)->engine->param_count();
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_param_info(strata_zero_engine_t* engine,
                                              strata_zero_param_t param,
                                              strata_zero_param_info_t* out) {
  return boundary("strata_zero_engine_param_info", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    auto id = param_of(**state, param);
    if (!id.ok()) return id.status();
    const strata::ZeroLayoutParam& p = (*state)->engine->layout().params()[id->index];
    *out = strata_zero_param_info_t{};
    out->count = p.count;
    out->ndim = static_cast<int32_t>(p.shape.size());
    for (size_t d = 0; d < p.shape.size() && d < STRATA_MAX_NDIM; ++d) out->shape[d] = p.shape[d];
    out->group = p.adam_group;
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_param_name(strata_zero_engine_t* engine,
                                              strata_zero_param_t param, char* buffer, size_t size,
                                              size_t* length) {
  return boundary("strata_zero_engine_param_name", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    auto id = param_of(**state, param);
    if (!id.ok()) return id.status();
    return copy_out((*state)->engine->layout().params()[id->index].name, buffer, size, length);
  });
}

strata_status_t strata_zero_engine_layout(strata_zero_engine_t* engine, strata_zero_layout_t* out) {
  return boundary("strata_zero_engine_layout", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    const strata::ZeroLayout& l = (*state)->engine->layout();
    *out = strata_zero_layout_t{
        l.ranks(),    l.alignment(),       static_cast<uint32_t>(l.groups().size()),
        l.elements(), l.padded_elements(), l.shard_elements()};
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_param_view(strata_zero_engine_t* engine,
                                              strata_zero_param_t param, strata_zero_view_t* out) {
  return boundary("strata_zero_engine_param_view", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = strata_zero_view_t{};
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    auto id = param_of(**state, param);
    if (!id.ok()) return id.status();
    auto view = (*state)->engine->param_view(*id);
    if (!view.ok()) return view.status();
    *out = strata_zero_view_t{to_c(*(*state)->owner, view->tensor), view->offset, view->count};
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_acquire_param(strata_zero_engine_t* engine,
                                                 strata_zero_param_t param, strata_tier_t tier,
                                                 strata_stream_t* stream, strata_access_mode_t mode,
                                                 void** out) {
  return boundary("strata_zero_engine_acquire_param", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    auto id = param_of(**state, param);
    if (!id.ok()) return id.status();
    auto s = stream_of(call, **state, stream);
    if (!s.ok()) return s.status();
    auto kind = tier_from(tier, "tier");
    if (!kind.ok()) return kind.status();
    if (mode != STRATA_ACCESS_READ && mode != STRATA_ACCESS_WRITE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mode is ", mode, ": use STRATA_ACCESS_READ (0) or STRATA_ACCESS_WRITE (1)"));
    }
    auto data = (*state)->engine->acquire_param(
        *id, *kind, **s,
        mode == STRATA_ACCESS_WRITE ? strata::AccessMode::kWrite : strata::AccessMode::kRead);
    if (!data.ok()) return data.status();
    *out = *data;
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_release_param(strata_zero_engine_t* engine,
                                                 strata_zero_param_t param,
                                                 strata_stream_t* stream) {
  return boundary("strata_zero_engine_release_param", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    auto id = param_of(**state, param);
    if (!id.ok()) return id.status();
    auto s = stream_of(call, **state, stream);
    if (!s.ok()) return s.status();
    return (*state)->engine->release_param(*id, **s);
  });
}

strata_status_t strata_zero_engine_set_fetch_order(strata_zero_engine_t* engine,
                                                   const strata_zero_param_t* order, size_t count) {
  return boundary("strata_zero_engine_set_fetch_order", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (order == nullptr && count > 0) return null_argument("order (with count > 0)");
    std::vector<ZeroParamId> ids;
    ids.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      auto id = param_of(**state, order[i]);
      if (!id.ok()) {
        return absl::Status(id.status().code(),
                            absl::StrCat("order[", i, "]: ", id.status().message()));
      }
      ids.push_back(*id);
    }
    return (*state)->engine->set_fetch_order(ids);
  });
}

strata_status_t strata_zero_engine_acquire_grad(strata_zero_engine_t* engine,
                                                strata_zero_param_t param, strata_tier_t tier,
                                                strata_stream_t* stream, void** out) {
  return boundary("strata_zero_engine_acquire_grad", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    auto id = param_of(**state, param);
    if (!id.ok()) return id.status();
    auto s = stream_of(call, **state, stream);
    if (!s.ok()) return s.status();
    auto kind = tier_from(tier, "tier");
    if (!kind.ok()) return kind.status();
    auto data = (*state)->engine->acquire_grad(*id, *kind, **s);
    if (!data.ok()) return data.status();
    *out = *data;
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_grad_ready(strata_zero_engine_t* engine,
                                              strata_zero_param_t param, strata_stream_t* stream) {
  return boundary("strata_zero_engine_grad_ready", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    auto id = param_of(**state, param);
    if (!id.ok()) return id.status();
    auto s = stream_of(call, **state, stream);
    if (!s.ok()) return s.status();
    return (*state)->engine->grad_ready(*id, **s);
  });
}

strata_status_t strata_zero_engine_step(strata_zero_engine_t* engine, strata_step_result_t* out) {
  return boundary("strata_zero_engine_step", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    auto result = (*state)->engine->step();
    if (!result.ok()) return result.status();
    if (out != nullptr) *out = step_result_to_c(*result);
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_zero_grad(strata_zero_engine_t* engine) {
  return boundary("strata_zero_engine_zero_grad", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    return (*state)->engine->zero_grad();
  });
}

strata_status_t strata_zero_engine_set_group(strata_zero_engine_t* engine, uint32_t group,
                                             const strata_adam_group_t* hyper) {
  return boundary("strata_zero_engine_set_group", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (hyper == nullptr) return null_argument("hyper");
    return (*state)->engine->set_group(group, group_from(*hyper));
  });
}

strata_status_t strata_zero_engine_get_group(strata_zero_engine_t* engine, uint32_t group,
                                             strata_adam_group_t* out) {
  return boundary("strata_zero_engine_get_group", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    auto hyper = (*state)->engine->group(group);
    if (!hyper.ok()) return hyper.status();
    *out = group_to_c(*hyper);
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_save(strata_zero_engine_t* engine, const char* directory) {
  return boundary("strata_zero_engine_save", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (directory == nullptr) return null_argument("directory");
    return (*state)->engine->save(directory);
  });
}

strata_status_t strata_zero_engine_load(strata_zero_engine_t* engine, const char* directory) {
  return boundary("strata_zero_engine_load", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (directory == nullptr) return null_argument("directory");
    return (*state)->engine->load(directory);
  });
}

strata_status_t strata_zero_engine_read_state(strata_zero_engine_t* engine,
                                              strata_zero_param_t param, float* master,
                                              float* exp_avg, float* exp_avg_sq, uint64_t count) {
  return boundary("strata_zero_engine_read_state", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    auto id = param_of(**state, param);
    if (!id.ok()) return id.status();
    const strata::ZeroLayoutParam& p = (*state)->engine->layout().params()[id->index];
    const bool any = master != nullptr || exp_avg != nullptr || exp_avg_sq != nullptr;
    if (any && count != p.count) {
      return absl::InvalidArgumentError(absl::StrCat("count is ", count, ": parameter '", p.name,
                                                     "' has ", p.count, " elements"));
    }
    const auto span = [&](float* data) {
      return data == nullptr ? std::span<float>() : std::span<float>(data, p.count);
    };
    return (*state)->engine->read_state(*id, span(master), span(exp_avg), span(exp_avg_sq));
  });
}

strata_status_t strata_zero_engine_memory(strata_zero_engine_t* engine, strata_zero_memory_t* out) {
  return boundary("strata_zero_engine_memory", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    const strata::ZeroMemory m = (*state)->engine->memory();
    *out = strata_zero_memory_t{};
    for (size_t t = 0; t < STRATA_TIER_COUNT; ++t) {
      out->params[t] = m.params[t];
      out->grads[t] = m.grads[t];
      out->optimizer_states[t] = m.optimizer_states[t];
      out->buckets[t] = m.buckets[t];
    }
    out->model_states = m.model_states();
    out->gathered = m.gathered;
    return absl::OkStatus();
  });
}

strata_status_t strata_zero_engine_stats(strata_zero_engine_t* engine, strata_zero_stats_t* out) {
  return boundary("strata_zero_engine_stats", [&]() -> absl::Status {
    Call call;
    auto state = engine_of(call, engine);
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    const strata::ZeroStats s = (*state)->engine->stats();
    *out = strata_zero_stats_t{s.steps,
                               s.micro_steps,
                               s.reduce_scatters,
                               s.all_gathers,
                               s.last_step_comm_bytes,
                               s.last_step_ns,
                               s.last_step_wait_ns,
                               s.last_optimizer_ns,
                               s.last_gather_ns,
                               s.fetches,
                               s.gathers_on_demand,
                               s.gathers_prefetched,
                               s.prefetch_late,
                               s.reuses,
                               s.gathers_dropped_unused,
                               s.order_changes,
                               s.gathered_bytes,
                               s.gathered_peak_bytes,
                               s.fetch_wait_ns};
    return absl::OkStatus();
  });
}

}  // extern "C"
