// The trainer's calls: acquire, release, evict, prefetch, and the scheduler's step boundaries.
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <array>

#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

absl::StatusOr<void*> TensorStore::acquire(TensorHandle handle, TierKind tier, Stream& stream,
                                           AccessMode mode) {
  Impl& s = *impl_;
  if (tier == TierKind::kNvme) {
    return absl::InvalidArgumentError(
        "acquire needs the gpu or cpu tier: NVMe copies are not addressable");
  }
  const absl::Time start = absl::Now();
  MutexLock lock(&s.mu);
  auto found = s.live(handle);
  if (!found.ok()) return found.status();
  Impl::Tensor& t = **found;
  OperationGuard guard(s, t);
  const uint64_t k = Impl::key(handle.index, tier);
  const bool overwrite = mode == AccessMode::kOverwrite;
  const Access access{handle.index, tier, overwrite};
  if (t.scheduled) s.schedule.on_acquire(access);
  ++s.counters.acquires;
  t.last_use = ++s.tick;

  // A prefetch of this copy that has not started yet is late: do it here, now (an overwrite
  // needs none: it is dropped, not late).
  bool late = false;
  if (s.queued.erase(k) > 0) {
    std::erase_if(s.prefetch_queue,
                  [&](const auto& q) { return q.first.index == handle.index && q.second == tier; });
    s.prefetch_limit.erase(k);
    late = !overwrite;
  }
  Impl::Copy& c = t.copies[tier_index(tier)];
  const bool was_hit = c.valid();
  // Its prefetch is still being issued, or still landing: this acquire waits for it.
  if (c.prefetching() || (c.arriving() && c.prefetched())) late = true;
  // When this acquire will wait for bytes from NVMe (its own read, or its prefetch still
  // landing), the next accesses' prefetches start first: the drives then never drain between
  // one tensor and the next. Otherwise they start after its move is issued, so that copies reach
  // a link in the order they are needed.
  const bool plan_first =
      s.options.prefetch && (c.arriving() || (!overwrite && s.only_on_nvme(t, tier)));
  if (plan_first) s.plan_prefetches();
  bool waited = false;
  // kOverwrite: set when the copy was made without its bytes (it held garbage until the caller
  // writes), with which copies were valid before, to restore should this acquire fail.
  bool unfetched = false;
  std::array<bool, 3> valid_before{};
  for (;;) {
    if (auto status = s.make_resident(t, tier, std::nullopt, &waited, /*arrive=*/true,
                                      overwrite ? &unfetched : nullptr);
        !status.ok()) {
      return status;
    }
    // A write must not change bytes a move is still copying out: wait for host-side ones (a
    // write-back to NVMe) and for device ones until their event is in the busy list (the caller's
    // work is then ordered after it); then make sure the copy is still here and valid. (A copy
    // made without its bytes has no readers: make_resident checked, with the lock held since.)
    if (!is_write(mode) || c.readers() == 0) break;
    waited = true;
    const absl::Time w = absl::Now();
    wait(&s.changed, &s.mu);
    s.trace_wait("readers of the copy", t, 0, w);
  }
  if (was_hit || unfetched) {
    ++s.counters.hits;
    if (unfetched) ++s.counters.overwrites;
  } else {
    ++s.counters.misses;
  }
  // A prefetch that was issued but has not landed on the device (stream-ordered H2D): the
  // caller's stream will wait for it, so it is late as well.
  for (size_t i = 0; c.prefetched() && !late && i < c.busy.size(); ++i) {
    late = !s.device.query(*c.busy[i].event).value_or(true);
  }
  if (c.prefetched()) {
    // Used, or (an overwrite) a stale prefetch the overwrite took the place of.
    ++(unfetched ? s.counters.prefetches_wasted : s.counters.prefetches_used);
    c.clear_prefetched();
  }
  if (late) {
    ++s.counters.prefetches_late;
    if (t.scheduled) s.schedule.on_late(access);
  }
  if (is_write(mode) && c.written_back_early()) {
    ++s.counters.early_writebacks_wasted;  // written again before its eviction
  }
  c.acquire(is_write(mode));
  s.update_pin(t, tier);
  t.acquired.emplace_back(tier, mode);
  if (is_write(mode)) {
    ++t.version;
    for (TierKind other : kTiers) {
      Impl::Copy& o = t.copies[tier_index(other)];
      valid_before[tier_index(other)] = o.valid();
      if (other == tier) continue;
      if (o.prefetched()) ++s.counters.prefetches_wasted;
      o.outdate();
    }
  }
  // Order the caller's work after everything that touched the copy.
  absl::Status status;
  if (tier == TierKind::kGpu) {
    s.prune(c);
    for (const Impl::Busy& b : c.busy) {
      if (auto w = s.device.wait(stream, *b.event); !w.ok() && status.ok()) status = w;
    }
    // And after GPU compaction copies that may still be moving this block into place.
    if (auto w = s.gpu.order_after_compaction(stream); !w.ok() && status.ok()) status = w;
  } else {
    status = s.settle(t, tier);  // host memory: the host itself may touch it at once
  }
  void* address = s.address(t, tier);
  s.counters.stall_ns +=
      waited ? static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start)) : 0;
  if (s.options.prefetch && !plan_first) s.plan_prefetches();
  if (!s.options.prefetch && s.schedule.has_trace()) {  // (else planned with the prefetches)
    s.plan_early_writebacks(s.schedule.upcoming(kMaxUpcoming));
  }
  s.trace_acquire(t, tier, mode, start, was_hit, late);
  if (!status.ok()) {
    t.acquired.pop_back();
    c.release(is_write(mode));
    if (unfetched) {
      // The copy holds no bytes of the tensor: the copies that held the newest ones before
      // (nothing has read or replaced them while this copy had a writer) are the newest again.
      c.outdate();
      for (TierKind other : kTiers) {
        Impl::Copy& o = t.copies[tier_index(other)];
        if (other != tier && o.present() && valid_before[tier_index(other)]) o.restore();
      }
    }
    s.update_pin(t, tier);
    s.changed.SignalAll();
    return status;
  }
  return address;
}

