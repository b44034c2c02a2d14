#include "strata/comm/communicator.h"

#include <absl/status/status.h>

#include <numeric>
#include <vector>

#include "gloo_communicator.h"
#include "strata/base/text.h"
#include "strata/config/config.h"
#include "strata/device/device.h"
#if defined(STRATA_HAVE_NCCL)
#include "nccl_communicator.h"
#endif

namespace strata {

using text::cat;
using text::to_absl;

uint64_t CommStats::total_bytes() const {
  uint64_t total = 0;
  for (const PerKind& k : by_kind) total += k.bytes;
  return total;
}

uint64_t CommStats::total_wire_bytes() const {
  uint64_t total = 0;
  for (const PerKind& k : by_kind) total += k.wire_bytes;
  return total;
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::create(const CommOptions& options) {
  const bool cuda_device = options.device != nullptr && options.device->backend() == Backend::kCuda;
  CommBackendKind kind = options.settings.backend;
#if defined(STRATA_HAVE_NCCL)
  constexpr bool kHaveNccl = true;
#else
  constexpr bool kHaveNccl = false;
#endif
  if (kind == CommBackendKind::kAuto) {
    kind = kHaveNccl && cuda_device ? CommBackendKind::kNccl : CommBackendKind::kGloo;
  }
  if (kind == CommBackendKind::kNccl) {
    if (!kHaveNccl) {
      return absl::FailedPreconditionError(
          "STRATA_COMM_BACKEND=nccl but this build of strata has no NCCL (CMake found no "
          "libnccl under the CUDA toolkit): install NCCL and rebuild, or use "
          "STRATA_COMM_BACKEND=gloo");
    }
    if (!cuda_device) {
      return absl::FailedPreconditionError(
          "STRATA_COMM_BACKEND=nccl needs a CUDA device (NCCL moves GPU buffers): create the "
          "communicator with the runtime's CUDA device, or use STRATA_COMM_BACKEND=gloo for "
          "host buffers");
    }
#if defined(STRATA_HAVE_NCCL)
    return comm_internal::create_nccl_communicator(options);
#endif
  }
  return comm_internal::create_gloo_communicator(options);
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::from_environment(Device* device) {
  absl::StatusOr<LaunchInfo> launch = LaunchInfo::from_environment();
  absl::StatusOr<Config> config = Config::from_environment();
  if (!launch.ok() && !config.ok()) {
    return absl::InvalidArgumentError(
        to_absl(cat(launch.status().message(), "\n", config.status().message())));
  }
  if (!launch.ok()) return launch.status();
  if (!config.ok()) return config.status();
  return create(CommOptions{.launch = *launch, .settings = config->comm, .device = device});
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> Communicator::all_gather(
    const void* send, void* recv, uint64_t count, DataType type, const CollectiveOptions& options) {
  const std::vector<uint64_t> counts(static_cast<size_t>(size()), count);
  return all_gather(send, recv, std::span<const uint64_t>(counts), type, options);
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> Communicator::reduce_scatter(
    const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
    const CollectiveOptions& options) {
  const std::vector<uint64_t> counts(static_cast<size_t>(size()), count);
  return reduce_scatter(send, recv, std::span<const uint64_t>(counts), type, op, options);
}

}  // namespace strata
