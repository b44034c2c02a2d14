// ZeroLayout: how ZeRO-DP packs parameters into flat groups and cuts the groups among ranks.
//
// Parameters are packed in the order given into flat groups of at most `max_group_elements`
// elements; a group holds parameters of one hyper-parameter group only. A parameter is never
// split (its gradient is one buffer): one larger than a group gets a group of its own. Parameters
// marked persistent (stage 3 keeps them whole on every rank) are packed, in order, into groups of
// their own, so that every other group can be partitioned; without them the packing is the same
// as when the flag did not exist (old checkpoints replan identically). Each group
// is padded to a multiple of ranks × alignment elements, so that every rank owns an equal,
// aligned, non-empty slice: rank r owns [r·shard, (r+1)·shard) of every group.
//
// The layout is a pure function of its inputs: every rank computes the same one, and a
// checkpoint records it, so that a checkpoint outlives it (load() at another world size,
// bucket size or alignment maps logical elements through both layouts).
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata {

struct ZeroLayoutParam {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t count = 0;       // product of shape
  uint32_t adam_group = 0;  // hyper-parameter group
  bool persistent = false;  // stage 3: kept whole on every rank (in a group with its kind only)
};

// A run of one parameter's elements inside one flat group (a whole parameter in segments(); a
// part of one in slice_segments()).
struct ZeroSegment {
  uint32_t param = 0;
  uint64_t param_offset = 0;  // first element in the parameter
  uint32_t group = 0;         // flat group
  uint64_t group_offset = 0;  // first element in the group
  uint64_t count = 0;
};

struct ZeroFlatGroup {
  uint32_t adam_group = 0;
  bool persistent = false;  // holds persistent parameters only
  uint64_t elements = 0;    // used (the segments')
  uint64_t padded = 0;      // elements, a multiple of ranks × alignment
  uint64_t shard = 0;       // padded / ranks: each rank's slice
  uint32_t first_segment = 0;
  uint32_t segment_count = 0;
};

class ZeroLayout {
 public:
  ZeroLayout() = default;
  // InvalidArgument for an empty or duplicated name, a non-positive dimension, a zero count,
  // ranks or alignment of 0, or a group size smaller than ranks × alignment.
  static absl::StatusOr<ZeroLayout> plan(std::vector<ZeroLayoutParam> params, uint32_t ranks,
                                         uint64_t max_group_elements, uint32_t alignment);

  uint32_t ranks() const { return ranks_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t max_group_elements() const { return max_group_elements_; }
  const std::vector<ZeroLayoutParam>& params() const { return params_; }
  const std::vector<ZeroFlatGroup>& groups() const { return groups_; }
  // One per parameter, in parameter order.
  const std::vector<ZeroSegment>& segments() const { return segments_; }
  std::span<const ZeroSegment> group_segments(uint32_t group) const;
  // Where a parameter lies (its one segment).
  const ZeroSegment& param_segment(uint32_t param) const { return segments_[param]; }
  // Rank `rank`'s slice of `group` as segments clipped to it (group_offset relative to the
  // group, as in segments()); padding is not a segment.
  std::vector<ZeroSegment> slice_segments(uint32_t group, uint32_t rank) const;

  uint64_t elements() const;         // Σ parameter counts (Ψ)
  uint64_t padded_elements() const;  // Σ group padded sizes
  uint64_t shard_elements() const;   // Σ group shards: what one rank's optimizer holds

 private:
  uint32_t ranks_ = 1;
  uint32_t alignment_ = 1;
  uint64_t max_group_elements_ = 0;
  std::vector<ZeroLayoutParam> params_;
  std::vector<ZeroFlatGroup> groups_;
  std::vector<ZeroSegment> segments_;        // by parameter
  std::vector<ZeroSegment> group_segments_;  // the same, by group (each group's contiguous)
};

}  // namespace strata