absl::Status TensorStore::release(TensorHandle handle, Stream& stream) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.live(handle);
  if (!found.ok()) return found.status();
  Impl::Tensor& t = **found;
  if (t.acquired.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("tensor '%s' is not acquired: release without acquire", t.name));
  }
  const auto [tier, mode] = t.acquired.back();
  Impl::Copy& c = t.copies[tier_index(tier)];
  // One busy entry per stream: re-record this stream's event when nobody else holds it, else
  // take a pooled one. Either way the list does not grow with the number of releases.
  s.prune(c);
  auto same = std::find_if(c.busy.begin(), c.busy.end(),
                           [&](const Impl::Busy& b) { return b.stream == &stream; });
  if (same != c.busy.end() && same->event.use_count() == 1) {
    if (auto status = s.device.record(*same->event, stream); !status.ok()) return status;
  } else {
    auto event = s.mover->events().record(stream);
    if (!event.ok()) return event.status();
    s.add_busy(t, tier, &stream, *std::move(event));
  }
  t.acquired.pop_back();
  c.release(is_write(mode));
  s.watched_in(tier).insert(Impl::key(handle.index, tier));
  s.update_pin(t, tier);
  s.changed.SignalAll();
  return absl::OkStatus();
}

absl::Status TensorStore::evict(TensorHandle handle, TierKind tier) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.live(handle);
  if (!found.ok()) return found.status();
  Impl::Tensor& t = **found;
  Impl::Copy& c = t.copies[tier_index(tier)];
  if (tier == t.home) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor '%s': its home copy (%s) is never evicted", t.name, to_string(tier)));
  }
  while (c.arriving()) wait(&s.changed, &s.mu);  // bytes on their way in: evict what arrives
  if (!c.present() || c.evicting()) return absl::OkStatus();
  if (c.pins() > c.moves_out()) {  // pins beyond the moves reading it are acquisitions
    return absl::FailedPreconditionError(
        absl::StrFormat("tensor '%s' is acquired in the %s tier; release it before evicting",
                        t.name, to_string(tier)));
  }
  auto write = s.evict_copy(t, tier);
  if (!write.ok()) return write.status();
  // A write-back to NVMe is waited for, so that its failure is this call's error (rule 3: the
  // copy then stays). One to the CPU tier ends on the completion worker: this call does not wait
  // for the device copy; a failure is counted in stats().errors and logged, and the copy stays.
  if (*write != nullptr && (*write)->to == TierKind::kNvme) return s.wait_for(**write);
  return absl::OkStatus();
}

