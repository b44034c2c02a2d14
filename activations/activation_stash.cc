// ActivationStash: the trainer's calls (see activation_stash_impl.h for the state, and
// activation_moves.cc for the window and the background threads).
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "activation_stash_impl.h"
#include "strata/base/format_bytes.h"
#include "strata/base/log.h"

namespace strata {

using activation_detail::annotate;
using activation_detail::Phase;

absl::StatusOr<std::unique_ptr<ActivationStash>> ActivationStash::create(
    TensorStore& store, Device& device, ActivationStashOptions options) {
  if (options.home != TierKind::kCpu && options.home != TierKind::kNvme) {
    return absl::InvalidArgumentError(
        "activation stash: home must be the cpu or the nvme tier (activations wait there for "
        "backward; the GPU tier is what the stash frees)");
  }
  if (options.home == TierKind::kNvme &&
      !store.stats().tiers[static_cast<size_t>(TierKind::kNvme)].present) {
    return absl::FailedPreconditionError(
        "activation stash: home nvme, but this runtime has no NVMe tier; set STRATA_NVME_PATHS "
        "or keep activations in the cpu tier");
  }
  if (options.window_bytes == 0) {
    return absl::InvalidArgumentError(
        "activation stash: window_bytes is 0; it bounds the GPU-tier bytes activations hold at "
        "once and must hold at least the largest activation");
  }
  if (options.prefetch_bytes > options.window_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "activation stash: prefetch_bytes (%s) exceeds window_bytes (%s): activations brought "
        "back ahead of use must fit in the window",
        format_bytes(options.prefetch_bytes), format_bytes(options.window_bytes)));
  }
  auto own = device.create_stream();
  if (!own.ok()) return annotate(own.status(), "activation stash: creating a stream");
  auto fetch = device.create_stream();
  if (!fetch.ok()) return annotate(fetch.status(), "activation stash: creating a stream");
  const uint64_t granularity =
      std::max<uint64_t>(1, store.stats().tiers[static_cast<size_t>(TierKind::kGpu)].granularity);
  auto impl = std::make_unique<Impl>(store, device, std::move(options), granularity,
                                     *std::move(own), *std::move(fetch));
  Impl* raw = impl.get();
  // The window at the top of the GPU arena: loads land there (Placement::kHigh), clear of the
  // model states pinned for the step, which go below it.
  if (auto status = store.reserve_high(TierKind::kGpu, raw->options.window_bytes); !status.ok()) {
    return annotate(status, "activation stash");
  }
  auto stash = std::make_unique<ActivationStash>(std::move(impl));
  raw->mover = std::thread([raw] { raw->run_mover(); });
  raw->fetcher = std::thread([raw] { raw->run_fetcher(); });
  return stash;
}

