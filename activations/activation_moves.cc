// ActivationStash's GPU window, prefetch planning and background threads (see
// activation_stash_impl.h).
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>

#include "activation_stash_impl.h"
#include "strata/base/format_bytes.h"
#include "strata/base/log.h"

namespace strata {

using Impl = ActivationStash::Impl;
using activation_detail::Phase;

absl::Status activation_detail::annotate(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("%s: %s", what, status.message()));
}

absl::StatusOr<Impl::Entry*> Impl::find(ActivationId id) {
  auto it = entries.find(id);
  if (it == entries.end() || it->second->freed) {
    return absl::FailedPreconditionError(
        absl::StrFormat("activation %d is not in the stash: it was freed, or never allocated", id));
  }
  return it->second.get();
}

void Impl::count_in(Entry& e) {
  e.on_gpu = true;
  counters.gpu_bytes += e.footprint;
  counters.gpu_peak_bytes = std::max(counters.gpu_peak_bytes, counters.gpu_bytes);
  if (options.record_trace) trace.push_back(absl::StrFormat("a %s %d", e.name, e.footprint));
}

void Impl::count_out(Entry& e) {
  e.on_gpu = false;
  counters.gpu_bytes -= e.footprint;
  if (options.record_trace) trace.push_back(absl::StrFormat("f %s", e.name));
}

void Impl::record_error(Entry& e, const absl::Status& status) {
  ++counters.errors;
  e.error = status;
  if (first_error.ok()) first_error = status;
  STRATA_LOG(kError, "%s", status.message());
}

void Impl::queue(JobKind kind, Entry& e) {
  if (kind == JobKind::kDestroy) e.destroying = true;
  if (kind == JobKind::kMoveHome) e.phase = Phase::kMoving;
  if (e.on_gpu) pending_gpu += e.footprint;
  jobs.push_back({kind, &e});
  work.Signal();
}

void Impl::destroy_when_idle(Entry& e) {
  if (e.freed && !e.destroying && e.releasing == 0 && e.loads == 0 && !e.fetch_queued &&
      !e.fetching && e.phase != Phase::kMoving) {
    queue(JobKind::kDestroy, e);
  }
}

bool Impl::cancel_fetch(Entry& e) {
  if (!e.fetch_queued) return false;
  std::erase(fetches, &e);
  e.fetch_queued = false;
  e.prefetched = false;
  count_out(e);
  changed.SignalAll();
  return true;
}

void Impl::wait_fetch(Entry& e) {
  while (e.fetching) wait(&changed, &mu);
}

absl::Status Impl::release(Entry& e, Stream& stream, uint32_t times) {
  ++e.releasing;  // not destroyable while the lock is dropped
  absl::Status status;
  {
    MutexUnlock unlocked(&mu);
    for (uint32_t i = 0; i < times; ++i) {
      if (auto st = store.release(e.tensor, stream); !st.ok() && status.ok()) status = st;
    }
  }
  --e.releasing;
  return status;
}

std::string Impl::window_breakdown() const {
  uint64_t writing = 0, loaded = 0, waiting = 0;
  for (const auto& [id, e] : entries) {
    if (!e->on_gpu) continue;
    if (e->phase == Phase::kWriting) {
      writing += e->footprint;
    } else if (e->loads > 0) {
      loaded += e->footprint;
    } else {
      waiting += e->footprint;
    }
  }
  return absl::StrFormat("%s being written, %s loaded, %s kept or prefetched",
                         format_bytes(writing), format_bytes(loaded), format_bytes(waiting));
}

absl::Status Impl::make_room(uint64_t bytes, const std::string& what) {
  if (bytes > options.window_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "activation stash: %s needs %s, more than the whole GPU window (window_bytes %s); "
        "raise the window",
        what, format_bytes(bytes), format_bytes(options.window_bytes)));
  }
  const absl::Time start = absl::Now();
  bool waited = false;
  while (counters.gpu_bytes + bytes > options.window_bytes) {
    if (pending_gpu == 0 && fetching == 0) {
      if (reclaim_one()) continue;  // cancelled at once, or now pending
      return absl::ResourceExhaustedError(absl::StrFormat(
          "activation stash: %s needs %s of the GPU window, but the activations the trainer "
          "holds fill it (window_bytes %s: %s); raise the window, or offload() and free() "
          "activations sooner",
          what, format_bytes(bytes), format_bytes(options.window_bytes), window_breakdown()));
    }
    waited = true;
    ++counters.room_waiters;
    wait(&changed, &mu);
    --counters.room_waiters;
  }
  if (waited) {
    ++counters.window_waits;
    counters.window_wait_ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
  }
  return absl::OkStatus();
}

bool Impl::reclaim_one() {
  for (auto& [id, e] : entries) {
    if (!e->on_gpu || e->freed || e->loads > 0 || e->releasing > 0 || e->fetching ||
        !e->error.ok()) {
      continue;
    }
    if (e->phase != Phase::kKept && e->phase != Phase::kHome) continue;
    if (cancel_fetch(*e)) return true;
    if (e->phase == Phase::kKept) kept_bytes -= std::min(kept_bytes, e->footprint);
    e->prefetched = false;
    queue(JobKind::kMoveHome, *e);
    return true;
  }
  return false;
}

