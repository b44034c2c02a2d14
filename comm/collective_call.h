// One collective as issued: what it is, its sequence number, its sizes. Every backend builds one
// per call; it names the operation in errors, counts bytes for CommStats, and is the signature
// that ranks compare (STRATA_COMM_DEBUG) and post when something fails.
#pragma once

#include <absl/status/status.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/comm/comm_types.h"
#include "strata/comm/communicator.h"

namespace strata::comm_internal {

struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kBarrier;
  uint64_t sequence = 0;
  DataType type = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;  // reduce_scatter and all_reduce only
  int root = -1;                 // broadcast only
  // Elements per rank (all_gather, reduce_scatter) or one entry (all_reduce, broadcast).
  std::vector<uint64_t> counts;

  // A call of `kind` (sequence and counts set by the caller).
  static CollectiveCall of(CollectiveKind kind, DataType type, ReduceOp op = ReduceOp::kSum);

  uint64_t total_count() const;
  uint64_t total_bytes() const { return total_count() * element_size(type); }
  // nccl-tests' size and this rank's share of the wire (see CommStats).
  uint64_t stat_bytes() const;
  uint64_t wire_bytes(int world_size, int rank) const;

  // "all_reduce #17 (float32 sum, 1048576 elements)"
  std::string describe() const;

  // Fixed-size signature for cross-rank comparison: equal on every rank iff the calls agree.
  using Signature = std::array<uint64_t, 6>;
  Signature signature() const;
  // From signature(): enough to describe the call in an error ("broadcast #9 (root 1, ...)").
  static CollectiveCall from_signature(const Signature& signature);
};

// Checks the arguments every backend shares; errors name the operation and the fix.
absl::Status check_counts(const CollectiveCall& call, int world_size);

void add_to_stats(CommStats& stats, const CollectiveCall& call, int world_size, int rank);

// The message when the signatures of one collective differ across ranks: names each rank whose
// call differs from the majority's, with what it issued.
std::string mismatch_message(const std::vector<CollectiveCall::Signature>& by_rank, int rank);

}  // namespace strata::comm_internal
