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
#include "strata/config/cpu_pool_settings.h"
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

// The two launch variables (torchrun's) that the configuration reads with the STRATA_* ones:
// the device and the memory budgets depend on where this rank sits on its node. The others
// (RANK, WORLD_SIZE, MASTER_*) are the communication floor's (comm/launch.h).
inline constexpr std::string_view kLocalRank = "LOCAL_RANK";
inline constexpr std::string_view kLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr int kMaxLocalRanks = 1 << 20;

struct LocalRanks {
  std::optional<int> rank;        // LOCAL_RANK: 0 .. LOCAL_WORLD_SIZE-1
  std::optional<int> world_size;  // LOCAL_WORLD_SIZE: ranks on this node
  // Where they came from when srun's variables stood in for torch's ("srun task SLURM_PROCID=1
  // of SLURM_NTASKS=2", strata/config/slurm.h); empty for torch's own.
  std::string source;
  // Ranks sharing this node's memory: LOCAL_WORLD_SIZE, 1 when unset.
  int count() const { return world_size.value_or(1); }
};

struct Config {
  Backend backend = Backend::kAuto;
  // nullopt (STRATA_DEVICE unset): LOCAL_RANK when set (torchrun's convention), else 0; see
  // choose_device().
  std::optional<int> device;
  // nullopt: 80% on cuda, 1GiB on host. A percentage is of this rank's share: on cuda, the
  // selected GPU's total memory divided among the local ranks that share it
  // (DeviceChoice::sharing), at most its free memory; on the host backend, this rank's share of
  // physical memory (RAM / LOCAL_WORLD_SIZE), since its "device" memory is host memory.
  std::optional<SizeSetting> gpu_bytes;
  // A percentage is of this rank's share of physical memory: RAM / LOCAL_WORLD_SIZE.
  SizeSetting cpu_bytes = SizeSetting::of_percent(25);
  std::vector<std::string> nvme_paths;                                // empty: no NVMe tier
  SizeSetting nvme_bytes = SizeSetting::of_bytes(uint64_t{8} << 30);  // per path; % of free space
  IoEngineKind io_engine = IoEngineKind::kAuto;
  uint32_t io_depth = 32;
  uint64_t io_block = uint64_t{1} << 20;
  uint64_t staging_bytes = uint64_t{256} << 20;
  bool verify = true;
  LogLevel log = LogLevel::kWarn;
  CommSettings comm;          // STRATA_COMM_BACKEND, STRATA_COMM_TIMEOUT, STRATA_COMM_DEBUG
  CpuPoolSettings adam_pool;  // STRATA_ADAM_THREADS, STRATA_ADAM_RESERVE, STRATA_ADAM_PIN
  LocalRanks local;           // LOCAL_RANK, LOCAL_WORLD_SIZE

  // Reads the process environment.
  static absl::StatusOr<Config> from_environment();
  // The STRATA_* variables of the process environment, the launch variables the local ranks
  // come from (LOCAL_RANK, LOCAL_WORLD_SIZE, and RANK, WORLD_SIZE and srun's SLURM_* that stand
  // in for them, strata/config/slurm.h) where set, for callers that add overrides.
  static std::map<std::string, std::string> environment_variables();
  // Same, from a name → value map; other names not starting with STRATA_ are ignored. Without
  // any of torch's launch variables, an srun task's SLURM_LOCALID and tasks per node give
  // LocalRanks.
  static absl::StatusOr<Config> from_variables(const std::map<std::string, std::string>& vars);
};

// Which device this rank uses, why, and how many local ranks are taken to share it.
struct DeviceChoice {
  int ordinal = 0;
  // "from LOCAL_RANK=3 (STRATA_DEVICE unset)", "from STRATA_DEVICE=1", "neither STRATA_DEVICE
  // nor LOCAL_RANK is set", or the CUDA_VISIBLE_DEVICES case.
  std::string reason;
  // Local ranks assumed to use this device (its memory budget is divided among them): 1 when
  // LOCAL_RANK picks (one device per rank) or a CUDA_VISIBLE_DEVICES set for this rank shows it
  // one device; every local rank (LOCAL_WORLD_SIZE) when a CUDA_VISIBLE_DEVICES showing one
  // device, or STRATA_DEVICE, is inherited from the launch (the parent process has the same
  // value: MachineInfo::parent), and with neither STRATA_DEVICE nor LOCAL_RANK set (all use 0);
  // with STRATA_DEVICE set per rank, the fewest per device that LOCAL_WORLD_SIZE ranks over the
  // visible devices allow (ceil(ranks / devices)). Always 1 on the host backend, whose "device"
  // memory is this rank's share of RAM.
  int sharing = 1;
  std::string sharing_reason;  // empty when sharing is 1 for want of other local ranks
};

// The device for `config` on `machine` (backend, gpu_count, cuda_visible_devices and parent
// used; gpu ignored). STRATA_DEVICE set wins; else LOCAL_RANK; else 0. On cuda, a number that is
// not below machine.gpu_count is an error naming LOCAL_RANK, STRATA_DEVICE and the count —
// except that with STRATA_DEVICE unset and exactly one device visible through
// CUDA_VISIBLE_DEVICES, that device (0) is the rank's: its own when the variable was set for this
// rank (Slurm's --gpus-per-task, per-rank wrappers) or when that cannot be told, shared by every
// local rank when it is inherited from the launch. On the host backend the number is unused and
// not range-checked, but chosen and explained the same way.
absl::StatusOr<DeviceChoice> choose_device(const Config& config, const MachineInfo& machine);

