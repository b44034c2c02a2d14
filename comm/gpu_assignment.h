// Which GPU each rank of a job uses, checked when a communicator is created. Every rank posts
// its GPU's identity to the rendezvous and reads everyone's; all see the same table and reach
// the same verdict, naming the ranks that share a GPU and the fix.
//  - NCCL needs one GPU per rank: ranks that share one fail its set-up with "invalid usage" and
//    a hint about the network, which sends people looking in the wrong place. Checked before
//    NCCL is asked (check_one_gpu_per_rank).
//  - On every other backend ranks may share a GPU, but each sized its GPU arena as a share of
//    it (Device::budget_sharing): more ranks on a GPU than a rank's share assumed over-commit it
//    (check_gpu_budgets, run by Communicator::create through check_gpu_sharing).
// Backend-neutral (no CUDA here): the devices name their GPU (Device::pci_bus_id), this file
// compares the names.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/launch.h"
#include "strata/comm/tcp_store.h"
#include "strata/device/device.h"

namespace strata::comm_internal {

struct GpuIdentity {
  // The same for every process on one machine, containers included: the host name and the
  // kernel's boot id (as NCCL's own host hash). Two machines never share a GPU.
  std::string machine;
  std::string host;    // the host name alone, for messages
  std::string bus_id;  // the GPU's PCI bus id ("0000:3b:00.0"); "" when unknown (never shared)
  int ordinal = -1;    // the CUDA ordinal this rank uses, for messages

  // This process's machine with the given GPU.
  static GpuIdentity on_this_machine(std::string bus_id, int ordinal);

  std::string encode() const;
  static absl::StatusOr<GpuIdentity> decode(std::string_view text);
};

// OK when no two ranks use the same GPU of the same machine; else FailedPrecondition naming
// each group of ranks that share one ("ranks 0, 1 and 2 share GPU 0 (PCI 0000:3b:00.0) on host
// node7; ...") and the fix. `by_rank[r]` is rank r's identity.
absl::Status check_one_gpu_per_rank(const std::vector<GpuIdentity>& by_rank);

// Posts `mine` as rank `rank`'s identity and reads every rank's, waiting up to the store's
// timeout for the others (an error names the ranks that never posted, or that died).
absl::StatusOr<std::vector<GpuIdentity>> exchange_gpu_identities(TcpStore& store, int rank,
                                                                 int world_size,
                                                                 const GpuIdentity& mine);

// A rank's GPU and the ranks its GPU arena was sized for (Device::budget_sharing; 0: not sized
// as a share). A rank without a GPU posts an empty bus id.
struct GpuClaim {
  GpuIdentity gpu;
  int sharing = 0;

  // This process's: its device's GPU (or the one simulated for a test: strata/testing/
  // simulated_gpu.h) and budget; no GPU for a null or host device.
  static GpuClaim of(const Device* device);

  std::string encode() const;
  static absl::StatusOr<GpuClaim> decode(std::string_view text);
};

// OK unless a GPU of a machine is used by more ranks than the arena of one of them was sized for;
// then FailedPrecondition naming, for each such GPU in rank order, its ranks, the GPU (ordinal,
// PCI id, host), what each short rank assumed, and the fix. Ranks whose arena is not a share
// (sharing 0) are counted on their GPU but assume nothing.
absl::Status check_gpu_budgets(const std::vector<GpuClaim>& by_rank);

// Posts this rank's GpuClaim::of(device), reads every rank's and returns check_gpu_budgets'
// verdict, the same on every rank. Every rank of the job must call it (a job of one rank has
// nothing to check and exchanges nothing).
absl::Status check_gpu_sharing(TcpStore& store, const LaunchInfo& launch, const Device* device);

}  // namespace strata::comm_internal
