// The C API's runtime, stream and tensor calls: thin wrappers over Runtime and TensorStore that
// check every argument before it reaches them.
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include <limits>
#include <map>
#include <string>

#include "c_api_internal.h"
#include "strata/base/mutex.h"
#include "strata/config/config.h"

namespace strata::c_api {
namespace {

constexpr char kPrefix[] = "STRATA_";

absl::Status create_runtime(const std::map<std::string, std::string>& vars,
                            strata_runtime_t** out) {
  auto config = Config::from_variables(vars);
  if (!config.ok()) return config.status();
  auto runtime = Runtime::create(*config);
  if (!runtime.ok()) return runtime.status();
  auto state = std::make_shared<RuntimeState>();
  state->runtime = *std::move(runtime);
  Registry::get().add(Entry{Kind::kRuntime, state, nullptr});
  *out = handle_of<strata_runtime_t>(state->id);
  return absl::OkStatus();
}

absl::Status destroy_runtime(strata_runtime_t* handle) {
  if (handle == nullptr) return null_argument("runtime");
  auto entry = Registry::get().find(id_of(handle), Kind::kRuntime, "runtime");
  if (!entry.ok()) return entry.status();
  RuntimeState& state = *entry->runtime;
  if (!state.life.close()) return absl::NotFoundError("runtime was destroyed (destroyed twice)");
  // No call is inside the runtime now, nor can one enter: tear down its children, ZeRO engines
  // and optimizers first (they use the store and the communicators), then communicators (they
  // use the device), streams, and the runtime itself.
  std::vector<uint64_t> children;
  {
    strata::MutexLock lock(&state.mu);
    children.swap(state.children);
  }
  std::vector<std::shared_ptr<Child>> taken;
  for (uint64_t id : children) {
    if (auto child = Registry::get().take(id); child.has_value()) taken.push_back(child->child);
  }
  for (Kind kind : {Kind::kZeroEngine, Kind::kOptimizer, Kind::kCommunicator, Kind::kStream}) {
    for (auto it = taken.rbegin(); it != taken.rend(); ++it) {
      if ((*it)->kind != kind) continue;
      (*it)->life.close();
      (*it)->destroy_payload();
    }
  }
  Registry::get().remove(state.id);
  state.runtime.reset();
  return absl::OkStatus();
}

absl::StatusOr<AccessMode> mode_from(strata_access_mode_t mode) {
  switch (mode) {
    case STRATA_ACCESS_READ:
      return AccessMode::kRead;
    case STRATA_ACCESS_WRITE:
      return AccessMode::kWrite;
    case STRATA_ACCESS_OVERWRITE:
      return AccessMode::kOverwrite;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode is ", mode,
                       ": use STRATA_ACCESS_READ (0), STRATA_ACCESS_WRITE (1) or "
                       "STRATA_ACCESS_OVERWRITE (2)"));
  }
}

// Bytes of a dtype/shape tensor, with every argument checked.
absl::StatusOr<uint64_t> shaped_bytes(strata_dtype_t dtype, const int64_t* shape, size_t ndim) {
  const size_t item = strata_dtype_size(dtype);
  if (item == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype is ", dtype, ": use one of the STRATA_DTYPE_* values"));
  }
  if (ndim > STRATA_MAX_NDIM) {
    return absl::InvalidArgumentError(
        absl::StrCat("ndim is ", ndim, ": at most STRATA_MAX_NDIM (", STRATA_MAX_NDIM, ")"));
  }
  if (ndim > 0 && shape == nullptr) return null_argument("shape (with ndim > 0)");
  uint64_t bytes = item;
  for (size_t i = 0; i < ndim; ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape[", i, "] is ", shape[i], ": dimensions must be >= 0"));
    }
    const auto dim = static_cast<uint64_t>(shape[i]);
    if (dim != 0 && bytes > std::numeric_limits<uint64_t>::max() / dim) {
      return absl::InvalidArgumentError("the shape's size in bytes does not fit in 64 bits");
    }
    bytes *= dim;
  }
  return bytes;
}

absl::Status create_tensor(strata_runtime_t* runtime, const char* name, uint64_t bytes,
                           strata_tier_t home, strata_dtype_t dtype, std::vector<int64_t> shape,
                           strata_tensor_t* out) {
  Call call;
  auto state = call.runtime(runtime, "runtime");
  if (!state.ok()) return state.status();
  if (name == nullptr) return null_argument("name");
  auto tier = tier_from(home, "home");
  if (!tier.ok()) return tier.status();
  RuntimeState& s = **state;
  // Under the lock, so that no other thread finds the tensor before its dtype and shape exist.
  MutexLock lock(&s.mu);
  auto handle = s.runtime->store().create(name, bytes, *tier);
  if (!handle.ok()) return handle.status();
  s.meta[handle->index] = TensorMeta{handle->generation, dtype, std::move(shape)};
  *out = to_c(s, *handle);
  return absl::OkStatus();
}

