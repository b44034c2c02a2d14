// Room in a tier: allocation that compacts, then evicts (stale copies first, then the
// scheduler's or LRU's choice); eviction that writes back only the only newest bytes (rules 1
// and 2) and drops the copy once its write-back and device work are over, on the completion
// worker rather than with the caller waiting.
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <limits>

#include "strata/base/format_bytes.h"
#include "strata/base/log.h"
#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

bool Impl::moves_hold(TierKind tier, const Tensor& except) const {
  for (const auto& u : tensors) {
    if (u.get() == &except) continue;
    const Copy& c = u->copies[tier_index(tier)];
    // A tensor being destroyed (no longer live, its copies not yet freed) gives its memory back
    // once the operations on it end.
    if (c.present() && (!u->live || c.arriving() || c.moves_out() > 0 || c.evicting())) return true;
  }
  return false;
}

Impl::Tensor* Impl::choose_victim(const Tensor& keep, TierKind tier,
                                  std::optional<uint64_t> beyond) {
  Tensor* stale = nullptr;  // a stale copy device work still uses
  std::vector<TensorId> candidates;
  std::vector<TensorId> busy;  // a prefetch's candidates device work still uses
  for (uint32_t i = 0; i < tensors.size(); ++i) {
    Tensor& u = *tensors[i];
    const Copy& c = u.copies[tier_index(tier)];
    // An early write-back's pin does not keep it: its eviction waits for that write-back.
    if (!u.live || &u == &keep || u.home == tier || !c.present() || c.arriving() ||
        c.pins() > (c.writing_back_early() ? 1u : 0u) || c.evicting()) {
      continue;  // an evicting copy is on its way out already
    }
    // (allocate() reaped the tier's finished device work before asking: `busy` is current.)
    if (!c.valid()) {
      if (c.busy.empty()) return &u;  // costs nothing to drop
      if (stale == nullptr) stale = &u;
      continue;
    }
    if (beyond.has_value()) {
      // A prefetch may only displace tensors needed later than the one it brings.
      const auto next = schedule.next_use(i);
      if (next.has_value() && *next <= *beyond) continue;
      // And it takes copies no device work uses first: the room of one still in use (a
      // discarded activation the running layer reads) comes back only when that work ends, and
      // the prefetch worker would wait for it instead of issuing the next prefetches.
      if (!c.busy.empty()) {
        busy.push_back(i);
        continue;
      }
    }
    candidates.push_back(i);
  }
  if (beyond.has_value() && candidates.empty()) {
    if (stale != nullptr) return stale;
    candidates = std::move(busy);
  }
  if (stale != nullptr && !beyond.has_value()) return stale;
  if (candidates.empty()) return nullptr;
  TensorId best = candidates.front();
  EvictionRank best_rank = eviction_rank(tier, best);
  for (TensorId id : candidates) {
    const EvictionRank rank = eviction_rank(tier, id);
    if (rank < best_rank) {
      best = id;
      best_rank = rank;
    }
  }
  return tensors[best].get();
}

Impl::EvictionRank Impl::eviction_rank(TierKind tier, TensorId id) const {
  if (options.belady && schedule.has_trace()) {
    // Belady: the furthest next use first; never used again is furthest of all.
    constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
    return {kNever - schedule.next_use(id).value_or(kNever), 0, id};
  }
  // LRU: copies prefetched and not yet used go last. They were fetched for the next accesses;
  // an acquire that makes its own room (an overwrite, which no prefetch made room for) would
  // otherwise evict them before their use, their last acquire being a step old.
  const Tensor& t = *tensors[id];
  return {t.copies[tier_index(tier)].prefetched() ? 1u : 0u, t.last_use, id};
}

void Impl::drop_copy(Tensor& t, TierKind tier) {
  Copy& c = t.copies[tier_index(tier)];
  if (!c.present() || c.pins() > 0 || c.arriving() || !c.busy.empty()) return;
  // Rule 1, enforced where copies die: the lock may have been released since the caller
  // decided (a write acquire and release can make this the only newest copy meanwhile).
  if (c.valid() && !newest_copy(t, tier).has_value()) return;
  const bool wasted = c.prefetched();
  const bool arena_pinned = c.arena_pinned();
  if (!c.drop()) return;  // (an internal error, reported: the memory stays)
  if (wasted) ++counters.prefetches_wasted;
  if (arena_pinned) (void)tier_of(tier)->unpin(c.block);
  if (MemoryTier* memory = tier_of(tier)) (void)memory->free(c.block);
  c = Copy();  // the resources too
  dropping.erase(key(t.index, tier));
  changed.SignalAll();
}

void Impl::cancel_eviction(Tensor& t, TierKind tier) {
  Copy& c = t.copies[tier_index(tier)];
  if (!c.evicting()) return;
  c.cancel_eviction();
  dropping.erase(key(t.index, tier));
  changed.SignalAll();  // allocations waiting for this copy to go choose again
}

bool Impl::try_drop(Tensor& t, TierKind tier) {
  Copy& c = t.copies[tier_index(tier)];
  if (!c.evicting()) return true;
  if (c.arriving() || c.moves_out() > 0) return false;  // the move's completion tries again
  prune(c);
  if (!c.busy.empty()) return false;  // device work still uses it
  update_pin(t, tier);
  drop_copy(t, tier);
  // Refused (rule 1: a write made it the only newest copy again): it stays.
  if (c.present()) cancel_eviction(t, tier);
  return true;
}

