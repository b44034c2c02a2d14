#include "strata/runtime/runtime.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/time/clock.h>

#include "strata/base/format_bytes.h"
#include "strata/base/log.h"
#include "strata/device/backend.h"
#include "strata/runtime/swap_config.h"

namespace strata {

namespace {

// Staging chunks: whole stripe units, eight or more in the budget so NVMe reads, H2D copies
// and writes of several chunks overlap; at most 64 MiB each.
uint64_t staging_chunk(const ResolvedConfig& config) {
  const uint64_t unit = config.io_block;
  const uint64_t target = std::min<uint64_t>(config.staging_bytes / 8, uint64_t{64} << 20);
  return std::max<uint64_t>(unit, target / unit * unit);
}

// One info line with what the configuration resolved to, for STRATA_LOG=info.
void log_tiers(const ResolvedConfig& c) {
  if (!log::enabled(LogLevel::kInfo)) return;
  std::string nvme = "none";
  if (!c.nvme_paths.empty()) {
    nvme = absl::StrFormat("%s on %d path%s (%s), %s depth %u, block %s, staging %s",
                           format_bytes(c.nvme_bytes * c.nvme_paths.size()), c.nvme_paths.size(),
                           c.nvme_paths.size() == 1 ? "" : "s", absl::StrJoin(c.nvme_paths, ","),
                           to_string(c.io_engine.kind), c.io_depth, format_bytes(c.io_block),
                           format_bytes(c.staging_bytes));
  }
  STRATA_LOG(kInfo, "runtime: backend %s device %d (%s); GPU arena %s, pinned CPU %s, NVMe %s",
             to_string(c.backend), c.device, c.backend_reason, format_bytes(c.gpu_bytes),
             format_bytes(c.cpu_bytes), nvme);
}

absl::Status context(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("%s: %s", what, status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::from_environment(RuntimeOptions options) {
  auto config = Config::from_environment();
  if (!config.ok()) return config.status();
  return create(*config, std::move(options));
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::create(const Config& config,
                                                         RuntimeOptions options) {
  const absl::Time start = absl::Now();
  // STRATA_LOG (or the level set from C++) is the process's threshold from here on.
  log::set_threshold(config.log);
  auto loaded = load_configuration(config);
  if (!loaded.ok()) return loaded.status();
  auto runtime = std::make_unique<Runtime>();
  runtime->config_ = loaded->first;
  const ResolvedConfig& c = runtime->config_;
  runtime->warnings_ = c.warnings;
  // Said once per process, however many runtimes a program creates; warnings() keeps them all.
  for (const std::string& warning : c.warnings) log::warn_once(warning);

  if (options.device != nullptr) {
    if (options.device->backend() != c.backend) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the device given to Runtime::create is %s but the configuration resolved to %s "
          "(STRATA_BACKEND)",
          to_string(options.device->backend()), to_string(c.backend)));
    }
    runtime->device_ = std::move(options.device);
  } else {
    auto device = make_device(c.backend, c.device);
    if (!device.ok()) return device.status();
    runtime->device_ = *std::move(device);
  }
  // The arena is a share of the GPU: the communicator checks that no more ranks share it.
  runtime->device_->set_budget_sharing(c.gpu_budget_sharing);
  auto gpu = MemoryTier::create_gpu_arena(*runtime->device_, c.gpu_bytes);
  if (!gpu.ok()) return context(gpu.status(), "STRATA_GPU_BYTES");
  runtime->gpu_ = *std::move(gpu);
  auto cpu = MemoryTier::create_pinned_cpu(*runtime->device_, c.cpu_bytes, options.cpu_piece_bytes);
  if (!cpu.ok()) return context(cpu.status(), "STRATA_CPU_BYTES");
  runtime->cpu_ = *std::move(cpu);

  if (!c.nvme_paths.empty()) {
    SwapSpaceOptions swap_options = swap_space_options(c, runtime->cpu_.get());
    swap_options.faults = options.nvme_faults;
    auto swap = SwapSpace::create(std::move(swap_options));
    if (!swap.ok()) return swap.status();
    runtime->nvme_ = *std::move(swap);
    // The CPU tier's pieces are registered with io_uring as they come into use, on the tier's
    // background thread (~Runtime detaches this before the swap space goes).
    runtime->cpu_->set_piece_listener(
        [swap = runtime->nvme_.get()](uint32_t piece) { (void)swap->register_buffer(piece); });
    const SwapStats stats = runtime->nvme_->stats();
    runtime->warnings_.insert(runtime->warnings_.end(), stats.warnings.begin(),
                              stats.warnings.end());
    for (const std::string& warning : stats.warnings) log::warn_once(warning);
    if (c.staging_bytes >= c.cpu_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "STRATA_STAGING_BYTES=%s leaves nothing of STRATA_CPU_BYTES=%s for tensors; raise "
          "STRATA_CPU_BYTES or lower STRATA_STAGING_BYTES",
          format_bytes(c.staging_bytes), format_bytes(c.cpu_bytes)));
    }
    auto staging = StagingPool::create(*runtime->cpu_, c.staging_bytes, staging_chunk(c));
    if (!staging.ok()) return staging.status();
    runtime->staging_ = *std::move(staging);
  }
  auto store =
      TensorStore::create(*runtime->device_, *runtime->gpu_, *runtime->cpu_, runtime->nvme_.get(),
                          runtime->staging_.get(), std::move(options.store));
  if (!store.ok()) return store.status();
  runtime->store_ = *std::move(store);
  log_tiers(c);
  runtime->create_seconds_ = absl::ToDoubleSeconds(absl::Now() - start);
  return runtime;
}

Runtime::~Runtime() {
  store_.reset();
  staging_.reset();
  // No registration may run into the swap space once it is destroyed.
  if (cpu_ != nullptr) cpu_->set_piece_listener(nullptr);
}

}  // namespace strata
