// STRATA_COMM_BACKEND=auto, agreed by every rank. Each rank posts what it can do (a CUDA device,
// NCCL loaded) to the rendezvous and reads every rank's; all see the same table and reach the
// same verdict: NCCL when every rank can use it, Gloo when none can, and otherwise the same
// error on every rank naming the ranks without NCCL or without a GPU, and the fix. Never a
// silent split (some ranks on NCCL, the others on Gloo, each waiting for the other forever).
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/tcp_store.h"
#include "strata/config/comm_settings.h"

namespace strata::comm_internal {

struct CommCapability {
  bool cuda_device = false;  // the communicator's device is a GPU
  bool nccl = false;         // this build has the NCCL backend and NCCL loaded

  bool can_use_nccl() const { return cuda_device && nccl; }
  std::string encode() const;
  static absl::StatusOr<CommCapability> decode(std::string_view text);
};

// This rank's capability. STRATA_TESTING_CLAIM_NCCL=1 (tests only) makes the rank claim a GPU
// and NCCL, so that a mixed job can be tested on a machine without either.
CommCapability local_capability(bool cuda_device);

// The verdict on every rank's capability (`by_rank[r]` is rank r's): kNccl, kGloo, or
// FailedPrecondition naming the ranks that cannot use NCCL while others can.
absl::StatusOr<CommBackendKind> choose_backend(const std::vector<CommCapability>& by_rank);

// The warning for a CUDA device that `auto` left on Gloo, or "" when there is none to give (no
// CUDA device, or another verdict). `nccl_built`/`build_note`: nccl_backend_built() and
// nccl_backend_note(); `library_error`: why the NCCL library was not loaded (where built).
std::string gloo_on_cuda_warning(CommBackendKind agreed, bool cuda_device, bool nccl_built,
                                 std::string_view build_note, std::string_view library_error);

// Posts `mine` as rank `rank`'s capability, reads every rank's (waiting up to the store's
// timeout: an error names the ranks that never posted) and returns choose_backend's verdict.
absl::StatusOr<CommBackendKind> agree_on_backend(TcpStore& store, int rank, int world_size,
                                                 const CommCapability& mine);

}  // namespace strata::comm_internal