void Impl::schedule_drop(Tensor& t, TierKind tier) {
  if (try_drop(t, tier)) return;
  if (dropping.insert(key(t.index, tier)).second) completion_work.Signal();
}

absl::StatusOr<std::shared_ptr<Impl::InFlight>> Impl::evict_copy(Tensor& t, TierKind tier) {
  OperationGuard guard(*this, t);
  Copy& c = t.copies[tier_index(tier)];
  if (!c.present() || c.evicting()) return nullptr;
  std::shared_ptr<InFlight> write = early_writeback_of(t, tier);
  const bool only_newest = c.valid() && !newest_copy(t, tier).has_value();
  if (write != nullptr) {
    // Its early write-back is under way: the eviction ends with it (its completion drops the
    // copy, or cancels the eviction should it fail).
    ++counters.evictions_writeback;
  } else if (only_newest) {
    // Rule 1: the newest bytes must exist elsewhere, observed complete, before this copy goes.
    auto started = write_back(t, tier);
    if (!started.ok()) return started.status();
    write = *std::move(started);
    ++counters.evictions_writeback;
    STRATA_LOG(kDebug, "evict '%s' from %s: write-back to %s", t.name, to_string(tier),
               to_string(t.home));
  } else {
    if (c.valid()) ++counters.evictions_clean;  // rule 2: no write-back
    if (c.valid() && c.written_back_early()) ++counters.early_writebacks_used;
    STRATA_LOG(kDebug, "evict '%s' from %s: %s", t.name, to_string(tier),
               c.valid() ? "clean" : "stale");
  }
  // write_back() may have waited: someone dropped or acquired the copy meanwhile.
  if (!c.present() || c.pins() > c.moves_out()) return write;
  c.begin_eviction();
  // With a write-back in flight its completion schedules the drop (or cancels the eviction).
  if (write == nullptr || write->done) schedule_drop(t, tier);
  return write;
}

absl::Status Impl::allocate(Tensor& t, TierKind tier, std::optional<uint64_t> evict_beyond) {
  Copy& c = t.copies[tier_index(tier)];
  if (tier == TierKind::kNvme) {
    auto extent = nvme->allocate(t.bytes, t.name);
    if (!extent.ok()) return extent.status();
    c.extent = *extent;
    c.place();
    return absl::OkStatus();
  }
  MemoryTier& memory = *tier_of(tier);
  for (;;) {
    // Evicting below may release the lock; another thread may have placed this copy meanwhile
    // (and be filling it). Overwriting its block would orphan those bytes.
    if (c.present()) return absl::OkStatus();
    // Forgetting finished device work unpins copies, for compaction and eviction. A tier with a
    // hole that fits needs neither; and reaping costs a device query per copy with work in
    // flight, which a pass of acquires running ahead of the device would pay at every one.
    bool reaped = false;
    if (memory.stats().arena.largest_free < t.bytes) {
      reap(tier);
      reaped = true;
    }
    auto block = memory.allocate(t.bytes, t.placement);
    if (!block.ok() && absl::IsResourceExhausted(block.status()) && !reaped) {
      reap(tier);  // the hole was the high reserve's, or compaction needs the unpinned copies
      block = memory.allocate(t.bytes, t.placement);
    }
    if (block.ok()) {
      c.block = *block;
      c.place();
      return absl::OkStatus();
    }
    if (!absl::IsResourceExhausted(block.status())) return block.status();
    Tensor* victim = choose_victim(t, tier, evict_beyond);
    if (victim == nullptr && !evict_beyond.has_value() && moves_hold(tier, t)) {
      // Copies being moved or evicted (prefetches, write-backs) are only briefly unevictable: an
      // acquire waits for them rather than failing. Prefetches (evict_beyond set) never wait.
      const absl::Time w = absl::Now();
      wait(&changed, &mu);
      trace_wait("room: moves hold the tier", t, 0, w);
      continue;
    }
    if (victim == nullptr && !evict_beyond.has_value() && t.placement == Placement::kLow) {
      // Nothing left to evict below the tier's high reserve (ActivationStash's window): rather
      // than fail, go into it (the stash's loads then evict this or fail naming the window).
      block = memory.allocate(t.bytes, Placement::kAnywhere);
      if (block.ok()) {
        c.block = *block;
        c.place();
        return absl::OkStatus();
      }
    }
    if (victim == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "no room for tensor '%s' (%s) in the %s tier: every resident tensor is acquired, "
          "moving or needed sooner (%s); release tensors or raise %s",
          t.name, format_bytes(t.bytes), to_string(tier), block.status().message(),
          tier == TierKind::kGpu ? "STRATA_GPU_BYTES" : "STRATA_CPU_BYTES"));
    }
    // The room is needed now: wait for the victim's write-back and device work to end (the
    // memory may be reused only then), on the completion worker's word.
    OperationGuard keep(*this, *victim);
    auto write = evict_copy(*victim, tier);
    if (!write.ok()) return write.status();
    if (*write != nullptr) {
      const absl::Time w = absl::Now();
      const absl::Status status = wait_for(**write);
      trace_wait("eviction write-back", *victim, (*write)->trace_id, w);
      if (!status.ok()) return status;
    }
    // A victim destroyed meanwhile waits for this guard to go before it frees its memory:
    // stop waiting for the drop and let the next round find the room.
    const Copy& v = victim->copies[tier_index(tier)];
    while (v.evicting() && victim->live) {
      const absl::Time w = absl::Now();
      wait(&changed, &mu);
      trace_wait("eviction: victim's device work", *victim, 0, w);
    }
  }
}

}  // namespace strata
