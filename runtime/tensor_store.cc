#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <atomic>
#include <thread>

#include "strata/format_bytes.h"
#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

namespace {

constexpr std::array<TierKind, 3> kTiers = {TierKind::kGpu, TierKind::kCpu, TierKind::kNvme};
// Write-backs flush() runs at once.
constexpr size_t kFlushParallelism = 8;

// Keeps a tensor from being destroyed while an operation holds a pointer to it across unlocks.
class OperationGuard {
 public:
  OperationGuard(Impl& impl, Impl::Tensor& t) : impl_(impl), t_(t) { ++t_.operations; }
  ~OperationGuard() {
    --t_.operations;
    impl_.changed.SignalAll();
  }
  OperationGuard(const OperationGuard&) = delete;
  OperationGuard& operator=(const OperationGuard&) = delete;

 private:
  Impl& impl_;
  Impl::Tensor& t_;
};

}  // namespace

absl::StatusOr<Impl::Tensor*> Impl::live(TensorHandle handle) {
  if (!handle.valid() || handle.index >= tensors.size()) {
    return absl::InvalidArgumentError("not a tensor of this store");
  }
  Tensor& t = *tensors[handle.index];
  if (!t.live || t.generation != handle.generation) {
    return absl::NotFoundError("the tensor was destroyed (stale handle)");
  }
  return &t;
}

void* Impl::address(Tensor& t, TierKind tier) {
  auto result = tier_of(tier)->address(t.copies[tier_index(tier)].block);
  return result.ok() ? *result : nullptr;
}

// An arena block stays pinned (compaction must not move it) while anything uses it.
void Impl::update_pin(Tensor& t, TierKind tier) {
  MemoryTier* memory = tier_of(tier);
  Copy& c = t.copies[tier_index(tier)];
  if (memory == nullptr || !c.present) return;
  const bool want = c.pins > 0 || c.moving || !c.busy.empty();
  if (want == c.arena_pinned) return;
  if (want ? memory->pin(c.block).ok() : memory->unpin(c.block).ok()) c.arena_pinned = want;
}

// Forgets device work that has finished, so the copies it held become movable again.
void Impl::reap(TierKind tier) {
  for (auto it = watched.begin(); it != watched.end();) {
    const uint64_t k = *it;
    const auto index = static_cast<uint32_t>(k >> 2);
    const auto kind = static_cast<TierKind>(k & 3);
    auto next = std::next(it);
    if (kind == tier && index < tensors.size()) {
      Tensor& t = *tensors[index];
      Copy& c = t.copies[tier_index(kind)];
      std::erase_if(c.busy, [&](const std::shared_ptr<Event>& e) {
        auto done = device.query(*e);
        return !done.ok() || *done;
      });
      if (c.busy.empty()) {
        watched.erase(it);
        update_pin(t, kind);
      }
    }
    it = next;
  }
}

// Waits (host side, lock released) for all device work on the copy.
absl::Status Impl::settle(Tensor& t, TierKind tier) {
  Copy& c = t.copies[tier_index(tier)];
  while (!c.busy.empty()) {
    std::vector<std::shared_ptr<Event>> events = c.busy;
    absl::Status status;
    {
      MutexUnlock unlock(&mu);
      for (const auto& e : events) {
        if (auto s = device.synchronize(*e); !s.ok() && status.ok()) status = s;
      }
    }
    if (!status.ok()) return status;
    std::erase_if(c.busy, [&](const std::shared_ptr<Event>& e) {
      return std::find(events.begin(), events.end(), e) != events.end();
    });
  }
  update_pin(t, tier);
  return absl::OkStatus();
}

std::optional<TierKind> Impl::newest_copy(const Tensor& t, TierKind dst) const {
  // Closest tier first: for the GPU the CPU copy beats NVMe; for the CPU the GPU is as close.
  const std::array<TierKind, 3> order =
      dst == TierKind::kGpu ? kTiers : std::array{TierKind::kGpu, TierKind::kCpu, TierKind::kNvme};
  for (TierKind k : order) {
    const Copy& c = t.copies[tier_index(k)];
    if (k != dst && c.present && c.valid && !c.moving) return k;
  }
  return std::nullopt;
}