struct ResolvedConfig {
  Backend backend = Backend::kHost;  // kCuda or kHost, never kAuto
  std::string backend_reason;
  int device = 0;
  std::string device_reason;  // DeviceChoice::reason
  int gpu_sharing = 1;        // DeviceChoice::sharing
  std::string gpu_sharing_reason;
  // The local ranks the GPU arena was sized for, which the runtime tells its device
  // (Device::set_budget_sharing) and the communicator checks against the ranks that really
  // share the GPU: gpu_sharing when STRATA_GPU_BYTES is a percentage on cuda (a share of the
  // GPU); 0 when it is a size (the user's own figure: whether the arenas fit is the
  // allocation's to say) and on the host backend.
  int gpu_budget_sharing = 0;
  std::optional<int> local_rank;  // LOCAL_RANK as set
  int local_ranks = 1;            // LOCAL_WORLD_SIZE (1 when unset): ranks sharing this node's RAM
  std::string local_source;       // LocalRanks::source
  uint64_t gpu_bytes = 0;
  uint64_t cpu_bytes = 0;
  // How a percentage was turned into bytes ("25% of this rank's share of RAM (125.00 GiB /
  // LOCAL_WORLD_SIZE=4 = 31.25 GiB)"); empty for absolute sizes.
  std::string gpu_bytes_basis;
  std::string cpu_bytes_basis;
  std::vector<std::string> nvme_paths;
  uint64_t nvme_bytes = 0;  // per path; 0 when there is no NVMe tier
  // The NVMe floor's decision (decide_io_engine) from the requested kind and the machine's
  // io_uring probe: the kind (never kAuto), what was asked, why, and the warning when auto fell
  // back to psync (also in `warnings`; empty without an NVMe tier, where psync costs nothing).
  IoEngineDecision io_engine;
  uint32_t io_depth = 0;
  uint64_t io_block = 0;
  uint64_t staging_bytes = 0;
  bool verify = true;
  LogLevel log = LogLevel::kWarn;
  CommSettings comm;  // as configured (the backend is chosen when a communicator is created)
  // As configured; checked against the CPUs this process may run on. The CPUs themselves are
  // chosen when an optimizer's pool first runs (offload/cpu_pool.h), next to its states.
  CpuPoolSettings adam_pool;
  // Things that work but not as well as they could (e.g. the CPU tier above RLIMIT_MEMLOCK, so
  // it will not all be registered with io_uring). Printed by strata-info, logged by the runtime.
  std::vector<std::string> warnings;
};

// The most this rank registers with io_uring as fixed buffers, which RLIMIT_MEMLOCK limits:
// the whole pinned CPU tier (staging is carved from it), once per NVMe path, since each path's
// ring registers it; 0 without an NVMe tier or with psync. Registration is lazy: a piece of the
// tier is registered when the tier first uses it and stays registered (runtime/swap_config.cc,
// nvme/uring_buffers.cc), so this is what is registered once the tier has filled; at start it is
// much less (Runtime::startup() has the figure so far). The one place that knows how
// registration is laid out: change it with the swap space.
uint64_t io_uring_registered_bytes(const ResolvedConfig& config);

// The kernel charges registered buffers to the user (user->locked_vm), so the local ranks of a
// node, run as one user, share one RLIMIT_MEMLOCK: io_uring_registered_bytes × local_ranks.
uint64_t io_uring_registered_bytes_per_user(const ResolvedConfig& config);

// Sizes to bytes and every check against the machine. `machine.backend` must be set (kCuda or
// kHost, from choose_backend), on cuda with gpu_count and, for the device choose_device()
// picks, gpu; `machine.paths` must hold every path in config.nvme_paths. probe_machine_for()
// fills all of it. Percentages are of this rank's share: RAM / LOCAL_WORLD_SIZE, and the GPU's
// total memory divided among the local ranks that share it (DeviceChoice::sharing), at most its
// free memory. Absolute
// sizes must fit the machine when every local rank asks the same (the ranks of a launch share
// one environment): size × LOCAL_WORLD_SIZE against RAM, size × sharing against the GPU.
absl::StatusOr<ResolvedConfig> resolve(const Config& config, const MachineInfo& machine);

// probe_machine, then the device layer's facts for `config`: the backend, the visible CUDA
// devices and the chosen GPU (choose_device). A device out of range is not an error here:
// machine.gpu stays empty and resolve() names the variables, so strata-info can still print
// what the machine offers.
absl::StatusOr<MachineInfo> probe_machine_for(const Config& config);

// probe_machine_for → resolve: what the runtime and strata-info do at start.
absl::StatusOr<std::pair<ResolvedConfig, MachineInfo>> load_configuration(const Config& config);

// Aligned "STRATA_NAME = value" lines, one per variable and then LOCAL_RANK and
// LOCAL_WORLD_SIZE, each ending in '\n'. Sizes given as percentages say what they are of.
std::string render(const ResolvedConfig& config);

}  // namespace strata
