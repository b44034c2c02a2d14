// The devices' bookkeeping of memory and links: which address ranges a device knows (its
// allocations and registered host ranges) and the simulated bandwidth of one copy direction.
// Private to device/: the host device (host_streams.h) uses both, cuda_device.cc the RangeSet of
// registrations.
#pragma once

#include <absl/container/btree_map.h>
#include <absl/status/status.h>
#include <absl/strings/str_format.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>
#include <vector>

#include "strata/base/mutex.h"

namespace strata::detail {

// Address ranges the device knows: its allocations and the host ranges registered with it.
class RangeSet {
 public:
  absl::Status add(const void* data, uint64_t bytes, std::string_view what) {
    MutexLock lock(&mu_);
    const auto start = reinterpret_cast<uintptr_t>(data);
    if (touches_locked(start, bytes)) {
      return absl::AlreadyExistsError(
          absl::StrFormat("%s [%p, +%d) overlaps a range already registered with the host device",
                          what, data, bytes));
    }
    ranges_.emplace(start, bytes);
    total_ += bytes;
    return absl::OkStatus();
  }
  void remove(const void* data) {
    MutexLock lock(&mu_);
    auto it = ranges_.find(reinterpret_cast<uintptr_t>(data));
    if (it != ranges_.end()) {
      total_ -= it->second;
      ranges_.erase(it);
    }
  }
  // True when [data, data + bytes) lies inside one range.
  bool contains(const void* data, uint64_t bytes) const {
    MutexLock lock(&mu_);
    return find_locked(reinterpret_cast<uintptr_t>(data), bytes) != ranges_.end();
  }
  // True when [data, data + bytes) touches any range.
  bool touches(const void* data, uint64_t bytes) const {
    MutexLock lock(&mu_);
    return touches_locked(reinterpret_cast<uintptr_t>(data), bytes);
  }
  uint64_t total() const {
    MutexLock lock(&mu_);
    return total_;
  }

  // [data, data + bytes) cut where a range starts or ends, so that each piece lies inside one
  // range or outside all. CUDA refuses a copy whose host side spans memory registered and not
  // registered, and copies within one registration only; the pinned CPU tier is registered in
  // pieces, so a tensor may span several. One piece when nothing needs cutting.
  struct Segment {
    std::byte* data;
    uint64_t bytes;
  };
  std::vector<Segment> segments(const void* data, uint64_t bytes) const {
    auto* const begin = static_cast<std::byte*>(const_cast<void*>(data));
    const auto start = reinterpret_cast<uintptr_t>(data);
    const uintptr_t end = start + bytes;
    std::vector<Segment> out;
    MutexLock lock(&mu_);
    auto it = ranges_.upper_bound(start);
    if (it != ranges_.begin() && std::prev(it)->first + std::prev(it)->second > start) --it;
    uintptr_t at = start;
    for (; it != ranges_.end() && it->first < end && at < end; ++it) {
      const uintptr_t from = std::max(it->first, at);
      const uintptr_t to = std::min(it->first + it->second, end);
      if (from > at) out.push_back({begin + (at - start), from - at});  // a gap: unregistered
      out.push_back({begin + (from - start), to - from});
      at = to;
    }
    if (at < end) out.push_back({begin + (at - start), end - at});
    return out;
  }

 private:
  bool touches_locked(uintptr_t start, uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = ranges_.lower_bound(start + bytes);  // first range starting at or after the end
    if (it == ranges_.begin()) return false;
    --it;
    return it->first + it->second > start;
  }
  absl::btree_map<uintptr_t, uint64_t>::const_iterator find_locked(uintptr_t start,
                                                                   uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = ranges_.upper_bound(start);
    if (it == ranges_.begin()) return ranges_.end();
    --it;
    if (start + bytes <= it->first + it->second) return it;
    return ranges_.end();
  }

  mutable absl::Mutex mu_;
  absl::btree_map<uintptr_t, uint64_t> ranges_ ABSL_GUARDED_BY(mu_);
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
};

// One copy direction, shared by all streams: copies queue behind each other at its bandwidth.
class Link {
 public:
  explicit Link(double bytes_per_second) : bytes_per_second_(bytes_per_second) {}
  // Reserves the link for `bytes` and returns when the transfer would have finished.
  absl::Time reserve(uint64_t bytes) {
    if (bytes_per_second_ <= 0) return absl::InfinitePast();
    MutexLock lock(&mu_);
    const absl::Time start = std::max(absl::Now(), free_at_);
    free_at_ = start + absl::Seconds(static_cast<double>(bytes) / bytes_per_second_);
    return free_at_;
  }

 private:
  const double bytes_per_second_;
  absl::Mutex mu_;
  absl::Time free_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace strata::detail