bool Impl::moves_hold(TierKind tier, const Tensor& except) const {
  for (const auto& u : tensors) {
    if (!u->live || u.get() == &except) continue;
    const Copy& c = u->copies[tier_index(tier)];
    if (c.present && (c.moving || c.readers > 0)) return true;
  }
  return false;
}

Impl::Tensor* Impl::choose_victim(const Tensor& keep, TierKind tier,
                                  std::optional<uint64_t> beyond) {
  Tensor* stale = nullptr;
  std::vector<TensorId> candidates;
  for (uint32_t i = 0; i < tensors.size(); ++i) {
    Tensor& u = *tensors[i];
    const Copy& c = u.copies[tier_index(tier)];
    if (!u.live || &u == &keep || u.home == tier || !c.present || c.moving || c.pins > 0) continue;
    if (!c.valid) {
      stale = &u;  // costs nothing to drop
      break;
    }
    if (beyond.has_value()) {
      // A prefetch may only displace tensors needed later than the one it brings.
      const auto next = schedule.next_use(i);
      if (next.has_value() && *next <= *beyond) continue;
    }
    candidates.push_back(i);
  }
  if (stale != nullptr) return stale;
  if (candidates.empty()) return nullptr;
  if (options.belady && schedule.has_trace()) {
    return tensors[schedule.choose_victim(candidates)].get();
  }
  TensorId oldest = candidates.front();
  for (TensorId id : candidates) {
    if (tensors[id]->last_use < tensors[oldest]->last_use) oldest = id;
  }
  return tensors[oldest].get();
}

void Impl::drop_copy(Tensor& t, TierKind tier) {
  Copy& c = t.copies[tier_index(tier)];
  if (!c.present || c.pins > 0 || c.moving || !c.busy.empty()) return;
  // Rule 1, enforced where copies die: the lock may have been released since the caller
  // decided (a write acquire and release can make this the only newest copy meanwhile).
  if (c.valid && !newest_copy(t, tier).has_value()) return;
  if (c.prefetched) ++counters.prefetches_wasted;
  if (c.arena_pinned) (void)tier_of(tier)->unpin(c.block);
  if (MemoryTier* memory = tier_of(tier)) (void)memory->free(c.block);
  c = Copy();
}

absl::Status Impl::write_back(Tensor& t, TierKind from) {
  const TierKind home = t.home;
  Copy& src = t.copies[tier_index(from)];
  Copy& dst = t.copies[tier_index(home)];
  while (dst.moving) wait(&changed, &mu);
  // The wait released the lock: a write elsewhere may have made this copy stale since the
  // caller looked. Its bytes are then not the newest and must not become the home copy.
  if (!src.valid) return absl::OkStatus();
  if (dst.pins > 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "tensor '%s': cannot write back to its home tier (%s) while that copy is acquired", t.name,
        to_string(home)));
  }
  ++src.pins;
  ++src.readers;
  dst.moving = true;
  dst.valid = false;
  update_pin(t, from);
  update_pin(t, home);
  const uint64_t version = t.version;
  absl::Status status = transfer(t, from, home);
  --src.pins;
  --src.readers;
  dst.moving = false;
  if (status.ok() && t.version == version) dst.valid = true;
  update_pin(t, from);
  update_pin(t, home);
  changed.SignalAll();
  if (!status.ok()) ++counters.errors;
  return status;
}

absl::Status Impl::evict_copy(Tensor& t, TierKind tier) {
  OperationGuard guard(*this, t);
  Copy& c = t.copies[tier_index(tier)];
  const bool only_newest = c.valid && !newest_copy(t, tier).has_value();
  if (only_newest) {
    // Rule 1: the newest bytes must exist elsewhere, observed complete, before this copy goes.
    if (auto status = write_back(t, tier); !status.ok()) return status;
    ++counters.evictions_writeback;
  } else if (c.valid) {
    ++counters.evictions_clean;  // rule 2: no write-back
  }
  if (auto status = settle(t, tier); !status.ok()) return status;
  drop_copy(t, tier);
  return absl::OkStatus();
}