ActivationStash::ActivationStash(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ActivationStash::~ActivationStash() {
  Impl& s = *impl_;
  {
    MutexLock lock(&s.mu);
    // Activations the trainer still holds: give its acquisitions back on the stash's own stream
    // (the trainer is done with them, or is misusing a destroyed stash) and destroy them.
    std::vector<std::pair<TensorHandle, uint32_t>> releases;
    for (auto& [id, e] : s.entries) s.cancel_fetch(*e);
    for (auto& [id, e] : s.entries) s.wait_fetch(*e);
    for (auto& [id, e] : s.entries) {
      if (e->destroying) continue;
      const uint32_t held = e->loads + (e->phase == Phase::kWriting ? 1 : 0);
      if (held > 0) {
        STRATA_LOG(kWarn, "activation stash destroyed while '%s' is still %s", e->name,
                   e->phase == Phase::kWriting ? "being written" : "loaded");
        releases.emplace_back(e->tensor, held);
      }
      e->freed = true;
      e->loads = 0;
      if (e->phase == Phase::kWriting) e->phase = Phase::kHome;
      ++e->releasing;
    }
    {
      MutexUnlock unlocked(&s.mu);
      for (const auto& [tensor, held] : releases) {
        for (uint32_t i = 0; i < held; ++i) (void)s.store.release(tensor, *s.own_stream);
      }
    }
    for (auto& [id, e] : s.entries) {
      if (e->destroying) continue;
      --e->releasing;
      s.destroy_when_idle(*e);
    }
    s.stopping = true;
    s.work.Signal();
    s.fetch_work.Signal();
  }
  if (s.fetcher.joinable()) s.fetcher.join();
  if (s.mover.joinable()) s.mover.join();
  s.store.unreserve_high(TierKind::kGpu, s.options.window_bytes);
}

void ActivationStash::step_begin() {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  s.close_step();
  ++s.step;
  ++s.counters.steps;
  s.step_saves.clear();
  s.kept_bytes = 0;
}

void ActivationStash::step_end() {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  s.close_step();
}

absl::StatusOr<ActivationStash::Buffer> ActivationStash::allocate(uint64_t bytes, TierKind tier,
                                                                  Stream& stream) {
  Impl& s = *impl_;
  if (bytes == 0) {
    return absl::InvalidArgumentError("activation stash: an activation of 0 bytes");
  }
  if (tier == TierKind::kNvme) {
    return absl::InvalidArgumentError(
        "activation stash: allocate() hands out gpu or cpu memory (NVMe is not addressable)");
  }
  MutexLock lock(&s.mu);
  const auto save_index = static_cast<uint32_t>(s.step_saves.size());
  const std::string what = absl::StrFormat("saving activation %d of step %d (%s)", save_index,
                                           s.step, format_bytes(bytes));
  auto owned = std::make_unique<Impl::Entry>();
  Impl::Entry& e = *owned;
  e.id = s.next_id++;
  e.name = absl::StrFormat("%s.%d", s.options.name, e.id);
  e.bytes = bytes;
  e.footprint = (bytes + s.gpu_granularity - 1) / s.gpu_granularity * s.gpu_granularity;
  e.step = s.step;
  e.save_index = save_index;
  e.written = tier;
  if (tier == TierKind::kGpu) {
    if (auto room = s.make_room(e.footprint, what); !room.ok()) return room;
    s.count_in(e);  // reserved now: other threads see the window taken
  }
  ++e.releasing;  // not destroyable while this call works on it
  s.entries.emplace(e.id, std::move(owned));
  s.step_saves.push_back(e.id);
  absl::StatusOr<void*> data;
  absl::StatusOr<TensorHandle> tensor;
  absl::Status failed;
  for (;;) {
    const uint64_t done_before = s.background_done;
    {
      MutexUnlock unlocked(&s.mu);
      tensor = s.store.create(e.name, bytes, s.options.home,
                              CreateOptions{.scheduled = false, .placement = Placement::kHigh});
      if (tensor.ok()) {
        data = s.store.acquire(*tensor, tier, stream, AccessMode::kWrite);
        if (!data.ok()) (void)s.store.destroy(*tensor);
      }
    }
    failed = tensor.ok() ? data.status() : tensor.status();
    // A full home tier may be one the mover is emptying: activations freed in backward are
    // destroyed in the background once the device work that used them is done (and once a
    // fetch of theirs in flight ends), so the next step's first saves can find their room still
    // taken. Wait for the background work to finish (as synchronize()), then try again (also
    // when some finished while this attempt ran: its room may have come too late for it); a
    // tier full of live activations is still an error.
    const auto background = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
      return !s.jobs.empty() || s.running > 0 || !s.fetches.empty() || s.fetching > 0;
    };
    if (failed.ok() || !absl::IsResourceExhausted(failed) ||
        (!background() && s.background_done == done_before)) {
      break;
    }
    ++s.counters.home_room_waits;
    while (background()) wait(&s.changed, &s.mu);
  }
  --e.releasing;
  if (!failed.ok()) {
    if (e.on_gpu) s.count_out(e);
    s.step_saves.back() = 0;
    const ActivationId id = e.id;
    s.entries.erase(id);  // `e` dies here
    s.changed.SignalAll();
    std::string fix;
    if (absl::IsResourceExhausted(failed)) {
      fix = s.options.home == TierKind::kCpu
                ? "; or keep activations on NVMe (home nvme), or save fewer (activation "
                  "checkpointing)"
                : "; or save fewer activations (activation checkpointing)";
    }
    return absl::Status(failed.code(), absl::StrFormat("activation stash: %s failed: %s%s", what,
                                                       failed.message(), fix));
  }
  e.tensor = *tensor;
  ++s.counters.saved;
  s.counters.saved_bytes += bytes;
  ++s.counters.live;
  s.counters.live_bytes += bytes;
  return Buffer{e.id, *data};
}

absl::Status ActivationStash::offload(ActivationId id, Stream& stream) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.find(id);
  if (!found.ok()) return found.status();
  Impl::Entry& e = **found;
  if (e.phase != Phase::kWriting || e.releasing > 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "activation '%s' was offloaded already: offload() once, after writing it", e.name));
  }
  if (absl::Status released = s.release(e, stream, 1); !released.ok()) return released;
  // Backward wants it within prefetch_bytes of its start (keep_tail): a GPU copy stays rather
  // than going home and straight back; one written to the CPU tier is fetched back at once,
  // overlapping the rest of forward, so that backward's first loads find it there.
  bool tail = false;
  if (s.options.keep_tail && e.step == s.step) {
    const auto through = s.order.bytes_through(e.save_index);
    tail = through.has_value() && *through <= s.options.prefetch_bytes &&
           s.kept_bytes + e.footprint <= s.options.prefetch_bytes;
  }
  if (tail && e.written == TierKind::kGpu) {
    e.phase = Phase::kKept;
    s.kept_bytes += e.footprint;
    ++s.counters.kept;
    return absl::OkStatus();
  }
  if (e.written == TierKind::kCpu && s.options.home == TierKind::kCpu) {
    e.phase = Phase::kHome;  // written home directly
    ++s.counters.offloaded;
    s.counters.offloaded_bytes += e.bytes;
    if (tail && s.counters.gpu_bytes + e.footprint <= s.options.window_bytes) {
      s.kept_bytes += e.footprint;
      s.fetch(e);
    }
    return absl::OkStatus();
  }
  s.queue(Impl::JobKind::kMoveHome, e);
  return absl::OkStatus();
}

