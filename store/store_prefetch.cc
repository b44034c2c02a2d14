// Background movers for TensorStore: explicit prefetch() calls and the scheduler's plan.
//
// After every acquire the store asks the schedule which upcoming accesses are due and queues
// them in order, all but overwrites (AccessMode::kOverwrite), which need no bytes. A worker makes
// each copy resident, evicting only copies whose next use comes later than the prefetched access's
// (Belady-consistent), so prefetching is bounded by bytes: when the next due tensor does not fit,
// it and everything after it wait for a later round.
#include <absl/strings/str_format.h>

#include "strata/base/log.h"
#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

void Impl::start_workers() {
  for (uint32_t i = 0; i < std::max<uint32_t>(1, options.prefetch_threads); ++i) {
    workers.emplace_back([this, i] {
      Timeline::set_thread_track(absl::StrFormat("prefetch worker %d", i + 1));
      run_worker();
    });
  }
}

void Impl::stop_workers() {
  {
    MutexLock lock(&mu);
    stopping = true;
    prefetch_queue.clear();
    queued.clear();
    prefetch_work.SignalAll();
  }
  for (auto& worker : workers) worker.join();
  workers.clear();
}

namespace {

// Accesses a round plans: what the leads make due.
constexpr size_t kMaxDue = 64;

}  // namespace

uint64_t Impl::read_ahead_bytes() const {
  if (nvme == nullptr) return 0;
  // Half the staging pool by default: reads ahead of need hold no more than that of it, and the
  // rest stays for fetches on demand and write-backs through staging (a step evicts as it reads).
  return options.read_ahead_bytes.value_or(std::min(staging->bytes(), gpu.capacity()) / 2);
}

bool Impl::only_on_nvme(const Tensor& t, TierKind tier) const {
  const Copy& c = t.copies[tier_index(tier)];
  if (c.valid() || c.arriving()) return false;
  const std::optional<TierKind> source = newest_copy(t, tier);
  return source.has_value() && *source == TierKind::kNvme;
}

void Impl::plan_prefetches() {
  if (!schedule.has_trace()) return;
  std::vector<DueAccess> plan = schedule.due_in_order(kMaxDue);
  // The upcoming accesses, walked once for the read-ahead and the early write-backs.
  const uint64_t window = read_ahead_bytes();
  const std::vector<DueAccess> next = window > 0 || early_writeback_bytes() > 0
                                          ? schedule.upcoming(kMaxUpcoming)
                                          : std::vector<DueAccess>();
  // Read-ahead: the upcoming accesses within the window whose bytes must come from NVMe, and
  // (as due_in_order does) every access before the furthest of them, in need order.
  if (window > 0) {
    uint64_t bytes = 0;
    size_t furthest = 0;
    for (size_t i = 0; i < next.size(); ++i) {
      const TensorId id = next[i].access.tensor;
      if (id >= tensors.size() || !tensors[id]->live) continue;
      bytes += tensors[id]->bytes;
      if (bytes > window) break;
      if (!next[i].access.overwrite && only_on_nvme(*tensors[id], next[i].access.tier)) {
        furthest = i + 1;
      }
    }
    if (furthest > plan.size()) plan.assign(next.begin(), next.begin() + furthest);
  }
  for (const DueAccess& due : plan) {
    const TensorId id = due.access.tensor;
    // An overwrite needs no bytes: its acquire makes the copy (and the room) itself.
    if (due.access.overwrite) continue;
    if (id >= tensors.size() || !tensors[id]->live) continue;
    const Tensor& t = *tensors[id];
    const Copy& c = t.copies[tier_index(due.access.tier)];
    if (c.valid() || c.arriving()) continue;
    const uint64_t k = key(id, due.access.tier);
    if (!queued.insert(k).second) continue;
    prefetch_queue.emplace_back(TensorHandle{id, t.generation}, due.access.tier);
    // The absolute position: by the time a worker takes it, the trainer may have moved on.
    prefetch_limit[k] = due.position;
  }
  if (!prefetch_queue.empty()) prefetch_work.SignalAll();
  plan_early_writebacks(next);
}

void Impl::run_worker() {
  MutexLock lock(&mu);
  for (;;) {
    while (prefetch_queue.empty() && !stopping) wait(&prefetch_work, &mu);
    if (stopping) return;
    const auto [handle, tier] = prefetch_queue.front();
    prefetch_queue.pop_front();
    const uint64_t k = key(handle.index, tier);
    queued.erase(k);
    // Planned prefetches may only displace copies needed after the access they serve: its
    // distance now (1: the next acquire), not when it was planned.
    std::optional<uint64_t> beyond;
    if (auto it = prefetch_limit.find(k); it != prefetch_limit.end()) {
      const uint64_t position = it->second;
      prefetch_limit.erase(it);
      if (position < schedule.position()) continue;  // its acquire came first: not a prefetch
      beyond = position - schedule.position() + 1;
    }
    auto found = live(handle);
    if (!found.ok()) continue;
    Tensor& t = **found;
    Copy& c = t.copies[tier_index(tier)];
    if (c.valid() || c.arriving()) continue;
    ++t.operations;
    ++counters.prefetches_issued;
    STRATA_LOG(kDebug, "prefetch: issued %s -> %s, %s", t.name, to_string(tier),
               beyond ? absl::StrFormat("%d acquire(s) ahead", *beyond) : "explicit");
    c.begin_prefetch();  // an acquire that arrives now is late
    bool waited = false;
    // Not waited for: a fetch from NVMe lands on the completion worker while this worker issues
    // the next ones, so the reads of several upcoming tensors are in flight at once.
    const absl::Status status = make_resident(t, tier, beyond, &waited, /*arrive=*/false);
    c.end_prefetch(status.ok());
    if (status.ok()) {
      // LRU: a prefetched copy enters as the most recently used, not at its last acquire's age:
      // else an acquire that needs room (an overwrite's, which no prefetch made room for) evicts
      // the copies just fetched for the next accesses first.
      t.last_use = ++tick;
      // Awaiting its use (or still landing); an acquire that waited for it counts the use (and
      // the lateness): end_prefetch marked it prefetched unless an acquire holds it already.
    } else {
      ++counters.prefetches_failed;
      STRATA_LOG(kDebug, "prefetch: skipped %s -> %s: %s", t.name, to_string(tier),
                 absl::IsResourceExhausted(status) ? "no room without evicting a copy needed sooner"
                                                   : std::string(status.message()));
      if (absl::IsResourceExhausted(status)) {
        // Later accesses would not fit either: drop the rest of this round's plan.
        for (const auto& [h, k_tier] : prefetch_queue) {
          const uint64_t dropped = key(h.index, k_tier);
          queued.erase(dropped);
          prefetch_limit.erase(dropped);
        }
        prefetch_queue.clear();
      }
    }
    --t.operations;
    changed.SignalAll();
  }
}

}  // namespace strata