absl::Status Impl::allocate(Tensor& t, TierKind tier, std::optional<uint64_t> evict_beyond) {
  Copy& c = t.copies[tier_index(tier)];
  if (tier == TierKind::kNvme) {
    auto extent = nvme->allocate(t.bytes, t.name);
    if (!extent.ok()) return extent.status();
    c.present = true;
    c.extent = *extent;
    return absl::OkStatus();
  }
  MemoryTier& memory = *tier_of(tier);
  for (;;) {
    // Evicting below may release the lock; another thread may have placed this copy meanwhile
    // (and be filling it). Overwriting its block would orphan those bytes.
    if (c.present) return absl::OkStatus();
    reap(tier);
    auto block = memory.allocate(t.bytes);
    if (block.ok()) {
      c.present = true;
      c.block = *block;
      return absl::OkStatus();
    }
    if (!absl::IsResourceExhausted(block.status())) return block.status();
    Tensor* victim = choose_victim(t, tier, evict_beyond);
    if (victim == nullptr && !evict_beyond.has_value() && moves_hold(tier, t)) {
      // Copies being moved (prefetches, write-backs) are only briefly unevictable: an acquire
      // waits for them rather than failing. Prefetches (evict_beyond set) never wait.
      wait(&changed, &mu);
      continue;
    }
    if (victim == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "no room for tensor '%s' (%s) in the %s tier: every resident tensor is acquired, "
          "moving or needed sooner (%s); release tensors or raise %s",
          t.name, format_bytes(t.bytes), to_string(tier), block.status().message(),
          tier == TierKind::kGpu ? "STRATA_GPU_BYTES" : "STRATA_CPU_BYTES"));
    }
    if (auto status = evict_copy(*victim, tier); !status.ok()) return status;
  }
}

// Makes the copy in `tier` valid. Waits for moves in flight; sets *waited when it had to wait
// for or perform a move.
absl::Status Impl::make_resident(Tensor& t, TierKind tier, std::optional<uint64_t> evict_beyond,
                                 bool* waited) {
  for (;;) {
    Copy& c = t.copies[tier_index(tier)];
    if (c.moving) {
      *waited = true;
      wait(&changed, &mu);
      continue;
    }
    if (c.present && c.valid) return absl::OkStatus();
    const std::optional<TierKind> source = newest_copy(t, tier);
    if (source.has_value() && t.copies[tier_index(*source)].writers > 0) {
      // The trainer is still writing the newest bytes: they exist once it releases them.
      *waited = true;
      wait(&changed, &mu);
      continue;
    }
    const bool source_moving =
        !source.has_value() &&
        std::any_of(t.copies.begin(), t.copies.end(), [](const Copy& x) { return x.moving; });
    if (source_moving) {  // the newest bytes are on their way somewhere: wait for them
      *waited = true;
      wait(&changed, &mu);
      continue;
    }
    if (!c.present) {
      if (auto status = allocate(t, tier, evict_beyond); !status.ok()) return status;
      continue;  // allocate() may have released the lock to evict: decide the source again
    }
    if (!source.has_value()) {
      // Never written: any bytes are the tensor's bytes (contents are undefined until written).
      c.valid = true;
      return absl::OkStatus();
    }
    *waited = true;
    Copy& src = t.copies[tier_index(*source)];
    ++src.pins;
    ++src.readers;
    c.moving = true;
    update_pin(t, *source);
    update_pin(t, tier);
    const uint64_t version = t.version;
    absl::Status status = transfer(t, *source, tier);
    --src.pins;
    --src.readers;
    c.moving = false;
    if (status.ok() && t.version == version) c.valid = true;
    update_pin(t, *source);
    update_pin(t, tier);
    changed.SignalAll();
    if (!status.ok()) {
      ++counters.errors;
      drop_copy(t, tier);  // rule 3: the source stays; the half-filled destination goes
      return status;
    }
    // A write elsewhere overtook the move: fetch again from the newer copy.
  }
}

