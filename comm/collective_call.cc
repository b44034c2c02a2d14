#include "collective_call.h"

#include <map>
#include <numeric>

#include "strata/base/text.h"

namespace strata::comm_internal {

using text::cat;

CollectiveCall CollectiveCall::of(CollectiveKind kind, DataType type, ReduceOp op) {
  CollectiveCall call;
  call.kind = kind;
  call.type = type;
  call.op = op;
  return call;
}

uint64_t CollectiveCall::total_count() const {
  return std::accumulate(counts.begin(), counts.end(), uint64_t{0});
}

uint64_t CollectiveCall::stat_bytes() const {
  return kind == CollectiveKind::kBarrier ? 0 : total_bytes();
}

uint64_t CollectiveCall::wire_bytes(int world_size, int rank) const {
  const double n = world_size;
  const double bytes = static_cast<double>(stat_bytes());
  switch (kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      return static_cast<uint64_t>(bytes * (n - 1) / n);
    case CollectiveKind::kAllReduce:
      return static_cast<uint64_t>(bytes * 2 * (n - 1) / n);
    case CollectiveKind::kBroadcast:
      return rank == root && world_size > 1 ? stat_bytes() : 0;
    case CollectiveKind::kBarrier:
      return 0;
  }
  return 0;
}

std::string CollectiveCall::describe() const {
  std::string detail;
  const uint64_t total = total_count();
  switch (kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter: {
      const bool equal = std::all_of(counts.begin(), counts.end(),
                                     [&](uint64_t c) { return c == counts.front(); });
      detail = cat(to_string(type),
                   kind == CollectiveKind::kReduceScatter ? cat(" ", to_string(op)) : "", ", ",
                   total, " elements");
      if (!counts.empty()) {
        detail += equal ? cat(", ", counts.front(), " per rank")
                        : cat(", per rank ", text::join(counts, "/"));
      }
      break;
    }
    case CollectiveKind::kAllReduce:
      detail = cat(to_string(type), " ", to_string(op), ", ", total, " elements");
      break;
    case CollectiveKind::kBroadcast:
      detail = cat(to_string(type), ", ", total, " elements, root ", root);
      break;
    case CollectiveKind::kBarrier:
      return cat("barrier #", sequence);
  }
  return cat(to_string(kind), " #", sequence, " (", detail, ")");
}

CollectiveCall::Signature CollectiveCall::signature() const {
  // Per-rank counts are summarized by their total and a hash, enough to tell calls apart. The
  // hash must be the same in every process (absl::Hash is salted per process): FNV-1a.
  uint64_t counts_hash = 0xcbf29ce484222325;
  for (uint64_t count : counts) {
    for (int byte = 0; byte < 8; ++byte) {
      counts_hash = (counts_hash ^ ((count >> (8 * byte)) & 0xff)) * 0x100000001b3;
    }
  }
  const uint64_t first = counts.empty() ? 0 : counts.front();
  const bool equal =
      std::all_of(counts.begin(), counts.end(), [&](uint64_t c) { return c == first; });
  return {sequence,
          (static_cast<uint64_t>(kind) << 48) | (static_cast<uint64_t>(type) << 40) |
              (static_cast<uint64_t>(op) << 32) | static_cast<uint32_t>(root),
          total_count(),
          counts.size(),
          equal ? first : ~uint64_t{0},
          counts_hash};
}

CollectiveCall CollectiveCall::from_signature(const Signature& s) {
  CollectiveCall call;
  call.sequence = s[0];
  call.kind = static_cast<CollectiveKind>(s[1] >> 48);
  call.type = static_cast<DataType>((s[1] >> 40) & 0xff);
  call.op = static_cast<ReduceOp>((s[1] >> 32) & 0xff);
  call.root = static_cast<int32_t>(s[1] & 0xffffffff);
  // Equal shards come back exactly; unequal ones as their total in one entry.
  if (s[4] != ~uint64_t{0}) {
    call.counts.assign(s[3], s[4]);
  } else {
    call.counts = {s[2]};
  }
  return call;
}

absl::Status check_counts(const CollectiveCall& call, int world_size) {
  const bool per_rank =
      call.kind == CollectiveKind::kAllGather || call.kind == CollectiveKind::kReduceScatter;
  if (per_rank && call.counts.size() != static_cast<size_t>(world_size)) {
    return absl::InvalidArgumentError(cat(to_string(call.kind), " #", call.sequence, " was given ",
                                          call.counts.size(), " per-rank counts for ", world_size,
                                          " ranks: give one count per rank (", world_size, ")"));
  }
  if (call.kind == CollectiveKind::kBroadcast && (call.root < 0 || call.root >= world_size)) {
    return absl::InvalidArgumentError(cat("broadcast #", call.sequence, " has root ", call.root,
                                          ": use a rank from 0 to ", world_size - 1));
  }
  return absl::OkStatus();
}

void add_to_stats(CommStats& stats, const CollectiveCall& call, int world_size, int rank) {
  CommStats::PerKind& k = stats.by_kind[static_cast<size_t>(call.kind)];
  ++k.calls;
  k.bytes += call.stat_bytes();
  k.wire_bytes += call.wire_bytes(world_size, rank);
}

std::string mismatch_message(const std::vector<CollectiveCall::Signature>& by_rank, int rank) {
  std::map<CollectiveCall::Signature, int> votes;
  for (const auto& s : by_rank) ++votes[s];
  auto majority = votes.begin();
  for (auto it = votes.begin(); it != votes.end(); ++it) {
    if (it->second > majority->second) majority = it;
  }
  std::string message =
      cat("ranks issued different collectives: ", majority->second, " of ", by_rank.size(),
          " ranks issued ", CollectiveCall::from_signature(majority->first).describe());
  std::vector<int> at_fault;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (by_rank[r] == majority->first) continue;
    at_fault.push_back(static_cast<int>(r));
    message += cat("; rank ", r, r == static_cast<size_t>(rank) ? " (this rank)" : "", " issued ",
                   CollectiveCall::from_signature(by_rank[r]).describe());
  }
  message += cat(". Rank(s) at fault: ", text::join(at_fault, ", "),
                 " — every rank must issue the same collectives in the same order with the "
                 "same types and sizes");
  return message;
}

}  // namespace strata::comm_internal
