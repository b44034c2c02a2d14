// Runtime configuration: STRATA_* environment variables, overridable from C++.
//
//   Config        what the user asked for (syntax checked, sizes may be percentages)
//   ResolvedConfig  every size in bytes, checked against the machine (resolve())
//
// Errors name the variable, the value and the accepted form. When several variables are wrong,
// every error is reported, one per line, in the order of the table in docs/configuration.md;
// the status code is the first error's. See docs/configuration.md for each variable.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/base/log.h"
#include "strata/base/size.h"
#include "strata/config/comm_settings.h"
#include "strata/config/machine_info.h"
#include "strata/device/backend_kind.h"
#include "strata/nvme/io_engine_kind.h"

namespace strata {

std::string_view to_string(LogLevel level);  // to_string(IoEngineKind): io_engine_kind.h

// Enum words, case-insensitive. Errors start with the quoted text ("'gpu' is not a backend:
// use auto, cuda or host"); callers prefix the variable or flag name.
absl::StatusOr<Backend> parse_backend(std::string_view text);
absl::StatusOr<IoEngineKind> parse_io_engine(std::string_view text);
absl::StatusOr<LogLevel> parse_log_level(std::string_view text);
// on/off, 1/0, true/false, yes/no.
absl::StatusOr<bool> parse_switch(std::string_view text);

// Every variable strata reads, in documentation order.
const std::vector<std::string_view>& known_variables();

// Limits checked by from_variables() and again by resolve() (for values set from C++). The I/O
// depth's range is the NVMe floor's (kMaxIoDepth, check_io_depth in io_engine.h).
inline constexpr uint64_t kIoBlockAlignment = 4096;
inline constexpr uint64_t kMaxIoBlock = uint64_t{64} << 20;

struct Config {
  Backend backend = Backend::kAuto;
  int device = 0;
  // nullopt: 80% of free device memory on cuda, 1GiB on host. A percentage is of free device
  // memory on cuda and of physical memory on the host backend.
  std::optional<SizeSetting> gpu_bytes;
  SizeSetting cpu_bytes = SizeSetting::of_percent(25);  // percentage of physical memory
  std::vector<std::string> nvme_paths;                  // empty: no NVMe tier
  SizeSetting nvme_bytes = SizeSetting::of_bytes(uint64_t{8} << 30);  // per path; % of free space
  IoEngineKind io_engine = IoEngineKind::kAuto;
  uint32_t io_depth = 32;
  uint64_t io_block = uint64_t{1} << 20;
  uint64_t staging_bytes = uint64_t{256} << 20;
  bool verify = true;
  LogLevel log = LogLevel::kWarn;
  CommSettings comm;  // STRATA_COMM_BACKEND, STRATA_COMM_TIMEOUT, STRATA_COMM_DEBUG

  // Reads the process environment.
  static absl::StatusOr<Config> from_environment();
  // The STRATA_* variables of the process environment, for callers that add overrides.
  static std::map<std::string, std::string> environment_variables();
  // Same, from a name → value map; names not starting with STRATA_ are ignored.
  static absl::StatusOr<Config> from_variables(const std::map<std::string, std::string>& vars);
};

struct ResolvedConfig {
  Backend backend = Backend::kHost;  // kCuda or kHost, never kAuto
  std::string backend_reason;
  int device = 0;
  uint64_t gpu_bytes = 0;
  uint64_t cpu_bytes = 0;
  std::vector<std::string> nvme_paths;
  uint64_t nvme_bytes = 0;                                 // per path; 0 when there is no NVMe tier
  IoEngineKind io_engine = IoEngineKind::kPsync;           // kIoUring or kPsync, never kAuto
  IoEngineKind io_engine_requested = IoEngineKind::kAuto;  // as the user asked (may be kAuto)
  std::string io_engine_reason;                            // from decide_io_engine: why io_engine
  std::string io_engine_warning;  // set when auto fell back to psync (also in `warnings`)
  uint32_t io_depth = 0;
  uint64_t io_block = 0;
  uint64_t staging_bytes = 0;
  bool verify = true;
  LogLevel log = LogLevel::kWarn;
  CommSettings comm;  // as configured (the backend is chosen when a communicator is created)
  // Things that work but not as well as they could (e.g. staging above RLIMIT_MEMLOCK, so
  // buffers are not registered with io_uring). Printed by strata-info, logged by the runtime.
  std::vector<std::string> warnings;
};

// Sizes to bytes and every check against the machine. `machine.backend` must be set (kCuda or
// kHost, from choose_backend) and `machine.paths` must hold every path in config.nvme_paths.
absl::StatusOr<ResolvedConfig> resolve(const Config& config, const MachineInfo& machine);

// probe_machine → choose_backend → resolve: what the runtime and strata-info do at start.
absl::StatusOr<std::pair<ResolvedConfig, MachineInfo>> load_configuration(const Config& config);

// Aligned "STRATA_NAME = value" lines, one per variable, each ending in '\n'.
std::string render(const ResolvedConfig& config);

}  // namespace strata