// ---- TensorStore ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::create(Device& device, MemoryTier& gpu,
                                                                 MemoryTier& cpu, SwapSpace* nvme,
                                                                 StagingPool* staging,
                                                                 TensorStoreOptions options) {
  if (gpu.kind() != TierKind::kGpu || cpu.kind() != TierKind::kCpu) {
    return absl::InvalidArgumentError("TensorStore needs the GPU arena and the pinned CPU tier");
  }
  if ((nvme == nullptr) != (staging == nullptr)) {
    return absl::InvalidArgumentError("an NVMe tier needs its staging pool, and only then");
  }
  if (nvme != nullptr && staging->chunk_bytes() % nvme->stripe_bytes() != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("staging chunks (%d bytes) must be whole stripe units (STRATA_IO_BLOCK=%d)",
                        staging->chunk_bytes(), nvme->stripe_bytes()));
  }
  auto impl = std::make_unique<Impl>(device, gpu, cpu, nvme, staging, std::move(options));
  auto h2d = device.create_stream();
  auto d2h = device.create_stream();
  if (!h2d.ok()) return h2d.status();
  if (!d2h.ok()) return d2h.status();
  impl->h2d = *std::move(h2d);
  impl->d2h = *std::move(d2h);
  auto store = std::make_unique<TensorStore>(std::move(impl));
  store->impl_->start_workers();
  return store;
}

TensorStore::TensorStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TensorStore::~TensorStore() {
  impl_->stop_workers();
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  for (auto& t : s.tensors) {
    for (TierKind tier : kTiers) {
      if (t->live) (void)s.settle(*t, tier);
    }
  }
}

absl::StatusOr<TensorHandle> TensorStore::create(std::string name, uint64_t bytes, TierKind home) {
  Impl& s = *impl_;
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("tensor '%s': size must be > 0", name));
  }
  if (!s.has_tier(home)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "tensor '%s': home tier nvme, but this runtime has no NVMe tier; set STRATA_NVME_PATHS",
        name));
  }
  MutexLock lock(&s.mu);
  if (s.names.contains(name)) {
    return absl::AlreadyExistsError(absl::StrFormat("a tensor named '%s' already exists", name));
  }
  uint32_t index;
  if (!s.free_slots.empty()) {
    index = s.free_slots.back();
    s.free_slots.pop_back();
  } else {
    index = static_cast<uint32_t>(s.tensors.size());
    s.tensors.push_back(std::make_unique<Impl::Tensor>());
  }
  Impl::Tensor& t = *s.tensors[index];
  t.index = index;
  t.name = name;
  t.bytes = bytes;
  t.home = home;
  t.live = true;
  // The home copy is reserved now, so a write-back can never fail for lack of room.
  OperationGuard guard(s, t);
  if (auto status = s.allocate(t, home, std::nullopt); !status.ok()) {
    t.live = false;
    ++t.generation;
    s.free_slots.push_back(index);
    return absl::Status(status.code(), absl::StrFormat("creating tensor '%s' (home %s): %s", name,
                                                       to_string(home), status.message()));
  }
  s.names.emplace(std::move(name), index);
  ++s.counters.tensors;
  return TensorHandle{index, t.generation};
}

