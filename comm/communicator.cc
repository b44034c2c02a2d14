#include "strata/comm/communicator.h"

#include <absl/status/status.h>

#include <numeric>
#include <vector>

#include "backend_agreement.h"
#include "gloo_communicator.h"
#include "gpu_assignment.h"
#include "job_monitor.h"
#include "strata/base/log.h"
#include "strata/base/text.h"
#include "strata/comm/nccl_library.h"
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
  if (kind == CommBackendKind::kNccl) {
    if (!nccl_backend_built()) {
      return absl::FailedPreconditionError(
          to_absl(cat("STRATA_COMM_BACKEND=nccl but this build of strata has no NCCL backend (",
                      nccl_backend_note(), "), or use STRATA_COMM_BACKEND=gloo")));
    }
    if (!cuda_device) {
      return absl::FailedPreconditionError(
          "STRATA_COMM_BACKEND=nccl needs a CUDA device (NCCL moves GPU buffers): create the "
          "communicator with the runtime's CUDA device, or use STRATA_COMM_BACKEND=gloo for "
          "host buffers");
    }
    if (const NcclSearch& nccl = nccl_library(); !nccl.found()) {
      return absl::FailedPreconditionError(
          to_absl(cat("STRATA_COMM_BACKEND=nccl: ", nccl.error.message())));
    }
  }
  if (options.launch.agent_store && options.launcher_store == nullptr &&
      options.launch.world_size > 1) {
    return absl::FailedPreconditionError(to_absl(cat(
        "TORCHELASTIC_USE_AGENT_STORE=True: torchrun started this process, and its agent serves "
        "a torch TCPStore on MASTER_ADDR:MASTER_PORT (",
        options.launch.master_addr, ":", options.launch.master_port,
        ") for the job's life, so strata's rank 0 cannot serve its rendezvous there. strata "
        "joins through that store from Python (strata.Communicator.from_environment() in the "
        "trainer's process); its C++ and C APIs do not speak torch's store protocol (it changes "
        "between torch versions): launch a C++ trainer with strata-run (strata-run -n N "
        "./trainer), or pass CommOptions::launcher_store (a LauncherStore over that store)")));
  }
  absl::StatusOr<std::unique_ptr<comm_internal::JobMonitor>> monitor =
      comm_internal::JobMonitor::join(options.launch, options.settings, options.launcher_store);
  if (!monitor.ok()) return monitor.status();
  if (kind == CommBackendKind::kAuto) {
    // Every rank must choose alike: the choice is agreed through the rendezvous.
    absl::StatusOr<CommBackendKind> agreed = comm_internal::agree_on_backend(
        (*monitor)->store(), options.launch.rank, options.launch.world_size,
        comm_internal::local_capability(cuda_device));
    if (!agreed.ok()) return agreed.status();
    kind = *agreed;
    // Every rank lacks NCCL (not built, or not found): Gloo works, on host buffers; say once
    // per process why it was not NCCL.
    const std::string warning = comm_internal::gloo_on_cuda_warning(
        kind, cuda_device, nccl_backend_built(), nccl_backend_note(),
        nccl_backend_built() ? std::string(nccl_library().error.message()) : std::string());
    if (!warning.empty()) log::warn_once(warning);
  }
  if (kind != CommBackendKind::kNccl) {
    // Ranks may share a GPU here, if their arenas divided it (NCCL's own check is stricter).
    if (absl::Status s =
            comm_internal::check_gpu_sharing((*monitor)->store(), options.launch, options.device);
        !s.ok()) {
      return s;
    }
  }
#if defined(STRATA_HAVE_NCCL)
  if (kind == CommBackendKind::kNccl) {
    return comm_internal::create_nccl_communicator(options, *std::move(monitor));
  }
#else
  if (kind == CommBackendKind::kNccl) {
    // Only a rank that claims NCCL for a test (STRATA_TESTING_CLAIM_NCCL) gets here.
    return absl::FailedPreconditionError(
        "the ranks agreed on NCCL but this build of strata has no NCCL backend: use "
        "STRATA_COMM_BACKEND=gloo");
  }
#endif
  return comm_internal::create_gloo_communicator(options, *std::move(monitor));
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
