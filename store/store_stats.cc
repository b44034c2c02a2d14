// stats(): the counters, the tiers' usage and the copies' pending device work.
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
      }
    } else {
      const TierStats tier_stats = (tier == TierKind::kGpu ? s.gpu : s.cpu).stats();
      usage.capacity = tier_stats.arena.capacity;
      usage.used = tier_stats.arena.used;
      usage.fragmentation = tier_stats.arena.fragmentation;
    }
    for (const auto& t : s.tensors) {
      const Impl::Copy& c = t->copies[tier_index(tier)];
      if (t->live && c.present && c.valid) ++usage.resident;
    }
  }
  return out;
}

}  // namespace strata