absl::Status TensorStore::destroy(TensorHandle handle) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.live(handle);
  if (!found.ok()) return found.status();
  Impl::Tensor& t = **found;
  if (!t.acquired.empty()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("tensor '%s' is acquired %d time(s); release it before destroy", t.name,
                        t.acquired.size()));
  }
  t.live = false;  // no new operation starts on it
  while (t.operations > 0) wait(&s.changed, &s.mu);
  for (TierKind tier : kTiers) {
    Impl::Copy& c = t.copies[tier_index(tier)];
    if (!c.present) continue;
    const absl::Status settled = s.settle(t, tier);
    if (tier == TierKind::kNvme) {
      (void)s.nvme->free(c.extent);
      c = Impl::Copy();
    } else if (settled.ok()) {
      // Not drop_copy(): its rule-1 guard keeps the last valid copy, which here must go too.
      MemoryTier& memory = *s.tier_of(tier);
      if (c.arena_pinned) (void)memory.unpin(c.block);
      (void)memory.free(c.block);
      c = Impl::Copy();
    }
    // A copy whose device work could not be confirmed finished keeps its memory: the device
    // may still be writing it.
  }
  s.watched.erase(Impl::key(handle.index, TierKind::kGpu));
  s.watched.erase(Impl::key(handle.index, TierKind::kCpu));
  s.names.erase(t.name);
  s.schedule.forget(handle.index);
  const uint32_t generation = t.generation + 1;
  t = Impl::Tensor();
  t.index = handle.index;
  t.generation = generation;
  s.free_slots.push_back(handle.index);
  --s.counters.tensors;
  return absl::OkStatus();
}

absl::StatusOr<TensorHandle> TensorStore::find(std::string_view name) const {
  const Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto it = s.names.find(std::string(name));
  if (it == s.names.end()) {
    return absl::NotFoundError(absl::StrFormat("no tensor named '%s'", name));
  }
  return TensorHandle{it->second, s.tensors[it->second]->generation};
}

absl::StatusOr<TensorStore::Info> TensorStore::info(TensorHandle handle) const {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto found = s.live(handle);
  if (!found.ok()) return found.status();
  return Info{(*found)->name, (*found)->bytes, (*found)->home};
}

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
  const Access access{handle.index, tier};
  s.schedule.on_acquire(access);
  ++s.counters.acquires;
  t.last_use = ++s.tick;

  // A prefetch of this copy that has not started yet is late: do it here, now.
  bool late = false;
  if (s.queued.erase(k) > 0) {
    std::erase_if(s.prefetch_queue,
                  [&](const auto& q) { return q.first.index == handle.index && q.second == tier; });
    late = true;
  }
  Impl::Copy& c = t.copies[tier_index(tier)];
  const bool was_hit = c.present && c.valid && !c.moving;
  if (c.prefetching) late = true;  // its prefetch is still in flight: this acquire waits for it
  bool waited = false;
  for (;;) {
    if (auto status = s.make_resident(t, tier, std::nullopt, &waited); !status.ok()) {
      return status;
    }
    // A write must not change bytes a move is still copying out (a write-back or a prefetch to
    // another tier): wait for those moves, then make sure the copy is still here and valid.
    if (mode != AccessMode::kWrite || c.readers == 0) break;
    waited = true;
    wait(&s.changed, &s.mu);
  }
  if (was_hit) {
    ++s.counters.hits;
  } else {
    ++s.counters.misses;
  }
  // A prefetch that was issued but has not landed on the device (stream-ordered H2D): the
  // caller's stream will wait for it, so it is late as well.
  for (size_t i = 0; c.prefetched && !late && i < c.busy.size(); ++i) {
    late = !s.device.query(*c.busy[i]).value_or(true);
  }
  if (c.prefetched) {
    ++s.counters.prefetches_used;
    c.prefetched = false;
  }
  if (late) {
    ++s.counters.prefetches_late;
    s.schedule.on_late(access);
  }
  ++c.pins;
  if (mode == AccessMode::kWrite) ++c.writers;
  s.update_pin(t, tier);
  t.acquired.emplace_back(tier, mode);
  if (mode == AccessMode::kWrite) {
    ++t.version;
    for (TierKind other : kTiers) {
      Impl::Copy& o = t.copies[tier_index(other)];
      if (other == tier || !o.present) continue;
      if (o.prefetched) ++s.counters.prefetches_wasted;
      o.valid = false;
      o.prefetched = false;
    }
  }
  // Order the caller's work after everything that touched the copy.
  absl::Status status;
  if (tier == TierKind::kGpu) {
    for (const auto& e : c.busy) {
      if (auto w = s.device.wait(stream, *e); !w.ok() && status.ok()) status = w;
    }
  } else {
    status = s.settle(t, tier);  // host memory: the host itself may touch it at once
  }
  void* address = s.address(t, tier);
  s.counters.stall_ns +=
      waited ? static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start)) : 0;
  if (s.options.prefetch) s.plan_prefetches();
  if (!status.ok()) {
    t.acquired.pop_back();
    --c.pins;
    if (mode == AccessMode::kWrite) --c.writers;
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
  auto event = s.device.create_event();
  if (!event.ok()) return event.status();
  if (auto status = s.device.record(**event, stream); !status.ok()) return status;
  t.acquired.pop_back();
  --c.pins;
  if (mode == AccessMode::kWrite) --c.writers;
  c.busy.push_back(std::shared_ptr<Event>(std::move(*event)));
  s.watched.insert(Impl::key(handle.index, tier));
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
  while (c.moving) wait(&s.changed, &s.mu);
  if (!c.present) return absl::OkStatus();
  if (c.pins > 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("tensor '%s' is acquired in the %s tier; release it before evicting",
                        t.name, to_string(tier)));
  }
  return s.evict_copy(t, tier);
}

