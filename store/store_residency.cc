// Residency: the device work each copy is busy with, and making a copy hold the newest bytes.
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>

#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

void* Impl::address(Tensor& t, TierKind tier) {
  auto result = tier_of(tier)->address(t.copies[tier_index(tier)].block);
  return result.ok() ? *result : nullptr;
}

// An arena block stays pinned (compaction must not move it) while anything uses it.
void Impl::update_pin(Tensor& t, TierKind tier) {
  MemoryTier* memory = tier_of(tier);
  Copy& c = t.copies[tier_index(tier)];
  if (memory == nullptr || !c.present()) return;
  const bool want = c.pins() > 0 || c.arriving() || !c.busy.empty();
  if (want == c.arena_pinned()) return;
  if (want ? memory->pin(c.block).ok() : memory->unpin(c.block).ok()) c.set_arena_pinned(want);
}

void Impl::prune(Copy& c) {
  std::erase_if(c.busy, [&](const Busy& b) {
    auto done = device.query(*b.event);
    return !done.ok() || *done;
  });
}

void Impl::add_busy(Tensor& t, TierKind tier, const Stream* stream, std::shared_ptr<Event> event) {
  Copy& c = t.copies[tier_index(tier)];
  prune(c);
  auto same =
      std::find_if(c.busy.begin(), c.busy.end(), [&](const Busy& b) { return b.stream == stream; });
  if (same != c.busy.end()) {
    same->event = std::move(event);  // recorded later on the same stream: covers the old one
  } else {
    c.busy.push_back(Busy{stream, std::move(event)});
    counters.busy_peak = std::max<uint64_t>(counters.busy_peak, c.busy.size());
  }
  watched_in(tier).insert(key(t.index, tier));
  update_pin(t, tier);
}

// Forgets device work that has finished, so the copies it held become movable again.
void Impl::reap(TierKind tier) {
  absl::flat_hash_set<uint64_t>& set = watched_in(tier);
  for (auto it = set.begin(); it != set.end();) {
    const auto index = static_cast<uint32_t>(*it >> 2);
    auto next = std::next(it);
    if (index < tensors.size()) {
      Tensor& t = *tensors[index];
      Copy& c = t.copies[tier_index(tier)];
      prune(c);
      if (c.busy.empty()) {
        set.erase(it);
        update_pin(t, tier);
      }
    }
    it = next;
  }
}

absl::Status Impl::settle(Tensor& t, TierKind tier) {
  Copy& c = t.copies[tier_index(tier)];
  while (!c.busy.empty()) {
    std::vector<std::shared_ptr<Event>> events;
    for (const Busy& b : c.busy) events.push_back(b.event);
    absl::Status status;
    {
      MutexUnlock unlock(&mu);
      for (const auto& e : events) {
        if (auto s = device.synchronize(*e); !s.ok() && status.ok()) status = s;
      }
    }
    if (!status.ok()) return status;
    std::erase_if(c.busy, [&](const Busy& b) {
      return std::find(events.begin(), events.end(), b.event) != events.end();
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
    if (k != dst && c.valid()) return k;
  }
  return std::nullopt;
}

absl::StatusOr<std::shared_ptr<Impl::InFlight>> Impl::write_back(Tensor& t, TierKind from) {
  const TierKind home = t.home;
  Copy& src = t.copies[tier_index(from)];
  Copy& dst = t.copies[tier_index(home)];
  while (dst.arriving()) wait_while_moving(t, home, "home copy moving");
  // The wait released the lock: a write elsewhere may have made this copy stale since the
  // caller looked. Its bytes are then not the newest and must not become the home copy. Nor
  // may a copy the trainer acquired for writing meanwhile be read: its bytes are not final, and
  // the move would carry the same version as the write (the next write-back takes them).
  if (!src.valid() || src.writers() > 0) return nullptr;
  if (dst.pins() > 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "tensor '%s': cannot write back to its home tier (%s) while that copy is acquired", t.name,
        to_string(home)));
  }
  return start_move(t, from, home);
}

