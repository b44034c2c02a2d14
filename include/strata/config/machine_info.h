// What the machine offers: memory, memlock limit, io_uring, NVMe paths and (filled in by the
// device layer) the GPU. Configuration is checked against it (strata/config/config.h) and
// strata-info prints it.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/device/backend_kind.h"
#include "strata/device/gpu_info.h"
#include "strata/nvme/io_engine_kind.h"

namespace strata {

struct PathInfo {
  std::string path;
  bool exists = false;
  bool is_directory = false;
  bool writable = false;    // access(W_OK) passed and a temporary file could be created
  std::string problem;      // why it is missing / not a directory / not writable; else empty
  uint64_t free_bytes = 0;  // available to unprivileged users (statvfs f_bavail)
  uint64_t total_bytes = 0;
  uint32_t logical_block_size = 4096;  // O_DIRECT alignment of the device below the path
  bool block_size_known = false;       // false: not found in sysfs, 4096 assumed (safe for
                                       // every device strata supports)
  std::string filesystem;              // "ext4", "xfs", "tmpfs", ... or "unknown (0x...)"
};

// The environment of the process that started this one (its parent: the launcher, or a shell
// or wrapper between the launcher and the rank), read from /proc/<pid>/environ: what it was given
// when it started. choose_device() compares this process's CUDA_VISIBLE_DEVICES and STRATA_DEVICE
// with it: the same value there was inherited from the launch (torchrun, strata-run and mpirun
// pass the user's environment through), so every local rank has it; another value was set for
// this rank (Slurm's per-task GPU binding, a per-rank wrapper).
struct ParentEnvironment {
  int pid = 0;
  // False when not probed (a MachineInfo filled by hand) or unreadable (a parent of another
  // user, such as Slurm's slurmstepd, which runs as root; no /proc): then nothing is known.
  bool readable = false;
  std::string problem;                              // why not readable
  std::optional<std::string> cuda_visible_devices;  // nullopt: unset there
  std::optional<std::string> strata_device;
};

struct MachineInfo {
  // Physical memory, lowered to the cgroup memory limit when one applies (containers).
  uint64_t physical_memory_bytes = 0;
  std::string physical_memory_source;   // "sysconf" or the cgroup file that lowered it
  uint64_t available_memory_bytes = 0;  // MemAvailable, capped by the cgroup headroom
  uint32_t cpu_count = 0;               // CPUs this process may run on
  std::string cpu_model;

  // RLIMIT_MEMLOCK soft limit (UINT64_MAX: unlimited). Buffers registered with io_uring count
  // against it unless the process has CAP_IPC_LOCK.
  uint64_t memlock_limit_bytes = 0;
  bool has_cap_ipc_lock = false;

  // The NVMe floor's probe (probe_io_uring: a real ring and a READ through it, run once per
  // process): whether io_uring works here, and what worked or why not.
  IoUringProbe io_uring;

  std::vector<PathInfo> paths;  // one per requested NVMe path, same order

  // CUDA_VISIBLE_DEVICES as this process sees it (nullopt: unset). A launcher that sets it per
  // rank (Slurm's --gpus-per-task) shows each rank its own devices, numbered from 0.
  std::optional<std::string> cuda_visible_devices;
  ParentEnvironment parent;  // the parent process's CUDA_VISIBLE_DEVICES and STRATA_DEVICE

  // Filled by the caller from the device layer (choose_backend and gpu_info in
  // strata/device/backend.h; probe_machine_for in strata/config/config.h does it all).
  std::optional<GpuInfo> gpu;  // the device choose_device() picks, on cuda
  int gpu_count = 0;           // visible CUDA devices; 0 on the host backend
  Backend backend = Backend::kAuto;
  std::string backend_reason;

  // The entry for `path`, or nullptr if it was not probed.
  const PathInfo* find_path(std::string_view path) const;
};

// Host facts; leaves gpu/gpu_count/backend/backend_reason for the caller. Paths that are missing or
// not writable are reported in PathInfo, not as errors: resolve() turns them into errors that name
// the variable. Fails only if the machine cannot be queried at all.
absl::StatusOr<MachineInfo> probe_machine(const std::vector<std::string>& nvme_paths);

// One path's facts (used by probe_machine; exposed for tests).
PathInfo probe_path(const std::string& path);

// The environment process `pid` started with (probe_machine reads getppid()'s; exposed for
// tests). Unreadable is not an error: readable is false and problem says why.
ParentEnvironment probe_parent_environment(int pid);

// Whether `bytes` of buffers can be registered with io_uring under the memlock limit.
inline bool memlock_allows(const MachineInfo& machine, uint64_t bytes) {
  return machine.has_cap_ipc_lock || machine.memlock_limit_bytes >= bytes;
}

}  // namespace strata
