// TensorStore: creation and teardown, and the handle table (create, destroy, find, info).
// The rest of the store is in the files listed in tensor_store_impl.h.
#include <absl/strings/str_format.h>

#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

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
  auto mover = TierMover::create(device, nvme, staging);
  if (!mover.ok()) return mover.status();
  impl->mover = *std::move(mover);
  auto store = std::make_unique<TensorStore>(std::move(impl));
  store->impl_->start_completion_worker();
  store->impl_->start_workers();
  store->impl_->start_early_writer();
  return store;
}

TensorStore::TensorStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TensorStore::~TensorStore() {
  impl_->stop_workers();
  impl_->stop_early_writer();
  // Finishes every move in flight and every eviction waiting for device work first.
  impl_->stop_completion_worker();
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  for (auto& t : s.tensors) {
    for (TierKind tier : kTiers) {
      if (t->live) (void)s.settle(*t, tier);
    }
  }
}

absl::StatusOr<TensorHandle> TensorStore::create(std::string name, uint64_t bytes, TierKind home,
                                                 CreateOptions options) {
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
  t.scheduled = options.scheduled;
  t.placement = options.placement;
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
  t.live = false;                                    // no new operation starts on it
  while (t.operations > 0) wait(&s.changed, &s.mu);  // moves in flight end first
  for (TierKind tier : kTiers) {
    Impl::Copy& c = t.copies[tier_index(tier)];
    if (!c.present()) continue;
    const absl::Status settled = s.settle(t, tier);
    if (tier == TierKind::kNvme) {
      (void)s.nvme->free(c.extent);
      (void)c.drop();  // (checks that nothing uses it: the operations on it have ended)
      c = Impl::Copy();
    } else if (settled.ok()) {
      // Not drop_copy(): its rule-1 guard keeps the last valid copy, which here must go too.
      MemoryTier& memory = *s.tier_of(tier);
      if (c.arena_pinned()) (void)memory.unpin(c.block);
      (void)memory.free(c.block);
      (void)c.drop();
      c = Impl::Copy();
    }
    // A copy whose device work could not be confirmed finished keeps its memory: the device
    // may still be writing it.
  }
  for (TierKind tier : {TierKind::kGpu, TierKind::kCpu}) {
    s.watched_in(tier).erase(Impl::key(handle.index, tier));
    s.dropping.erase(Impl::key(handle.index, tier));
  }
  s.names.erase(t.name);
  s.schedule.forget(handle.index);
  const uint32_t generation = t.generation + 1;
  t = Impl::Tensor();
  t.index = handle.index;
  t.generation = generation;
  s.free_slots.push_back(handle.index);
  --s.counters.tensors;
  s.changed.SignalAll();  // allocations waiting for one of its copies to go
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

}  // namespace strata