// Makes the copy in `tier` valid. Waits for moves in flight; sets *waited when it had to wait
// for or perform a move. With `arrive` false, a move it starts is not waited for.
absl::Status Impl::make_resident(Tensor& t, TierKind tier, std::optional<uint64_t> evict_beyond,
                                 bool* waited, bool arrive, bool* unfetched) {
  for (;;) {
    Copy& c = t.copies[tier_index(tier)];
    if (c.arriving()) {
      *waited = true;
      wait_while_moving(t, tier, "move in flight");
      continue;
    }
    if (c.valid()) {
      cancel_eviction(t, tier);  // wanted again
      return absl::OkStatus();
    }
    if (unfetched != nullptr) {
      // kOverwrite: no bytes are needed, but the tensor must be still. A move of it in flight
      // reads a copy (maybe the home copy) that this write makes stale, and carries bytes this
      // write outdates: wait for it (a write-back that overtook the write would otherwise be
      // refused, or read a copy being rewritten). Writers elsewhere finish first, as for kWrite.
      bool busy = false;
      for (TierKind k : kTiers) {
        const Copy& o = t.copies[tier_index(k)];
        if (o.arriving()) {
          *waited = true;
          wait_while_moving(t, k, "overwrite: move in flight");
          busy = true;
          break;
        }
        if (o.writers() > 0 || o.moves_out() > 0 || o.readers() > 0) {
          *waited = true;
          const absl::Time w = absl::Now();
          wait(&changed, &mu);
          trace_wait(o.writers() > 0 ? "writer" : "overwrite: readers of a copy", t, 0, w);
          busy = true;
          break;
        }
      }
      if (busy) continue;
      if (!c.present()) {
        if (auto status = allocate(t, tier, evict_beyond); !status.ok()) return status;
        continue;  // allocate() may have released the lock to evict: look again
      }
      // Marked valid without its bytes; the caller takes its writer in the same hold of the
      // lock, so no move reads it before the caller has written it.
      cancel_eviction(t, tier);
      c.declare_valid();
      *unfetched = true;
      return absl::OkStatus();
    }
    const std::optional<TierKind> source = newest_copy(t, tier);
    if (source.has_value() && t.copies[tier_index(*source)].writers() > 0) {
      // The trainer is still writing the newest bytes: they exist once it releases them.
      *waited = true;
      const absl::Time w = absl::Now();
      wait(&changed, &mu);
      trace_wait("writer", t, 0, w);
      continue;
    }
    const bool source_moving =
        !source.has_value() &&
        std::any_of(t.copies.begin(), t.copies.end(), [](const Copy& x) { return x.arriving(); });
    if (source_moving) {  // the newest bytes are on their way somewhere: wait for them
      *waited = true;
      const absl::Time w = absl::Now();
      wait(&changed, &mu);
      trace_wait("source moving", t, 0, w);
      continue;
    }
    if (!c.present()) {
      if (auto status = allocate(t, tier, evict_beyond); !status.ok()) return status;
      continue;  // allocate() may have released the lock to evict: decide the source again
    }
    if (!source.has_value()) {
      // Never written: any bytes are the tensor's bytes (contents are undefined until written).
      cancel_eviction(t, tier);
      c.declare_valid();
      return absl::OkStatus();
    }
    *waited = true;
    auto moved = start_move(t, *source, tier);
    if (!moved.ok()) {
      drop_copy(t, tier);  // rule 3: the source stays; the half-filled destination goes
      return moved.status();
    }
    // A move with host I/O or into host memory ends on the completion worker: wait for it here
    // (the caller needs the bytes). Its failure has dropped the destination already.
    if (*moved != nullptr && !arrive) return absl::OkStatus();  // a prefetch: it lands by itself
    if (*moved != nullptr) {
      const absl::Time w = absl::Now();
      const absl::Status status = wait_for(**moved);
      trace_wait("own move", t, (*moved)->trace_id, w);
      if (!status.ok()) return status;
    }
    // Valid now, or a write elsewhere overtook the move: the loop fetches again.
  }
}

}  // namespace strata
