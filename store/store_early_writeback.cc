// Early write-back: the written copies that the room for the upcoming accesses will evict are
// written home ahead of need, and stay resident, clean.
//
// Without it an eviction starts its victim's write-back when the room is needed, and the acquire
// (or the prefetch) that needs the room waits for it: in a training step the gradients written in
// backward and the weights updated by the optimizer reach the link only then, while that
// direction of the link sat idle before. Planned after every acquire, from the trace: the room the
// upcoming accesses within early_writeback_bytes need, the copies eviction would take for it (in
// eviction's own order, so only bytes the evictions would write cross the link, earlier), and of
// those the written ones get a write-back now. A copy written again before its eviction wasted its
// early write-back (counted); nothing is lost either way: the write makes the home copy stale, as
// any write does, and its eviction writes it back again.
#include <absl/strings/str_format.h>

#include <algorithm>
#include <tuple>

#include "strata/base/log.h"
#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

uint64_t Impl::early_writeback_bytes() const {
  return options.early_writeback_bytes.value_or(gpu.capacity() / 2);
}

void Impl::order_for_eviction(TierKind tier, std::vector<TensorId>& candidates) const {
  std::vector<EvictionRank> ranked;
  ranked.reserve(candidates.size());
  for (TensorId id : candidates) ranked.push_back(eviction_rank(tier, id));
  std::sort(ranked.begin(), ranked.end());
  for (size_t i = 0; i < ranked.size(); ++i) candidates[i] = std::get<2>(ranked[i]);
}

void Impl::plan_early_writebacks(const std::vector<DueAccess>& upcoming) {
  if (early_writeback_bytes() == 0) return;
  for (TierKind tier : {TierKind::kGpu, TierKind::kCpu}) plan_early_writebacks(tier, upcoming);
}

void Impl::plan_early_writebacks(TierKind tier, const std::vector<DueAccess>& upcoming) {
  const uint64_t window = early_writeback_bytes();
  // The room the upcoming accesses to this tier need: those without a copy here yet.
  absl::flat_hash_set<TensorId> needed;
  uint64_t walked = 0;
  uint64_t need = 0;
  for (const DueAccess& due : upcoming) {
    const TensorId id = due.access.tensor;
    if (id >= tensors.size() || !tensors[id]->live) continue;
    const Tensor& t = *tensors[id];
    walked += t.bytes;
    if (walked > window) break;
    if (due.access.tier != tier || t.home == tier || !needed.insert(id).second) continue;
    if (!t.copies[tier_index(tier)].present()) need += t.bytes;
  }
  if (need == 0) return;
  const uint64_t free = tier_of(tier)->stats().arena.free;
  if (free >= need) return;
  // What eviction may take: resident copies not needed within the window (nor acquired, moving
  // or on their way out). A copy whose early write-back is in flight counts as room coming.
  std::vector<TensorId> candidates;
  uint64_t room = free;
  for (uint32_t i = 0; i < tensors.size(); ++i) {
    const Tensor& u = *tensors[i];
    const Copy& c = u.copies[tier_index(tier)];
    if (!u.live || u.home == tier || !c.present() || c.arriving() || c.evicting() ||
        needed.contains(i)) {
      continue;
    }
    if (c.pins() > (c.writing_back_early() ? 1u : 0u)) continue;
    if (!c.valid()) {
      room += u.bytes;  // stale: dropped first, for free
      continue;
    }
    candidates.push_back(i);
  }
  order_for_eviction(tier, candidates);
  for (TensorId id : candidates) {
    if (room >= need) break;
    Tensor& u = *tensors[id];
    room += u.bytes;
    const Copy& c = u.copies[tier_index(tier)];
    // Clean (another copy holds its bytes), already being written, or being written by the
    // trainer (its bytes are not final: its eviction waits for the release anyway).
    if (c.writing_back_early() || c.writers() > 0 || newest_copy(u, tier).has_value()) continue;
    if (u.copies[tier_index(u.home)].arriving()) continue;  // a write-back is landing already
    if (early_in_flight_bytes >= window) break;
    const uint64_t k = key(id, tier);
    if (!early_queued.insert(k).second) continue;
    early_queue.emplace_back(TensorHandle{id, u.generation}, tier);
    early_work.Signal();
  }
}

std::shared_ptr<Impl::InFlight> Impl::early_writeback_of(const Tensor& t, TierKind tier) const {
  for (const std::shared_ptr<InFlight>& m : in_flight) {
    if (m->early && !m->done && m->index == t.index && m->from == tier) return m;
  }
  return nullptr;
}

void Impl::early_writeback_done(Tensor& t, InFlight& m, bool succeeded) {
  Copy& src = t.copies[tier_index(m.from)];
  early_in_flight_bytes -= t.bytes;
  // The home copy is as new as this one (no write overtook the move): evicting it is free now.
  src.end_early_writeback(succeeded && src.valid() && t.copies[tier_index(t.home)].valid());
  early_work.Signal();
}

void Impl::start_early_writer() {
  early_writer = std::thread([this] {
    Timeline::set_thread_track("early write-back");
    run_early_writer();
  });
}

void Impl::stop_early_writer() {
  {
    MutexLock lock(&mu);
    stopping = true;
    early_queue.clear();
    early_queued.clear();
    early_work.SignalAll();
  }
  if (early_writer.joinable()) early_writer.join();
}

void Impl::run_early_writer() {
  MutexLock lock(&mu);
  for (;;) {
    while (early_queue.empty() && !stopping) wait(&early_work, &mu);
    if (stopping) return;
    const auto [handle, tier] = early_queue.front();
    early_queue.pop_front();
    early_queued.erase(key(handle.index, tier));
    auto found = live(handle);
    if (!found.ok()) continue;
    Tensor& t = **found;
    Copy& c = t.copies[tier_index(tier)];
    const Copy& home = t.copies[tier_index(t.home)];
    // Decided a while ago: still resident, written, idle and the only newest bytes?
    if (!c.valid() || c.evicting() || c.pins() > 0 || c.writers() > 0 || c.writing_back_early() ||
        home.arriving() || home.pins() > 0 || newest_copy(t, tier).has_value()) {
      continue;
    }
    OperationGuard guard(*this, t);
    c.begin_early_writeback();
    early_in_flight_bytes += t.bytes;
    auto write = write_back(t, tier);
    if (!write.ok()) {
      // Failed to start (counted in errors; the copy stays the newest): its eviction tries again.
      c.end_early_writeback(false);
      early_in_flight_bytes -= t.bytes;
      STRATA_LOG(kDebug, "early write-back of '%s' from %s: %s", t.name, to_string(tier),
                 write.status().message());
      continue;
    }
    if (*write == nullptr) {
      // Nothing to write after all, or a move complete when issued (a device without events).
      const bool written = c.valid() && home.valid();
      c.end_early_writeback(written);
      early_in_flight_bytes -= t.bytes;
      if (written) {
        ++counters.early_writebacks;
        counters.early_writeback_bytes += t.bytes;
      }
      continue;
    }
    // In flight; complete() calls early_writeback_done (the lock was held since it was queued).
    (*write)->early = true;
    ++counters.early_writebacks;
    counters.early_writeback_bytes += t.bytes;
    STRATA_LOG(kDebug, "early write-back '%s' %s -> %s", t.name, to_string(tier),
               to_string(t.home));
  }
}

}  // namespace strata