void Impl::plan_prefetch(uint64_t from_step, uint32_t from_index) {
  window_cut = false;
  if (from_step != step) return;  // the order is this step's
  last_load_index = from_index;
  last_load_step = from_step;
  uint64_t ahead = 0;
  std::optional<uint32_t> next = order.next_after(from_index);
  for (size_t guard = 0; next.has_value() && guard <= step_saves.size() + entries.size();
       ++guard, next = order.next_after(*next)) {
    if (*next >= step_saves.size() || step_saves[*next] == 0) continue;
    auto it = entries.find(step_saves[*next]);
    if (it == entries.end()) continue;
    Entry& c = *it->second;
    if (c.freed || c.phase == Phase::kWriting) continue;
    ahead += c.footprint;
    if (ahead > options.prefetch_bytes) break;
    if (c.on_gpu || c.phase != Phase::kHome || !c.error.ok()) continue;  // there, or moving
    if (counters.gpu_bytes + c.footprint > options.window_bytes) {
      window_cut = true;
      break;
    }
    fetch(c);
  }
}

void Impl::fetch(Entry& e) {
  count_in(e);
  e.prefetched = true;
  e.fetch_queued = true;
  ++counters.prefetches;
  fetches.push_back(&e);
  fetch_work.Signal();
}

void Impl::close_step() {
  const bool had = order.has_order();
  if (order.close_step() && had) ++counters.order_changes;
  counters.has_order = order.has_order();
}

void Impl::run_mover() {
  MutexLock lock(&mu);
  for (;;) {
    while (jobs.empty() && !stopping) wait(&work, &mu);
    if (jobs.empty()) return;  // stopping, and everything done
    const Job job = jobs.front();
    jobs.pop_front();
    ++running;
    Entry& e = *job.entry;
    const bool was_on_gpu = e.on_gpu;
    const TensorHandle tensor = e.tensor;
    absl::Status status;
    {
      MutexUnlock unlocked(&mu);
      if (job.kind == JobKind::kMoveHome) {
        // The GPU copy goes home (the store writes it back when it holds the newest bytes, and
        // drops it once the device work that wrote it is done); a CPU-tier copy of an
        // NVMe-homed activation follows it to the drive.
        if (was_on_gpu) {
          status = store.evict(tensor, TierKind::kGpu);
          if (status.ok()) status = store.wait_evicted(tensor, TierKind::kGpu);
        }
        if (status.ok() && options.home == TierKind::kNvme) {
          status = store.evict(tensor, TierKind::kCpu);
          if (status.ok()) status = store.wait_evicted(tensor, TierKind::kCpu);
        }
      } else {
        status = store.destroy(tensor);  // waits for the device work that used it
      }
    }
    --running;
    if (was_on_gpu) pending_gpu -= e.footprint;
    if (job.kind == JobKind::kMoveHome) {
      e.phase = Phase::kHome;
      if (status.ok()) {
        if (was_on_gpu) count_out(e);
        ++counters.offloaded;
        counters.offloaded_bytes += e.bytes;
      } else {
        record_error(e, activation_detail::annotate(
                            status, absl::StrFormat("activation stash: moving activation '%s' "
                                                    "home to the %s tier failed",
                                                    e.name, to_string(options.home))));
      }
      destroy_when_idle(e);
    } else {
      if (!status.ok()) {
        // The store keeps what it could not confirm unused; the stash forgets it either way.
        record_error(e, activation_detail::annotate(
                            status, absl::StrFormat("activation stash: destroying '%s'", e.name)));
      }
      if (e.on_gpu) count_out(e);
      --counters.live;
      counters.live_bytes -= e.bytes;
      const ActivationId id = e.id;
      entries.erase(id);  // `e` dies here
    }
    ++background_done;
    changed.SignalAll();
    // Room given back goes to a waiting allocate() or load() first, never to a prefetch.
    if (window_cut && was_on_gpu && counters.room_waiters == 0)
      plan_prefetch(last_load_step, last_load_index);
  }
}

void Impl::run_fetcher() {
  MutexLock lock(&mu);
  for (;;) {
    while (fetches.empty() && !stopping) wait(&fetch_work, &mu);
    if (fetches.empty()) return;
    Entry& e = *fetches.front();
    fetches.pop_front();
    e.fetch_queued = false;
    e.fetching = true;
    ++fetching;
    const TensorHandle tensor = e.tensor;
    absl::Status status;
    {
      MutexUnlock unlocked(&mu);
      // Stream-ordered: the copy is issued on the store's movers and the fetch stream waits for
      // it; a later acquire on the trainer's stream is ordered after it by the store.
      auto data = store.acquire(tensor, TierKind::kGpu, *fetch_stream, AccessMode::kRead);
      status = data.status();
      if (data.ok()) status = store.release(tensor, *fetch_stream);
    }
    e.fetching = false;
    --fetching;
    if (!status.ok()) {
      // A prefetch is a hint: load() fetches on demand and reports the error there.
      STRATA_LOG(kDebug, "activation stash: prefetching '%s' failed: %s", e.name, status.message());
      if (e.loads == 0 && e.on_gpu) count_out(e);
      e.prefetched = false;
    }
    ++background_done;
    changed.SignalAll();
    destroy_when_idle(e);
  }
}

}  // namespace strata
