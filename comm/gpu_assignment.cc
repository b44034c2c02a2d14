#include "gpu_assignment.h"

#include <absl/strings/numbers.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <map>
#include <utility>

#include "store_exchange.h"
#include "strata/base/mutex.h"
#include "strata/base/text.h"
#include "strata/testing/simulated_gpu.h"

namespace strata {
namespace {

// The GPU a test makes every communicator of this process claim (strata/testing/simulated_gpu.h).
struct Simulation {
  absl::Mutex mutex;
  std::optional<testing::SimulatedGpu> gpu ABSL_GUARDED_BY(mutex);
};

Simulation& simulation() {
  static Simulation s;
  return s;
}

}  // namespace

void testing::simulate_gpu_for_testing(std::optional<SimulatedGpu> gpu) {
  Simulation& s = simulation();
  MutexLock lock(&s.mutex);
  s.gpu = std::move(gpu);
}

}  // namespace strata

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

constexpr std::string_view kGpuPrefix = "strata/gpu/";
constexpr std::string_view kClaimPrefix = "strata/gpu-claim/";

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(text::trim(id));
}

}  // namespace

GpuIdentity GpuIdentity::on_this_machine(std::string bus_id, int ordinal) {
  GpuIdentity identity;
  identity.host = host_name();
  identity.machine = cat(identity.host, "/", boot_id());
  identity.bus_id = std::move(bus_id);
  identity.ordinal = ordinal;
  return identity;
}

std::string GpuIdentity::encode() const {
  return cat(machine, "\t", host, "\t", bus_id, "\t", ordinal);
}

absl::StatusOr<GpuIdentity> GpuIdentity::decode(std::string_view text) {
  std::vector<std::string_view> fields;
  for (size_t start = 0;;) {
    const size_t tab = text.find('\t', start);
    fields.push_back(text.substr(start, tab == std::string_view::npos ? tab : tab - start));
    if (tab == std::string_view::npos) break;
    start = tab + 1;
  }
  GpuIdentity identity;
  if (fields.size() != 4 || !absl::SimpleAtoi(to_absl(fields[3]), &identity.ordinal)) {
    return absl::InvalidArgumentError(
        to_absl(cat("'", text, "' is not a GPU identity: is every rank the same strata build?")));
  }
  identity.machine = fields[0];
  identity.host = fields[1];
  identity.bus_id = fields[2];
  return identity;
}

absl::Status check_one_gpu_per_rank(const std::vector<GpuIdentity>& by_rank) {
  std::map<std::pair<std::string, std::string>, std::vector<int>> users;  // (machine, bus) → ranks
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (by_rank[r].bus_id.empty()) continue;
    users[{by_rank[r].machine, by_rank[r].bus_id}].push_back(static_cast<int>(r));
  }
  std::vector<std::vector<int>> shared;
  for (auto& [gpu, ranks] : users) {
    if (ranks.size() > 1) shared.push_back(std::move(ranks));
  }
  if (shared.empty()) return absl::OkStatus();
  // In rank order, so every rank writes the same message.
  std::sort(shared.begin(), shared.end());
  std::string message;
  for (const std::vector<int>& ranks : shared) {
    const GpuIdentity& first = by_rank[ranks.front()];
    message += cat(message.empty() ? "" : "; ", name_ranks(ranks), " share GPU ", first.ordinal,
                   " (PCI ", first.bus_id, ") on host ", first.host);
  }
  return absl::FailedPreconditionError(
      to_absl(cat(message,
                  ": NCCL needs one GPU per rank: give each rank its own (LOCAL_RANK picks it) "
                  "or set STRATA_COMM_BACKEND=gloo")));
}

absl::StatusOr<std::vector<GpuIdentity>> exchange_gpu_identities(TcpStore& store, int rank,
                                                                 int world_size,
                                                                 const GpuIdentity& mine) {
  return exchange_records(store, kGpuPrefix, rank, world_size, mine,
                          "the ranks' GPUs were not all known before NCCL's set-up");
}

GpuClaim GpuClaim::of(const Device* device) {
  GpuClaim claim;
  claim.sharing = device != nullptr ? device->budget_sharing() : 0;
  {
    Simulation& s = simulation();
    MutexLock lock(&s.mutex);
    if (s.gpu) {
      claim.gpu = GpuIdentity::on_this_machine(s.gpu->pci_bus_id, s.gpu->ordinal);
      return claim;
    }
  }
  if (device != nullptr && device->backend() == Backend::kCuda) {
    claim.gpu = GpuIdentity::on_this_machine(device->pci_bus_id(), device->ordinal());
  } else {
    claim.gpu = GpuIdentity::on_this_machine("", -1);
  }
  return claim;
}