absl::Status TensorStore::discard(TensorHandle handle) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.live(handle);
  if (!found.ok()) return found.status();
  Impl::Tensor& t = **found;
  if (!t.acquired.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("tensor '%s' is acquired; release it before discarding its bytes", t.name));
  }
  // A move in flight (a fetch, a write-back) carries bytes nobody needs: the version it started
  // with no longer matches, so it validates nothing when it lands. Copies still used by device
  // work stay allocated until it ends (their busy events), as any stale copy does.
  ++t.version;
  for (Impl::Copy& c : t.copies) {
    if (c.prefetched()) ++s.counters.prefetches_wasted;
    c.outdate();
  }
  ++s.counters.discards;
  s.changed.SignalAll();  // allocations waiting for room may take the stale copies now
  return absl::OkStatus();
}

absl::Status TensorStore::wait_evicted(TensorHandle handle, TierKind tier) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.live(handle);
  if (!found.ok()) return found.status();
  Impl::Tensor& t = **found;
  const Impl::Copy& c = t.copies[tier_index(tier)];
  while (c.evicting()) wait(&s.changed, &s.mu);
  if (!c.present()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "tensor '%s': its %s copy stays (acquired again, or its write-back failed: see the log)",
      t.name, to_string(tier)));
}

absl::Status TensorStore::prefetch(TensorHandle handle, TierKind tier) {
  Impl& s = *impl_;
  if (tier == TierKind::kNvme) {
    return absl::InvalidArgumentError("prefetch targets the gpu or cpu tier");
  }
  MutexLock lock(&s.mu);
  auto found = s.live(handle);
  if (!found.ok()) return found.status();
  const uint64_t k = Impl::key(handle.index, tier);
  if (s.queued.insert(k).second) {
    s.prefetch_queue.emplace_back(handle, tier);
    s.prefetch_work.Signal();
  }
  return absl::OkStatus();
}

void TensorStore::step_begin() {
  MutexLock lock(&impl_->mu);
  impl_->schedule.step_begin();
  if (impl_->options.prefetch) impl_->plan_prefetches();
}

void TensorStore::step_end() {
  MutexLock lock(&impl_->mu);
  impl_->schedule.step_end();
}

absl::Status TensorStore::set_access_order(
    const std::vector<std::pair<TensorHandle, TierKind>>& order) {
  std::vector<OrderedAccess> plan;
  plan.reserve(order.size());
  for (const auto& [handle, tier] : order) plan.push_back(OrderedAccess{handle, tier});
  return set_access_plan(plan);
}

absl::Status TensorStore::set_access_plan(const std::vector<OrderedAccess>& order) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  std::vector<Access> accesses;
  for (const auto& [handle, tier, mode] : order) {
    if (auto found = s.live(handle); !found.ok()) return found.status();
    if (tier == TierKind::kNvme) {
      return absl::InvalidArgumentError("the access order names gpu or cpu acquires only");
    }
    accesses.push_back(Access{handle.index, tier, mode == AccessMode::kOverwrite});
  }
  s.schedule.set_order(std::move(accesses));
  // Prefetches planned from the old order and not started are for accesses that may not come.
  std::erase_if(s.prefetch_queue, [&](const auto& q) {
    const uint64_t k = Impl::key(q.first.index, q.second);
    if (s.prefetch_limit.erase(k) == 0) return false;  // an explicit prefetch(): it stays
    s.queued.erase(k);
    return true;
  });
  if (s.options.prefetch) s.plan_prefetches();
  return absl::OkStatus();
}

}  // namespace strata