// The runtime a tensor belongs to and the stream to use with it, checked to be the same one.
absl::StatusOr<std::pair<RuntimeState*, StreamState*>> tensor_and_stream(
    Call& call, const strata_tensor_t& tensor, strata_stream_t* stream) {
  auto state = call.runtime_of(tensor, "tensor");
  if (!state.ok()) return state.status();
  auto s = call.stream(stream, "stream");
  if (!s.ok()) return s.status();
  if ((*s)->owner.get() != *state) {
    return absl::InvalidArgumentError("stream belongs to another runtime than tensor");
  }
  return std::pair(*state, *s);
}

void fill(const StoreStats& in, strata_stats_t& out) {
  out = strata_stats_t{};
  for (size_t i = 0; i < in.tiers.size(); ++i) {
    const TierUsage& u = in.tiers[i];
    out.tiers[i] =
        strata_tier_usage_t{u.present ? 1 : 0, u.capacity, u.used, u.resident, u.fragmentation};
    for (size_t j = 0; j < in.moves[i].size(); ++j) {
      const MoveStats& m = in.moves[i][j];
      out.moves[i][j] = strata_move_stats_t{m.bytes, m.moves, m.ns};
    }
  }
  out.tensors = in.tensors;
  out.acquires = in.acquires;
  out.hits = in.hits;
  out.misses = in.misses;
  out.stall_ns = in.stall_ns;
  out.evictions_clean = in.evictions_clean;
  out.evictions_writeback = in.evictions_writeback;
  out.errors = in.errors;
  out.prefetches_issued = in.prefetches_issued;
  out.prefetches_used = in.prefetches_used;
  out.prefetches_late = in.prefetches_late;
  out.prefetches_wasted = in.prefetches_wasted;
  out.prefetches_failed = in.prefetches_failed;
  out.prefetch_accuracy = in.prefetch_accuracy();
  const AccessScheduleStats& sc = in.schedule;
  out.schedule = strata_schedule_stats_t{
      sc.steps,   sc.trace_length, sc.acquires, sc.matched,           sc.realigned,
      sc.unknown, sc.rerecords,    sc.late,     sc.has_trace ? 1 : 0, sc.given_order ? 1 : 0};
}

}  // namespace
}  // namespace strata::c_api

using namespace strata::c_api;  // NOLINT(build/namespaces): this file implements it
using strata::TierKind;

extern "C" {

// ---- Runtime ------------------------------------------------------------------------------------

strata_status_t strata_runtime_create_from_env(strata_runtime_t** out) {
  return boundary("strata_runtime_create_from_env", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    return create_runtime(strata::Config::environment_variables(), out);
  });
}

strata_status_t strata_runtime_create(const strata_setting_t* settings, size_t count,
                                      strata_runtime_t** out) {
  return boundary("strata_runtime_create", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    if (settings == nullptr && count > 0) return null_argument("settings (with count > 0)");
    std::map<std::string, std::string> vars = strata::Config::environment_variables();
    for (size_t i = 0; i < count; ++i) {
      const strata_setting_t& setting = settings[i];
      if (setting.name == nullptr) return null_argument(absl::StrCat("settings[", i, "].name"));
      const std::string name = setting.name;
      // Config ignores other names; here one can only be a mistake.
      if (!absl::StartsWith(name, kPrefix)) {
        return absl::InvalidArgumentError(
            absl::StrCat("settings[", i, "].name '", name,
                         "' is not a STRATA_* variable (docs/configuration.md lists them)"));
      }
      if (setting.value == nullptr) {
        vars.erase(name);
      } else {
        vars[name] = setting.value;
      }
    }
    return create_runtime(vars, out);
  });
}

strata_status_t strata_runtime_destroy(strata_runtime_t* runtime) {
  return boundary("strata_runtime_destroy", [&] { return destroy_runtime(runtime); });
}

strata_status_t strata_runtime_describe(strata_runtime_t* runtime, char* buffer, size_t size,
                                        size_t* length) {
  return boundary("strata_runtime_describe", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    std::string text = strata::render((*state)->runtime->config());
    for (const std::string& warning : (*state)->runtime->warnings()) {
      absl::StrAppend(&text, "warning: ", warning, "\n");
    }
    return copy_out(text, buffer, size, length);
  });
}