absl::StatusOr<const void*> ActivationStash::load(ActivationId id, Stream& stream) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.find(id);
  if (!found.ok()) return found.status();
  Impl::Entry& e = **found;
  if (e.phase == Phase::kWriting) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "activation '%s' is still being written: offload() it before load()", e.name));
  }
  if (e.phase == Phase::kMoving) {
    const absl::Time start = absl::Now();
    ++e.releasing;  // keeps it while waiting
    while (e.phase == Phase::kMoving) wait(&s.changed, &s.mu);
    --e.releasing;
    s.counters.load_wait_ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
  }
  if (!e.error.ok()) return e.error;
  if (e.freed)
    return absl::FailedPreconditionError(absl::StrFormat("activation '%s' was freed", e.name));
  if (e.fetch_queued) {
    // Its fetch has not started: this load fetches it itself (it stays in the window).
    std::erase(s.fetches, &e);
    e.fetch_queued = false;
    e.prefetched = false;
    ++s.counters.loads_on_demand;
  } else if (!e.on_gpu) {
    ++e.releasing;
    const absl::Status room = s.make_room(e.footprint, absl::StrFormat("loading '%s'", e.name));
    --e.releasing;
    if (!room.ok()) return room;
    if (e.freed)
      return absl::FailedPreconditionError(absl::StrFormat("activation '%s' was freed", e.name));
    s.count_in(e);
    ++s.counters.loads_on_demand;
  } else if (e.prefetched) {
    ++s.counters.loads_prefetched;
  } else {
    ++s.counters.loads_kept;  // kept by keep_tail, or still here from an earlier load
  }
  e.prefetched = false;
  ++s.counters.loads;
  if (e.step == s.step) s.order.on_load(e.save_index, e.footprint);
  ++e.loads;
  ++e.releasing;
  s.plan_prefetch(e.step, e.save_index);
  absl::StatusOr<void*> data;
  {
    MutexUnlock unlocked(&s.mu);
    data = s.store.acquire(e.tensor, TierKind::kGpu, stream, AccessMode::kRead);
  }
  --e.releasing;
  if (!data.ok()) {
    --e.loads;
    s.destroy_when_idle(e);
    return annotate(data.status(), absl::StrFormat("activation stash: loading '%s'", e.name));
  }
  return static_cast<const void*>(*data);
}

absl::Status ActivationStash::unload(ActivationId id, Stream& stream) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.find(id);
  if (!found.ok()) return found.status();
  Impl::Entry& e = **found;
  if (e.loads == 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("activation '%s' is not loaded: unload() without load()", e.name));
  }
  --e.loads;
  const absl::Status released = s.release(e, stream, 1);
  s.destroy_when_idle(e);
  return released;
}

absl::Status ActivationStash::free(ActivationId id, Stream& stream) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.find(id);
  if (!found.ok()) return found.status();
  Impl::Entry& e = **found;
  e.freed = true;
  s.cancel_fetch(e);
  uint32_t held = e.loads;
  if (e.phase == Phase::kWriting) {
    held += e.releasing == 0 ? 1 : 0;  // an allocate still in progress keeps its acquisition
    e.phase = Phase::kHome;            // nothing to move: it goes
  }
  if (e.phase == Phase::kKept) {
    s.kept_bytes -= std::min(s.kept_bytes, e.footprint);
    e.phase = Phase::kHome;
  }
  e.loads = 0;
  if (e.step == s.step && e.save_index < s.step_saves.size()) s.step_saves[e.save_index] = 0;
  const absl::Status status = s.release(e, stream, held);
  s.destroy_when_idle(e);
  return status;
}

absl::Status ActivationStash::synchronize() {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  while (!s.jobs.empty() || s.running > 0 || !s.fetches.empty() || s.fetching > 0) {
    wait(&s.changed, &s.mu);
  }
  return std::exchange(s.first_error, absl::OkStatus());
}

ActivationStashStats ActivationStash::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->counters;
}

const ActivationStashOptions& ActivationStash::options() const { return impl_->options; }

absl::Status ActivationStash::write_trace(const std::string& path) const {
  const Impl& s = *impl_;
  if (!s.options.record_trace) {
    return absl::FailedPreconditionError(
        "activation stash: no trace was recorded; create the stash with record_trace");
  }
  std::string text = "# ActivationStash GPU-tier lifetimes (arena-replay trace)\n";
  {
    MutexLock lock(&s.mu);
    for (const std::string& line : s.trace) absl::StrAppend(&text, line, "\n");
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrFormat("activation stash: cannot write the trace '%s': %s",
                                               path, std::strerror(errno)));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    return absl::DataLossError(absl::StrFormat(
        "activation stash: writing the trace '%s' failed: %s", path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace strata
