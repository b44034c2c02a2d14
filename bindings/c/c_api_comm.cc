// The C API's communicator: a Communicator on a runtime's device, behind a handle.
#include "c_api_comm.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "strata/comm/launch.h"
#include "strata/config/config.h"

namespace strata::c_api {
namespace {

// The launch variables (torch's, torchrun's, srun's: strata/comm/launch.h) and the STRATA_*
// variables of the environment.
std::map<std::string, std::string> environment() {
  std::map<std::string, std::string> vars = Config::environment_variables();
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const size_t equals = text.find('=');
    if (equals != std::string_view::npos && strata::is_launch_variable(text.substr(0, equals))) {
      vars[std::string(text.substr(0, equals))] = std::string(text.substr(equals + 1));
    }
  }
  return vars;
}

absl::Status create_communicator(strata_runtime_t* runtime,
                                 const std::map<std::string, std::string>& vars,
                                 strata_communicator_t** out) {
  Call call;
  auto state = call.runtime(runtime, "runtime");
  if (!state.ok()) return state.status();
  std::map<std::string, std::string> launch_vars;
  std::map<std::string, std::string> strata_vars;
  for (const auto& [name, value] : vars) {
    (strata::is_launch_variable(name) ? launch_vars : strata_vars)[name] = value;
  }
  auto launch = LaunchInfo::from_variables(launch_vars);
  if (!launch.ok()) return launch.status();
  auto config = Config::from_variables(strata_vars);
  if (!config.ok()) return config.status();
  auto comm = Communicator::create(CommOptions{
      .launch = *launch, .settings = config->comm, .device = &(*state)->runtime->device()});
  if (!comm.ok()) return comm.status();
  auto child = std::make_shared<CommState>();
  child->comm = *std::move(comm);
  *out = handle_of<strata_communicator_t>(add_child(**state, Kind::kCommunicator, child));
  return absl::OkStatus();
}

// Runs `body` on the communicator behind `handle`.
template <typename Body>
absl::Status with_comm(strata_communicator_t* handle, Body&& body) {
  Call call;
  auto state = comm_of(call, handle, "comm");
  if (!state.ok()) return state.status();
  return body(*(*state)->comm);
}

}  // namespace

absl::StatusOr<CommState*> comm_of(Call& call, strata_communicator_t* handle,
                                   absl::string_view param) {
  auto child = call.child(id_of(handle), Kind::kCommunicator, param);
  if (!child.ok()) return child.status();
  return static_cast<CommState*>(*child);
}

}  // namespace strata::c_api

using namespace strata::c_api;  // NOLINT(build/namespaces): this file implements it

extern "C" {

strata_status_t strata_communicator_create_from_env(strata_runtime_t* runtime,
                                                    strata_communicator_t** out) {
  return boundary("strata_communicator_create_from_env", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    return create_communicator(runtime, environment(), out);
  });
}

strata_status_t strata_communicator_create(strata_runtime_t* runtime,
                                           const strata_setting_t* settings, size_t count,
                                           strata_communicator_t** out) {
  return boundary("strata_communicator_create", [&]() -> absl::Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    if (settings == nullptr && count > 0) return null_argument("settings (with count > 0)");
    std::map<std::string, std::string> vars = environment();
    for (size_t i = 0; i < count; ++i) {
      const strata_setting_t& setting = settings[i];
      if (setting.name == nullptr) return null_argument(absl::StrCat("settings[", i, "].name"));
      const std::string name = setting.name;
      if (!strata::is_launch_variable(name) && !absl::StartsWith(name, "STRATA_")) {
        return absl::InvalidArgumentError(
            absl::StrCat("settings[", i, "].name '", name,
                         "' is neither a launch variable (RANK, WORLD_SIZE, LOCAL_RANK, "
                         "MASTER_ADDR, MASTER_PORT) nor a STRATA_* variable"));
      }
      if (setting.value == nullptr) {
        vars.erase(name);
      } else {
        vars[name] = setting.value;
      }
    }
    return create_communicator(runtime, vars, out);
  });
}

strata_status_t strata_communicator_destroy(strata_communicator_t* comm) {
  return boundary("strata_communicator_destroy",
                  [&] { return destroy_child(id_of(comm), Kind::kCommunicator, "comm"); });
}

strata_status_t strata_communicator_rank(strata_communicator_t* comm, int32_t* out) {
  return boundary("strata_communicator_rank", [&]() -> absl::Status {
    return with_comm(comm, [&](strata::Communicator& c) -> absl::Status {
      if (out == nullptr) return null_argument("out");
      *out = c.rank();
      return absl::OkStatus();
    });
  });
}

strata_status_t strata_communicator_size(strata_communicator_t* comm, int32_t* out) {
  return boundary("strata_communicator_size", [&]() -> absl::Status {
    return with_comm(comm, [&](strata::Communicator& c) -> absl::Status {
      if (out == nullptr) return null_argument("out");
      *out = c.size();
      return absl::OkStatus();
    });
  });
}

strata_status_t strata_communicator_backend(strata_communicator_t* comm,
                                            strata_comm_backend_t* out) {
  return boundary("strata_communicator_backend", [&]() -> absl::Status {
    return with_comm(comm, [&](strata::Communicator& c) -> absl::Status {
      if (out == nullptr) return null_argument("out");
      *out = c.backend() == strata::CommBackendKind::kNccl ? STRATA_COMM_BACKEND_NCCL
                                                           : STRATA_COMM_BACKEND_GLOO;
      return absl::OkStatus();
    });
  });
}

strata_status_t strata_communicator_describe(strata_communicator_t* comm, char* buffer, size_t size,
                                             size_t* length) {
  return boundary("strata_communicator_describe", [&]() -> absl::Status {
    return with_comm(comm, [&](strata::Communicator& c) {
      return copy_out(c.description(), buffer, size, length);
    });
  });
}

strata_status_t strata_communicator_stats(strata_communicator_t* comm, strata_comm_stats_t* out) {
  return boundary("strata_communicator_stats", [&]() -> absl::Status {
    return with_comm(comm, [&](strata::Communicator& c) -> absl::Status {
      if (out == nullptr) return null_argument("out");
      const strata::CommStats s = c.stats();
      *out = strata_comm_stats_t{};
      static_assert(std::tuple_size_v<decltype(s.by_kind)> == STRATA_COLLECTIVE_COUNT);
      for (size_t i = 0; i < s.by_kind.size(); ++i) {
        const strata::CommStats::PerKind& k = s.by_kind[i];
        out->by_kind[i] = strata_comm_kind_stats_t{k.calls, k.bytes, k.wire_bytes};
      }
      out->total_bytes = s.total_bytes();
      out->total_wire_bytes = s.total_wire_bytes();
      return absl::OkStatus();
    });
  });
}

strata_status_t strata_communicator_barrier(strata_communicator_t* comm) {
  return boundary("strata_communicator_barrier", [&]() -> absl::Status {
    return with_comm(comm, [&](strata::Communicator& c) -> absl::Status {
      auto work = c.barrier();
      if (!work.ok()) return work.status();
      return (*work)->synchronize();
    });
  });
}

}  // extern "C"
