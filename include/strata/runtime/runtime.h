// Runtime: everything a trainer needs, built from the STRATA_* configuration — the device, the
// GPU arena, the pinned CPU tier, the NVMe swap space and its staging budget, and the
// TensorStore over them.
//
//   auto runtime = strata::Runtime::from_environment();
//   strata::TensorStore& store = (*runtime)->store();
#pragma once

#include <absl/status/statusor.h>

#include <memory>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/nvme/swap_space.h"
#include "strata/store/staging.h"
#include "strata/store/tensor_store.h"
#include "strata/store/tier.h"

namespace strata {

class FaultInjector;

struct RuntimeOptions {
  TensorStoreOptions store;
  // A device to use instead of the configured one (e.g. a throttled HostDevice for
  // simulations). Its backend must match the resolved configuration's.
  std::unique_ptr<Device> device;
  // Tests: faults to inject into the NVMe tier's I/O.
  std::shared_ptr<FaultInjector> nvme_faults;
  // The pinned CPU tier is pinned, and registered with io_uring, in pieces of this size as it
  // fills (0: 64 MiB; see MemoryTier::create_pinned_cpu). Tests use small pieces.
  uint64_t cpu_piece_bytes = 0;
};

// What starting the runtime cost, and what pinning the CPU tier has cost since (it is pinned
// with the device, and registered with io_uring, piece by piece as it fills: docs/nvme.md).
struct StartupStats {
  double create_seconds = 0;  // Runtime::create, from its call to its return
  PinningStats pinning;       // the CPU tier's pieces (device pinning, io_uring listener)
  // io_uring registration of those pieces so far, summed over the rings (IoStats); zero
  // without an NVMe tier or with psync.
  uint64_t registered_bytes = 0;
  uint64_t registrations = 0;
  double registration_seconds = 0;
  uint64_t registration_failures = 0;
  uint32_t rings = 0;  // io_uring rings (one per NVMe path); 0 without io_uring
};

// Lines for people (strata-info --start, offload-bench): the time to create, then how the CPU
// tier is pinned and registered and how much so far.
std::string to_string(const StartupStats& stats);

class Runtime {
 public:
  static absl::StatusOr<std::unique_ptr<Runtime>> from_environment(RuntimeOptions options = {});
  // `config` as read from the environment and overridden from C++.
  static absl::StatusOr<std::unique_ptr<Runtime>> create(const Config& config,
                                                         RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Device& device() { return *device_; }
  MemoryTier& gpu() { return *gpu_; }
  MemoryTier& cpu() { return *cpu_; }
  SwapSpace* nvme() { return nvme_.get(); }  // null without STRATA_NVME_PATHS
  StagingPool* staging() { return staging_.get(); }
  TensorStore& store() { return *store_; }
  const ResolvedConfig& config() const { return config_; }
  StartupStats startup() const;
  // Blocks until the background io_uring registration of every CPU-tier piece in use so far
  // has finished (pieces first used later are not waited for). A trainer never needs it: I/O
  // into a piece not yet registered works, unregistered. For measurements: a benchmark calls
  // it, untimed, before a timed region, so that the registration does not share the machine
  // with the timed work (docs/nvme.md). Returns at once without an NVMe tier.
  void wait_for_registration() const;
  // Degraded but working (psync fallback, buffered swap, ...). create() already logged each
  // once per process through log::warn_once (unless STRATA_LOG=error); this is the full list.
  const std::vector<std::string>& warnings() const { return warnings_; }

  Runtime() = default;  // use create()

 private:
  ResolvedConfig config_;
  std::vector<std::string> warnings_;
  double create_seconds_ = 0;
  // Destroyed in reverse: the store first, the device last.
  std::unique_ptr<Device> device_;
  std::unique_ptr<MemoryTier> gpu_;
  std::unique_ptr<MemoryTier> cpu_;
  std::unique_ptr<SwapSpace> nvme_;
  std::unique_ptr<StagingPool> staging_;
  std::unique_ptr<TensorStore> store_;
};

}  // namespace strata