strata_status_t strata_runtime_step_begin(strata_runtime_t* runtime) {
  return boundary("strata_runtime_step_begin", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    (*state)->runtime->store().step_begin();
    return absl::OkStatus();
  });
}

strata_status_t strata_runtime_step_end(strata_runtime_t* runtime) {
  return boundary("strata_runtime_step_end", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    (*state)->runtime->store().step_end();
    return absl::OkStatus();
  });
}

strata_status_t strata_runtime_set_access_order(strata_runtime_t* runtime,
                                                const strata_access_t* order, size_t count) {
  return boundary("strata_runtime_set_access_order", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    if (order == nullptr && count > 0) return null_argument("order (with count > 0)");
    std::vector<std::pair<strata::TensorHandle, TierKind>> accesses;
    accesses.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      if (order[i].tensor.runtime != (*state)->id) {
        return absl::InvalidArgumentError(absl::StrCat(
            "order[", i, "].tensor ",
            order[i].tensor.runtime == 0 ? "is a null handle" : "belongs to another runtime"));
      }
      auto tier = tier_from(order[i].tier, absl::StrCat("order[", i, "].tier"));
      if (!tier.ok()) return tier.status();
      accesses.emplace_back(to_handle(order[i].tensor), *tier);
    }
    return (*state)->runtime->store().set_access_order(accesses);
  });
}

strata_status_t strata_runtime_flush(strata_runtime_t* runtime) {
  return boundary("strata_runtime_flush", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    return (*state)->runtime->store().flush();
  });
}

strata_status_t strata_runtime_stats(strata_runtime_t* runtime, strata_stats_t* out) {
  return boundary("strata_runtime_stats", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    fill((*state)->runtime->store().stats(), *out);
    return absl::OkStatus();
  });
}

// ---- Streams ------------------------------------------------------------------------------------

strata_status_t strata_stream_create(strata_runtime_t* runtime, strata_stream_t** out) {
  return boundary("strata_stream_create", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    auto stream = (*state)->runtime->device().create_stream();
    if (!stream.ok()) return stream.status();
    auto child = std::make_shared<StreamState>();
    child->kind = Kind::kStream;
    child->owner = (*state)->shared_from_this();
    child->stream = *std::move(stream);
    // Registered under the runtime's lock: its destroy then sees the child in its list.
    strata::MutexLock lock(&(*state)->mu);
    (*state)->children.push_back(Registry::get().add(Entry{Kind::kStream, nullptr, child}));
    *out = handle_of<strata_stream_t>(child->id);
    return absl::OkStatus();
  });
}

strata_status_t strata_stream_destroy(strata_stream_t* stream) {
  return boundary("strata_stream_destroy",
                  [&] { return destroy_child(id_of(stream), Kind::kStream, "stream"); });
}

strata_status_t strata_stream_synchronize(strata_stream_t* stream) {
  return boundary("strata_stream_synchronize", [&]() -> absl::Status {
    Call call;
    auto s = call.stream(stream, "stream");
    if (!s.ok()) return s.status();
    return (*s)->owner->runtime->device().synchronize(*(*s)->stream);
  });
}

// ---- Tensors ------------------------------------------------------------------------------------

strata_status_t strata_tensor_create(strata_runtime_t* runtime, const char* name, uint64_t bytes,
                                     strata_tier_t home, strata_tensor_t* out) {
  return boundary("strata_tensor_create", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = strata_tensor_t{};
    if (bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("bytes is ", bytes, ": too large"));
    }
    return create_tensor(runtime, name, bytes, home, STRATA_DTYPE_UINT8,
                         {static_cast<int64_t>(bytes)}, out);
  });
}

strata_status_t strata_tensor_create_ex(strata_runtime_t* runtime, const char* name,
                                        strata_dtype_t dtype, const int64_t* shape, size_t ndim,
                                        strata_tier_t home, strata_tensor_t* out) {
  return boundary("strata_tensor_create_ex", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = strata_tensor_t{};
    auto bytes = shaped_bytes(dtype, shape, ndim);
    if (!bytes.ok()) return bytes.status();
    std::vector<int64_t> dims(shape, shape + ndim);
    return create_tensor(runtime, name, *bytes, home, dtype, std::move(dims), out);
  });
}

strata_status_t strata_tensor_destroy(strata_tensor_t tensor) {
  return boundary("strata_tensor_destroy", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime_of(tensor, "tensor");
    if (!state.ok()) return state.status();
    RuntimeState& s = **state;
    if (auto status = s.runtime->store().destroy(to_handle(tensor)); !status.ok()) return status;
    strata::MutexLock lock(&s.mu);
    // A create in between may have reused the index already, with a newer generation.
    const auto it = s.meta.find(tensor.index);
    if (it != s.meta.end() && it->second.generation == tensor.generation) s.meta.erase(it);
    return absl::OkStatus();
  });
}

