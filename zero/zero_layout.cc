// ZeroLayout::plan(): packs parameters into flat groups and pads each group so that every rank's
// slice is equal, aligned and non-empty.
#include "strata/zero/zero_layout.h"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>

namespace strata {

absl::StatusOr<ZeroLayout> ZeroLayout::plan(std::vector<ZeroLayoutParam> params, uint32_t ranks,
                                            uint64_t max_group_elements, uint32_t alignment) {
  if (ranks == 0) return absl::InvalidArgumentError("ZeRO layout: 0 ranks");
  if (alignment == 0) {
    return absl::InvalidArgumentError("ZeRO layout: alignment 0; use 1 or more elements");
  }
  const uint64_t quantum = static_cast<uint64_t>(ranks) * alignment;
  if (max_group_elements < quantum) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ZeRO layout: a group of at most %d elements cannot hold %d ranks × alignment %d; raise "
        "the bucket size to at least %d elements or lower the alignment",
        max_group_elements, ranks, alignment, quantum));
  }
  if (params.empty()) return absl::InvalidArgumentError("ZeRO layout: no parameters");
  absl::flat_hash_set<std::string> names;
  for (ZeroLayoutParam& p : params) {
    if (p.name.empty()) return absl::InvalidArgumentError("ZeRO layout: a parameter has no name");
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("ZeRO layout: two parameters are named '", p.name, "'"));
    }
    uint64_t count = 1;
    for (int64_t d : p.shape) {
      if (d <= 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "ZeRO layout: parameter '%s' has dimension %d; dimensions must be positive", p.name,
            d));
      }
      count *= static_cast<uint64_t>(d);
    }
    if (p.count == 0) p.count = count;
    if (p.count != count) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ZeRO layout: parameter '%s' has count %d but its shape holds %d", p.name,
                          p.count, count));
    }
  }

  ZeroLayout layout;
  layout.ranks_ = ranks;
  layout.alignment_ = alignment;
  // Groups hold whole quanta, so that padding never exceeds one quantum per group.
  layout.max_group_elements_ = max_group_elements / quantum * quantum;
  // One group is open per kind (partitioned or persistent): a persistent parameter does not
  // close the partitioned group around it.
  int open[2] = {-1, -1};
  auto close_group = [&](int index) {
    if (index < 0) return;
    ZeroFlatGroup& g = layout.groups_[static_cast<size_t>(index)];
    g.padded = (g.elements + quantum - 1) / quantum * quantum;
    g.shard = g.padded / ranks;
  };
  std::vector<std::vector<ZeroSegment>> members;  // by group
  // Parameters are never split (a trainer's gradient of one parameter is one buffer): a group
  // closes when the next parameter does not fit, and a parameter larger than a group gets one
  // of its own.
  for (uint32_t i = 0; i < params.size(); ++i) {
    const ZeroLayoutParam& p = params[i];
    int& current = open[p.persistent ? 1 : 0];
    const bool need_new = current < 0 ||
                          layout.groups_[static_cast<size_t>(current)].adam_group != p.adam_group ||
                          layout.groups_[static_cast<size_t>(current)].elements + p.count >
                              layout.max_group_elements_;
    if (need_new) {
      close_group(current);
      ZeroFlatGroup g;
      g.adam_group = p.adam_group;
      g.persistent = p.persistent;
      layout.groups_.push_back(g);
      members.emplace_back();
      current = static_cast<int>(layout.groups_.size() - 1);
    }
    ZeroFlatGroup& g = layout.groups_[static_cast<size_t>(current)];
    ZeroSegment s;
    s.param = i;
    s.group = static_cast<uint32_t>(current);
    s.group_offset = g.elements;
    s.count = p.count;
    g.elements += s.count;
    ++g.segment_count;
    layout.segments_.push_back(s);
    members[static_cast<size_t>(current)].push_back(s);
  }
  close_group(open[0]);
  close_group(open[1]);
  for (size_t g = 0; g < members.size(); ++g) {
    layout.groups_[g].first_segment = static_cast<uint32_t>(layout.group_segments_.size());
    layout.group_segments_.insert(layout.group_segments_.end(), members[g].begin(),
                                  members[g].end());
  }
  layout.params_ = std::move(params);
  return layout;
}

std::span<const ZeroSegment> ZeroLayout::group_segments(uint32_t group) const {
  const ZeroFlatGroup& g = groups_[group];
  return std::span<const ZeroSegment>(group_segments_).subspan(g.first_segment, g.segment_count);
}

std::vector<ZeroSegment> ZeroLayout::slice_segments(uint32_t group, uint32_t rank) const {
  const ZeroFlatGroup& g = groups_[group];
  const uint64_t begin = static_cast<uint64_t>(rank) * g.shard;
  const uint64_t end = begin + g.shard;
  std::vector<ZeroSegment> out;
  for (const ZeroSegment& s : group_segments(group)) {
    const uint64_t a = std::max(begin, s.group_offset);
    const uint64_t b = std::min(end, s.group_offset + s.count);
    if (a >= b) continue;
    ZeroSegment clipped = s;
    clipped.param_offset = s.param_offset + (a - s.group_offset);
    clipped.group_offset = a;
    clipped.count = b - a;
    out.push_back(clipped);
  }
  return out;
}

uint64_t ZeroLayout::elements() const {
  uint64_t n = 0;
  for (const ZeroLayoutParam& p : params_) n += p.count;
  return n;
}

uint64_t ZeroLayout::padded_elements() const {
  uint64_t n = 0;
  for (const ZeroFlatGroup& g : groups_) n += g.padded;
  return n;
}

uint64_t ZeroLayout::shard_elements() const {
  uint64_t n = 0;
  for (const ZeroFlatGroup& g : groups_) n += g.shard;
  return n;
}

}  // namespace strata
