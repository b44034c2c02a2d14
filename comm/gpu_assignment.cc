#include "gpu_assignment.h"

#include <absl/strings/numbers.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <map>
#include <utility>

#include "store_exchange.h"
#include "strata/base/text.h"

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

constexpr std::string_view kGpuPrefix = "strata/gpu/";

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

}  // namespace strata::comm_internal
