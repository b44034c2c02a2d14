#include "backend_agreement.h"

#include <cstdlib>

#include "store_exchange.h"
#include "strata/base/text.h"
#include "strata/comm/nccl_library.h"

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

constexpr std::string_view kCapabilityPrefix = "strata/capability/";

}  // namespace

std::string CommCapability::encode() const {
  return cat("gpu=", cuda_device ? 1 : 0, ";nccl=", nccl ? 1 : 0);
}

absl::StatusOr<CommCapability> CommCapability::decode(std::string_view text) {
  if (text.size() != 12 || text.substr(0, 4) != "gpu=" || text.substr(5, 6) != ";nccl=" ||
      (text[4] != '0' && text[4] != '1') || (text[11] != '0' && text[11] != '1')) {
    return absl::InvalidArgumentError(
        to_absl(cat("an unreadable capability \"", text, "\": is every rank this build?")));
  }
  return CommCapability{.cuda_device = text[4] == '1', .nccl = text[11] == '1'};
}

CommCapability local_capability(bool cuda_device) {
  if (const char* claim = std::getenv("STRATA_TESTING_CLAIM_NCCL");
      claim != nullptr && std::string_view(claim) == "1") {
    return CommCapability{.cuda_device = true, .nccl = true};
  }
  // NCCL is searched only where it could be used: a rank without a GPU never loads it.
  const bool nccl = cuda_device && nccl_backend_built() && nccl_library().found();
  return CommCapability{.cuda_device = cuda_device, .nccl = nccl};
}

absl::StatusOr<CommBackendKind> choose_backend(const std::vector<CommCapability>& by_rank) {
  std::vector<int> without_gpu, without_nccl;
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) {
    if (!by_rank[r].cuda_device) {
      without_gpu.push_back(r);
    } else if (!by_rank[r].nccl) {
      without_nccl.push_back(r);
    }
  }
  const size_t unable = without_gpu.size() + without_nccl.size();
  if (unable == 0) return CommBackendKind::kNccl;
  if (unable == by_rank.size()) return CommBackendKind::kGloo;
  std::vector<int> able;
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) {
    if (by_rank[r].can_use_nccl()) able.push_back(r);
  }
  std::string message =
      cat("STRATA_COMM_BACKEND=auto: the ranks cannot agree on a communicator: ", name_ranks(able),
          " can use NCCL (a GPU and NCCL found) but");
  std::string fix = "Fix: set STRATA_COMM_BACKEND=gloo on every rank";
  if (!without_nccl.empty()) {
    message += cat(" ", name_ranks(without_nccl), " found no NCCL");
    fix +=
        cat(", or install NCCL where it is missing (pip install ", nccl_wheel(),
            ", or set STRATA_NCCL_LIBRARY; strata-info shows where NCCL was searched)");
  }
  if (!without_gpu.empty()) {
    message += cat(without_nccl.empty() ? " " : " and ", name_ranks(without_gpu),
                   without_gpu.size() == 1 ? " has" : " have", " no GPU");
    fix += ", or give every rank a GPU";
  }
  return absl::FailedPreconditionError(
      to_absl(cat(message, ". Every rank must use the same backend. ", fix, ".")));
}

std::string gloo_on_cuda_warning(CommBackendKind agreed, bool cuda_device, bool nccl_built,
                                 std::string_view build_note, std::string_view library_error) {
  if (agreed != CommBackendKind::kGloo || !cuda_device) return "";
  const std::string_view head =
      "STRATA_COMM_BACKEND=auto: using Gloo on a CUDA device (its collectives go through host "
      "memory, slower than NCCL; STRATA_COMM_BACKEND=gloo chooses this without a warning): ";
  if (!nccl_built) return cat(head, "this build of strata has no NCCL backend (", build_note, ")");
  return cat(head, library_error);
}

absl::StatusOr<CommBackendKind> agree_on_backend(TcpStore& store, int rank, int world_size,
                                                 const CommCapability& mine) {
  const std::string who = cat("rank ", rank, " of ", world_size);
  absl::StatusOr<std::vector<CommCapability>> all =
      exchange_records(store, kCapabilityPrefix, rank, world_size, mine,
                       "the ranks did not all tell what they can use (STRATA_COMM_BACKEND=auto)");
  if (!all.ok()) return all.status();
  absl::StatusOr<CommBackendKind> verdict = choose_backend(*all);
  if (!verdict.ok()) {
    return absl::Status(verdict.status().code(),
                        to_absl(cat(who, ": ", verdict.status().message())));
  }
  return verdict;
}

}  // namespace strata::comm_internal
