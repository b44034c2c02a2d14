// stats(): the counters, the tiers' usage and the copies' pending device work.
#include <absl/strings/str_format.h>

#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

StoreStats TensorStore::stats() const {
  const Impl& s = *impl_;
  MutexLock lock(&s.mu);
  StoreStats out = s.counters;
  out.schedule = s.schedule.stats();
  out.events_created = s.mover->events().created();
  out.moves_in_flight = s.in_flight.size();
  out.drops_pending = s.dropping.size();
  for (const auto& t : s.tensors) {
    if (!t->live) continue;
    for (const Impl::Copy& c : t->copies) out.busy_events += c.busy.size();
  }
  for (TierKind tier : kTiers) {
    TierUsage& usage = out.tiers[tier_index(tier)];
    usage.kind = tier;
    usage.present = s.has_tier(tier);
    if (tier == TierKind::kNvme) {
      if (s.nvme != nullptr) {
        const SwapStats swap = s.nvme->stats();
        usage.capacity = swap.capacity;
        usage.used = swap.used;
        usage.peak_used = swap.used;
      }
    } else {
      const TierStats tier_stats = (tier == TierKind::kGpu ? s.gpu : s.cpu).stats();
      usage.capacity = tier_stats.arena.capacity;
      usage.used = tier_stats.arena.used;
      usage.granularity = tier_stats.arena.granularity;
      usage.peak_used = tier_stats.arena.peak_used;
      usage.fragmentation = tier_stats.arena.fragmentation;
    }
    for (const auto& t : s.tensors) {
      const Impl::Copy& c = t->copies[tier_index(tier)];
      if (t->live && c.valid()) ++usage.resident;
    }
  }
  return out;
}

void TensorStore::reset_peak_usage() {
  impl_->gpu.reset_peak();
  impl_->cpu.reset_peak();
  MutexLock lock(&impl_->mu);
  impl_->counters.fetches_in_flight_peak = impl_->counters.fetches_in_flight;
}

absl::Status TensorStore::reserve_high(TierKind tier, uint64_t bytes) {
  MemoryTier* memory = impl_->tier_of(tier);
  if (memory == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "reserve_high: the %s tier has no arena to reserve in (gpu or cpu)", to_string(tier)));
  }
  memory->reserve_high(bytes);
  return absl::OkStatus();
}

void TensorStore::unreserve_high(TierKind tier, uint64_t bytes) {
  if (MemoryTier* memory = impl_->tier_of(tier)) memory->unreserve_high(bytes);
}

}  // namespace strata