strata_status_t strata_tensor_find(strata_runtime_t* runtime, const char* name,
                                   strata_tensor_t* out) {
  return boundary("strata_tensor_find", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = strata_tensor_t{};
    Call call;
    auto state = call.runtime(runtime, "runtime");
    if (!state.ok()) return state.status();
    if (name == nullptr) return null_argument("name");
    auto handle = (*state)->runtime->store().find(name);
    if (!handle.ok()) return handle.status();
    *out = to_c(**state, *handle);
    return absl::OkStatus();
  });
}

strata_status_t strata_tensor_info(strata_tensor_t tensor, strata_tensor_info_t* out) {
  return boundary("strata_tensor_info", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime_of(tensor, "tensor");
    if (!state.ok()) return state.status();
    if (out == nullptr) return null_argument("out");
    RuntimeState& s = **state;
    auto info = s.runtime->store().info(to_handle(tensor));
    if (!info.ok()) return info.status();
    strata_tensor_info_t result{};
    result.bytes = info->bytes;
    result.home = tier_to_c(info->home);
    result.dtype = STRATA_DTYPE_UINT8;  // tensors made in C++ (the optimizer's) are bytes
    result.ndim = 1;
    result.shape[0] = static_cast<int64_t>(info->bytes);
    strata::MutexLock lock(&s.mu);
    const auto it = s.meta.find(tensor.index);
    if (it != s.meta.end() && it->second.generation == tensor.generation) {
      result.dtype = it->second.dtype;
      result.ndim = static_cast<int32_t>(it->second.shape.size());
      for (size_t i = 0; i < STRATA_MAX_NDIM; ++i) {
        result.shape[i] = i < it->second.shape.size() ? it->second.shape[i] : 0;
      }
    }
    *out = result;
    return absl::OkStatus();
  });
}

strata_status_t strata_tensor_name(strata_tensor_t tensor, char* buffer, size_t size,
                                   size_t* length) {
  return boundary("strata_tensor_name", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime_of(tensor, "tensor");
    if (!state.ok()) return state.status();
    auto info = (*state)->runtime->store().info(to_handle(tensor));
    if (!info.ok()) return info.status();
    return copy_out(info->name, buffer, size, length);
  });
}

strata_status_t strata_tensor_acquire(strata_tensor_t tensor, strata_tier_t tier,
                                      strata_stream_t* stream, strata_access_mode_t mode,
                                      void** out) {
  return boundary("strata_tensor_acquire", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    Call call;
    auto used = tensor_and_stream(call, tensor, stream);
    if (!used.ok()) return used.status();
    auto kind = tier_from(tier, "tier");
    if (!kind.ok()) return kind.status();
    auto access = mode_from(mode);
    if (!access.ok()) return access.status();
    auto address = used->first->runtime->store().acquire(to_handle(tensor), *kind,
                                                         *used->second->stream, *access);
    if (!address.ok()) return address.status();
    *out = *address;
    return absl::OkStatus();
  });
}

strata_status_t strata_tensor_release(strata_tensor_t tensor, strata_stream_t* stream) {
  return boundary("strata_tensor_release", [&]() -> absl::Status {
    Call call;
    auto used = tensor_and_stream(call, tensor, stream);
    if (!used.ok()) return used.status();
    return used->first->runtime->store().release(to_handle(tensor), *used->second->stream);
  });
}

strata_status_t strata_tensor_prefetch(strata_tensor_t tensor, strata_tier_t tier) {
  return boundary("strata_tensor_prefetch", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime_of(tensor, "tensor");
    if (!state.ok()) return state.status();
    auto kind = tier_from(tier, "tier");
    if (!kind.ok()) return kind.status();
    return (*state)->runtime->store().prefetch(to_handle(tensor), *kind);
  });
}

strata_status_t strata_tensor_evict(strata_tensor_t tensor, strata_tier_t tier) {
  return boundary("strata_tensor_evict", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime_of(tensor, "tensor");
    if (!state.ok()) return state.status();
    auto kind = tier_from(tier, "tier");
    if (!kind.ok()) return kind.status();
    return (*state)->runtime->store().evict(to_handle(tensor), *kind);
  });
}

strata_status_t strata_tensor_discard(strata_tensor_t tensor) {
  return boundary("strata_tensor_discard", [&]() -> absl::Status {
    Call call;
    auto state = call.runtime_of(tensor, "tensor");
    if (!state.ok()) return state.status();
    return (*state)->runtime->store().discard(to_handle(tensor));
  });
}

}  // extern "C"