std::string GpuClaim::encode() const { return cat(sharing, "\t", gpu.encode()); }

absl::StatusOr<GpuClaim> GpuClaim::decode(std::string_view text) {
  GpuClaim claim;
  const size_t tab = text.find('\t');
  if (tab == std::string_view::npos ||
      !absl::SimpleAtoi(to_absl(text.substr(0, tab)), &claim.sharing) || claim.sharing < 0) {
    return absl::InvalidArgumentError(to_absl(
        cat("'", text, "' is not a GPU and its budget: is every rank the same strata build?")));
  }
  absl::StatusOr<GpuIdentity> gpu = GpuIdentity::decode(text.substr(tab + 1));
  if (!gpu.ok()) return gpu.status();
  claim.gpu = *std::move(gpu);
  return claim;
}

absl::Status check_gpu_budgets(const std::vector<GpuClaim>& by_rank) {
  std::map<std::pair<std::string, std::string>, std::vector<int>> users;  // (machine, bus) → ranks
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const GpuIdentity& gpu = by_rank[r].gpu;
    if (!gpu.bus_id.empty()) users[{gpu.machine, gpu.bus_id}].push_back(static_cast<int>(r));
  }
  std::vector<std::vector<int>> over;  // the ranks of each over-committed GPU
  for (auto& [gpu, ranks] : users) {
    const int n = static_cast<int>(ranks.size());
    if (std::any_of(ranks.begin(), ranks.end(),
                    [&](int r) { return by_rank[r].sharing > 0 && by_rank[r].sharing < n; })) {
      over.push_back(std::move(ranks));
    }
  }
  if (over.empty()) return absl::OkStatus();
  // In rank order, so every rank writes the same message.
  std::sort(over.begin(), over.end());
  std::string message;
  for (const std::vector<int>& ranks : over) {
    const int n = static_cast<int>(ranks.size());
    std::map<int, std::vector<int>> short_by_sharing;  // what they assumed → the ranks
    for (int r : ranks) {
      const int sharing = by_rank[r].sharing;
      if (sharing > 0 && sharing < n) short_by_sharing[sharing].push_back(r);
    }
    std::string assumed;
    for (const auto& [sharing, short_ranks] : short_by_sharing) {
      const std::string ranks_text = cat(sharing, " rank", sharing == 1 ? "" : "s");
      if (assumed.empty()) {
        assumed = cat("the GPU arena", short_ranks.size() == 1 ? " of " : "s of ",
                      name_ranks(short_ranks), short_ranks.size() == 1 ? " was" : " were",
                      " sized for ", ranks_text, " on it");
      } else {
        assumed += cat(", of ", name_ranks(short_ranks), " for ", ranks_text);
      }
    }
    const GpuIdentity& first = by_rank[ranks.front()].gpu;
    message += cat(message.empty() ? "" : "; ", name_ranks(ranks), " share GPU ", first.ordinal,
                   " (PCI ", first.bus_id, ") on host ", first.host, " but ", assumed);
  }
  return absl::FailedPreconditionError(to_absl(cat(
      message,
      ": together their arenas over-commit the GPU (STRATA_GPU_BYTES, 80% by default, is a "
      "percentage of each rank's share of its GPU). Give each rank its own GPU (a "
      "CUDA_VISIBLE_DEVICES set per rank, or LOCAL_RANK picking among the visible devices); or, "
      "to share one, set CUDA_VISIBLE_DEVICES or STRATA_DEVICE in the launcher's environment, "
      "not per rank, so that every rank divides the GPU (docs/configuration.md, \"Which "
      "device\"); or set STRATA_GPU_BYTES to a size that the arenas of all the ranks on a GPU "
      "fit together")));
}

absl::Status check_gpu_sharing(TcpStore& store, const LaunchInfo& launch, const Device* device) {
  if (launch.world_size <= 1) return absl::OkStatus();
  absl::StatusOr<std::vector<GpuClaim>> claims =
      exchange_records(store, kClaimPrefix, launch.rank, launch.world_size, GpuClaim::of(device),
                       "the ranks' GPUs were not all known (the check of ranks sharing a GPU)");
  if (!claims.ok()) return claims.status();
  return check_gpu_budgets(*claims);
}

}  // namespace strata::comm_internal