absl::Status TensorStore::flush() {
  Impl& s = *impl_;
  std::vector<TensorHandle> dirty;
  {
    MutexLock lock(&s.mu);
    for (const auto& owned : s.tensors) {
      const Impl::Tensor& t = *owned;
      const Impl::Copy& home = t.copies[tier_index(t.home)];
      if (t.live && !home.valid && !home.moving && s.newest_copy(t, t.home).has_value()) {
        dirty.push_back(TensorHandle{t.index, t.generation});
      }
    }
  }
  // Several write-backs at once: each moves one tensor, and one at a time leaves the drives
  // idle between small tensors. Write-backs of different tensors are independent.
  absl::Mutex error_mu;
  absl::Status first;
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < dirty.size(); i = next++) {
      absl::Status status;
      {
        MutexLock lock(&s.mu);
        auto found = s.live(dirty[i]);
        if (!found.ok()) continue;  // destroyed meanwhile: nothing to keep
        Impl::Tensor& t = **found;
        OperationGuard guard(s, t);
        const Impl::Copy& home = t.copies[tier_index(t.home)];
        const std::optional<TierKind> source = s.newest_copy(t, t.home);
        // Still being written by the trainer: its bytes are not final; the next flush takes them.
        if (home.valid || home.moving || !source.has_value() ||
            t.copies[tier_index(*source)].writers > 0) {
          continue;
        }
        status = s.write_back(t, *source);
      }
      if (!status.ok()) {
        MutexLock lock(&error_mu);
        // A private copy: absl::Status shares its message through uninstrumented refcounts.
        if (first.ok()) first = absl::Status(status.code(), status.message());
      }
    }
  };
  const size_t helpers =
      std::min<size_t>(dirty.size(), kFlushParallelism) - (dirty.empty() ? 0 : 1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < helpers; ++i) threads.emplace_back(work);
  work();
  for (auto& thread : threads) thread.join();
  MutexLock lock(&error_mu);
  return absl::Status(first.code(), first.message());
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
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  std::vector<Access> accesses;
  for (const auto& [handle, tier] : order) {
    if (auto found = s.live(handle); !found.ok()) return found.status();
    if (tier == TierKind::kNvme) {
      return absl::InvalidArgumentError("the access order names gpu or cpu acquires only");
    }
    accesses.push_back(Access{handle.index, tier});
  }
  s.schedule.set_order(std::move(accesses));
  if (s.options.prefetch) s.plan_prefetches();
  return absl::OkStatus();
}

StoreStats TensorStore::stats() const {
  const Impl& s = *impl_;
  MutexLock lock(&s.mu);
  StoreStats out = s.counters;
  out.schedule = s.schedule.stats();
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
