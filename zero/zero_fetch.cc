// Stage 3's parameters: each rank holds its shard of every partitioned group; a use gathers the
// group into a transient tensor in the comm tier (the GPU arena, whose blocks come and go without
// fragmenting it), ahead of need along the order recorded in the last step.
//
// Every decision here — what to gather, what to keep, what to drop for room — is a function of
// the sequence of acquire/release calls and of the sizes, never of timing (whether a gather has
// finished is not consulted), so ranks that make the same calls issue the same collectives.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <set>

#include "strata/base/log.h"
#include "strata/base/mutex.h"
#include "zero_engine_impl.h"

namespace strata {

// The parameter API over the fetch machinery below: stages 1-2 wrap the store, stage 3 gathers.
absl::StatusOr<void*> ZeroEngine::acquire_param(ZeroParamId id, TierKind tier, Stream& stream,
                                                AccessMode mode) {
  if (auto st = impl_->check_param(id); !st.ok()) return st;
  if (impl_->groups[impl_->layout.param_segment(id.index).group].partitioned) {
    if (mode != AccessMode::kRead) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ZeroEngine::acquire_param: parameter '%s' is partitioned (stage 3): its gathered copy "
          "is read-only, the optimizer owns its values; acquire it with AccessMode::kRead",
          impl_->layout.params()[id.index].name));
    }
    return impl_->acquire_gathered(id.index, tier, stream);
  }
  auto view = param_view(id);
  if (!view.ok()) return view.status();
  // The parameter is a slice of its group's tensor, and the store's kOverwrite leaves all of
  // that tensor undefined (nothing fetched): the group's other parameters would be lost. Writing
  // every byte of one parameter is a kWrite of the group.
  if (mode == AccessMode::kOverwrite) mode = AccessMode::kWrite;
  auto data = impl_->runtime.store().acquire(view->tensor, tier, stream, mode);
  if (!data.ok()) return data.status();
  return static_cast<std::byte*>(*data) + view->offset;
}

absl::Status ZeroEngine::release_param(ZeroParamId id, Stream& stream) {
  if (auto st = impl_->check_param(id); !st.ok()) return st;
  if (impl_->groups[impl_->layout.param_segment(id.index).group].partitioned) {
    return impl_->release_gathered(id.index, stream);
  }
  auto view = param_view(id);
  if (!view.ok()) return view.status();
  return impl_->runtime.store().release(view->tensor, stream);
}

uint64_t ZeroEngine::Impl::gathered_bytes(uint32_t group) const {
  return layout.groups()[group].padded * param_bytes;
}

TierKind ZeroEngine::Impl::whole_home() const {
  return options.param_home == TierKind::kNvme ? TierKind::kCpu : options.param_home;
}

absl::Status ZeroEngine::Impl::start_gather(uint32_t group, bool prefetch) {
  TensorStore& store = runtime.store();
  Gathered& g = gathered[group];
  const ZeroFlatGroup& fg = layout.groups()[group];
  // The memory bound counts the dropped tensors not destroyed yet: room for them may take a
  // host wait for the work that used them (this changes when, never what, is gathered).
  if (auto st = reap(gathered_bytes(group)); !st.ok()) return st;
  // Named by the gather: the group's previous tensor may still be retiring.
  auto tensor = store.create(absl::StrCat("zero.group", group, ".gathered", ++gathers_started),
                             gathered_bytes(group), comm_tier);
  if (!tensor.ok()) {
    return absl::Status(tensor.status().code(),
                        absl::StrCat("ZeroEngine: gathering parameter group ", group, ": ",
                                     tensor.status().message(),
                                     "; lower ZeroOptions.max_live_bytes or prefetch_bytes, or "
                                     "enlarge the GPU tier"));
  }
  g.tensor = *tensor;
  live_bytes += gathered_bytes(group);
  count_gathered();
  {
    MutexLock lock(&mu);
    ++counters.all_gathers;
    ++(prefetch ? counters.gathers_prefetched : counters.gathers_on_demand);
  }
  g.prefetched = prefetch;
  // hpZ: once the node's slices hold the current parameters, the node's ranks gather them. A
  // node gather follows, on gather_stream, only collectives issued before it (every one is
  // issued from the trainer's thread in program order), so the two communicators' queues
  // cannot wait on each other in a cycle.
  const bool hpz = groups[group].secondary.valid();
  const bool in_node = hpz && secondary_fresh[group];
  const TensorHandle source = in_node ? groups[group].secondary : groups[group].shard_params;
  {
    MutexLock lock(&mu);
    (in_node ? counters.node_gather_bytes : counters.global_gather_bytes) += gathered_bytes(group);
  }
  auto out = store.acquire(g.tensor, comm_tier, *gather_stream, AccessMode::kWrite);
  if (!out.ok()) return out.status();
  auto in = store.acquire(source, comm_tier, *gather_stream, AccessMode::kRead);
  if (!in.ok()) {
    (void)store.release(g.tensor, *gather_stream);
    return in.status();
  }
  // Ordered on gather_stream, and both tensors released at once: the store keeps their memory
  // until the gather has ended, and the group's users wait for it on their streams.
  if (gloo) g.done = std::make_shared<std::atomic<bool>>(false);
  absl::Status status =
      in_node ? gather_on(*node_comm, node_rank, *in, *out, fg.padded / node_ranks, g.done)
              : gather(*in, *out, fg.shard, g.done);
  if (status.ok() && hpz && !in_node) {
    // Keep this rank's node slice of what was gathered, copied after the gather on its stream.
    const uint64_t slice = fg.padded / node_ranks * param_bytes;
    // kOverwrite: the copy writes all of it, so the stale slice is not fetched from its home.
    auto kept =
        store.acquire(groups[group].secondary, comm_tier, *gather_stream, AccessMode::kOverwrite);
    status = kept.ok() ? runtime.device().copy_async(
                             *kept, static_cast<std::byte*>(*out) + node_rank * slice, slice,
                             CopyKind::kDeviceToDevice, *gather_stream)
                       : kept.status();
    if (kept.ok()) {
      if (auto st = store.release(groups[group].secondary, *gather_stream); !st.ok() && status.ok())
        status = st;
    }
    if (status.ok()) secondary_fresh[group] = true;
  }
  for (TensorHandle t : {source, g.tensor}) {
    if (auto st = store.release(t, *gather_stream); !st.ok() && status.ok()) status = st;
  }
  return status;
}

void ZeroEngine::Impl::note_ready(uint32_t group) {
  Gathered& g = gathered[group];
  // A statistic of timing only: whether a prefetched gather had ended when its group was used.
  const bool late = g.prefetched && g.done != nullptr && !g.done->load(std::memory_order_acquire);
  MutexLock lock(&mu);
  if (late) ++counters.prefetch_late;
}

void ZeroEngine::Impl::count_gathered() {
  MutexLock lock(&mu);
  counters.gathered_bytes = live_bytes;
  counters.retiring_bytes = retiring_bytes;
  counters.gathered_peak_bytes =
      std::max(counters.gathered_peak_bytes, live_bytes + retiring_bytes);
}

absl::Status ZeroEngine::Impl::drop_gathered(uint32_t group, bool now) {
  Gathered& g = gathered[group];
  if (!g.tensor.valid()) return absl::OkStatus();
  live_bytes -= gathered_bytes(group);
  {
    MutexLock lock(&mu);
    if (g.prefetched) ++counters.gathers_dropped_unused;
  }
  Retiree r{g.tensor, gathered_bytes(group), std::move(g.used)};
  g = Gathered();
  absl::Status status;
  if (!now) {
    // The gather's own work (a prefetch nobody used has no other) ends on gather_stream.
    auto event = runtime.device().create_event();
    status = event.ok() ? runtime.device().record(**event, *gather_stream) : event.status();
    if (status.ok()) {
      r.used.push_back(*std::move(event));
      retiring_bytes += r.bytes;
      retiring.push_back(std::move(r));
      return reap();
    }
  }
  // Destroyed now: the store waits on the host for the work that used the tensor.
  if (auto st = runtime.store().destroy(r.tensor); !st.ok() && status.ok()) status = st;
  count_gathered();
  return status;
}

absl::Status ZeroEngine::Impl::reap(uint64_t need) {
  Device& device = runtime.device();
  absl::Status status;
  auto ended = [&](Retiree& r) {
    for (auto& e : r.used) {
      auto done = device.query(*e);
      if (!done.ok() || !*done) return false;
    }
    return true;
  };
  auto destroy = [&](Retiree& r) {
    if (auto st = runtime.store().destroy(r.tensor); !st.ok() && status.ok()) status = st;
    retiring_bytes -= r.bytes;
  };
  for (auto it = retiring.begin(); it != retiring.end();) {
    if (!ended(*it)) {
      ++it;
      continue;
    }
    destroy(*it);
    it = retiring.erase(it);
  }
  while (!retiring.empty() &&
         (need == kAllRetired || (need > 0 && live_bytes + retiring_bytes + need > live_limit))) {
    Retiree& oldest = retiring.front();
    for (auto& e : oldest.used) {
      if (auto st = device.synchronize(*e); !st.ok() && status.ok()) status = st;
    }
    destroy(oldest);
    retiring.pop_front();
  }
  count_gathered();
  return status;
}

uint64_t ZeroEngine::Impl::reuse_distance(uint32_t group) const {
  if (!order_valid) return UINT64_MAX;
  std::set<uint32_t> between;
  uint64_t bytes = 0;
  for (size_t q = order_at; q < order.size(); ++q) {
    if (order[q] == group) return bytes;
    if (between.insert(order[q]).second) bytes += gathered_bytes(order[q]);
  }
  return UINT64_MAX;
}

absl::Status ZeroEngine::Impl::make_room(uint32_t group) {
  const uint64_t need = gathered_bytes(group);
  while (live_bytes + need > live_limit) {
    // Drop the idle group used last (or never again) in the order.
    int victim = -1;
    uint64_t farthest = 0;
    for (uint32_t g = 0; g < gathered.size(); ++g) {
      if (!gathered[g].tensor.valid() || gathered[g].users > 0) continue;
      const uint64_t d = reuse_distance(g);
      if (victim < 0 || d > farthest) {
        victim = static_cast<int>(g);
        farthest = d;
      }
    }
    if (victim < 0) {
      std::string in_use;
      for (uint32_t g = 0; g < gathered.size(); ++g) {
        if (gathered[g].users > 0) absl::StrAppend(&in_use, in_use.empty() ? "" : ", ", g);
      }
      return absl::ResourceExhaustedError(absl::StrFormat(
          "ZeroEngine: gathering parameter group %d (%d bytes) would take the gathered "
          "parameters to %d bytes, above the live limit of %d (ZeroOptions.max_live_bytes = %s, "
          "bounded by the GPU tier), and every gathered group is in use (groups %s); raise "
          "max_live_bytes (and STRATA_GPU_BYTES) to at least %d or release parameters sooner",
          group, need, live_bytes + need, live_limit,
          options.max_live_bytes ? absl::StrCat(*options.max_live_bytes) : "automatic", in_use,
          live_bytes + need));
    }
    if (auto st = drop_gathered(static_cast<uint32_t>(victim)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void ZeroEngine::Impl::note_use(uint32_t group) {
  // A loop that never steps (evaluation) must not grow the recording without bound.
  constexpr size_t kMaxRecorded = size_t{1} << 20;
  if (recording.size() < kMaxRecorded) recording.push_back(group);
  {
    MutexLock lock(&mu);
    ++counters.fetches;
  }
  if (!order_valid) return;
  if (order_at < order.size() && order[order_at] == group) {
    ++order_at;
    return;
  }
  // The order changed: skip ahead to this use if the order has it, else fetch on demand for
  // the rest of the step (the recording becomes the next step's order).
  {
    MutexLock lock(&mu);
    ++counters.order_changes;
  }
  const auto next = std::find(order.begin() + static_cast<ptrdiff_t>(order_at), order.end(), group);
  if (next != order.end()) {
    order_at = static_cast<size_t>(next - order.begin()) + 1;
    STRATA_LOG(kDebug, "ZeroEngine: group %d used out of the recorded order; realigned", group);
  } else {
    order_valid = false;
    STRATA_LOG(kDebug,
               "ZeroEngine: group %d is not in the rest of the recorded order; fetching on demand "
               "until the step ends",
               group);
  }
}

absl::Status ZeroEngine::Impl::prefetch_ahead(bool shard_hints, int in_use) {
  if (!order_valid) return absl::OkStatus();
  TensorStore& store = runtime.store();
  const bool shard_moves = shard_hints && options.param_home != comm_tier;
  std::set<uint32_t> seen;
  uint64_t ahead = 0;
  bool gathering = true;
  for (size_t q = order_at; q < order.size(); ++q) {
    const uint32_t g = order[q];
    if (!seen.insert(g).second) continue;
    // Gathers up to prefetch_bytes ahead; the shards' own moves (from NVMe, say) twice as far.
    if (ahead >= options.prefetch_bytes) gathering = false;
    if (ahead >= 2 * options.prefetch_bytes) break;
    const uint64_t distance = ahead;  // gathered bytes used before g
    ahead += gathered_bytes(g);
    if (gathered[g].tensor.valid()) continue;
    // Groups kept for reuse that the order needs later than g give way to it (Belady): kept
    // layers must not starve the prefetch of the layers used before them.
    while (gathering && live_bytes + gathered_bytes(g) > live_limit) {
      int victim = -1;
      uint64_t farthest = distance;
      for (uint32_t k = 0; k < gathered.size(); ++k) {
        if (!gathered[k].tensor.valid() || gathered[k].users > 0 || k == g ||
            static_cast<int>(k) == in_use) {
          continue;
        }
        const uint64_t d = reuse_distance(k);
        if (d > farthest) {
          victim = static_cast<int>(k);
          farthest = d;
        }
      }
      if (victim < 0) break;
      if (auto st = drop_gathered(static_cast<uint32_t>(victim)); !st.ok()) return st;
    }
    if (gathering && live_bytes + gathered_bytes(g) <= live_limit) {
      if (auto st = start_gather(g, /*prefetch=*/true); !st.ok()) return st;
      continue;
    }
    gathering = false;  // in order: a later group never overtakes one that did not fit
    if (shard_moves) (void)store.prefetch(groups[g].shard_params, comm_tier);  // a hint only
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> ZeroEngine::Impl::acquire_gathered(uint32_t param, TierKind tier,
                                                         Stream& stream) {
  const uint32_t group = layout.param_segment(param).group;
  MutexLock lock(&fetch_mu);
  if (auto st = failure(); !st.ok()) return st;
  Gathered& g = gathered[group];
  if (g.users == 0) {
    const absl::Time start = absl::Now();
    note_use(group);
    if (g.tensor.valid() && !g.prefetched) {
      MutexLock counters_lock(&mu);
      ++counters.reuses;
    }
    if (!g.tensor.valid()) {
      if (auto st = make_room(group); !st.ok()) return st;
      if (auto st = start_gather(group, /*prefetch=*/false); !st.ok()) return fail(st);
    }
    if (auto st = prefetch_ahead(/*shard_hints=*/true, static_cast<int>(group)); !st.ok()) {
      return fail(st);
    }
    note_ready(group);
    g.prefetched = false;
    MutexLock counters_lock(&mu);
    counters.fetch_wait_ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
  }
  auto data = runtime.store().acquire(g.tensor, tier, stream, AccessMode::kRead);
  if (!data.ok()) return data.status();
  ++g.users;
  ++param_users[param];
  return static_cast<std::byte*>(*data) + layout.param_segment(param).group_offset * param_bytes;
}

absl::Status ZeroEngine::Impl::release_gathered(uint32_t param, Stream& stream) {
  const uint32_t group = layout.param_segment(param).group;
  MutexLock lock(&fetch_mu);
  Gathered& g = gathered[group];
  if (param_users[param] == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ZeroEngine::release_param: parameter '%s' is not acquired; release each acquire_param "
        "once",
        layout.params()[param].name));
  }
  if (auto st = runtime.store().release(g.tensor, stream); !st.ok()) return st;
  // Where the work that used it ends: a drop destroys the tensor only after that.
  auto used = runtime.device().create_event();
  if (!used.ok()) return used.status();
  if (auto st = runtime.device().record(**used, stream); !st.ok()) return st;
  g.used.push_back(*std::move(used));
  --param_users[param];
  if (--g.users > 0) return absl::OkStatus();
  // Kept if the order uses it again soon (the turn from forward to backward), else dropped.
  if (options.reuse_window_bytes > 0 && reuse_distance(group) <= options.reuse_window_bytes) {
    return absl::OkStatus();
  }
  return drop_gathered(group);
}

absl::Status ZeroEngine::Impl::set_order(std::vector<uint32_t> groups_in_order) {
  MutexLock lock(&fetch_mu);
  order = std::move(groups_in_order);
  order_at = 0;
  order_valid = true;
  return absl::OkStatus();
}

absl::Status ZeroEngine::Impl::drop_all_gathered(std::string_view caller) {
  MutexLock lock(&fetch_mu);
  std::string in_use;
  for (uint32_t p = 0; p < param_users.size(); ++p) {
    if (param_users[p] > 0) {
      absl::StrAppend(&in_use, in_use.empty() ? "" : ", ", layout.params()[p].name);
    }
  }
  if (!in_use.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ZeroEngine::", std::string(caller), ": parameters ", in_use,
                     " are still acquired; release_param() them first"));
  }
  absl::Status status;
  for (uint32_t g = 0; g < gathered.size(); ++g) {
    if (auto st = drop_gathered(g, /*now=*/true); !st.ok() && status.ok()) status = st;
  }
  // The parameters are about to change: the next gather of each group is global again.
  secondary_fresh.assign(secondary_fresh.size(), false);
  if (auto st = reap(kAllRetired); !st.ok() && status.ok()) status = st;
  return status;
}

absl::Status ZeroEngine::Impl::next_step_order() {
  MutexLock lock(&fetch_mu);
  if (!recording.empty()) order = std::move(recording);
  recording.clear();
  order_at = 0;
  order_valid = !order.empty();
  // Gathers only: a step leaves no shard move of its own in flight behind it (each hint is
  // consumed by a gather of the same step), so its reads are its own.
  return prefetch_ahead(/*shard_hints=*/false, /*in_use=*/-1);
}

absl::Status ZeroEngine::Impl::bound_live_limit() {
  // A gather that finds no room in the comm tier fails the step on that rank alone, and the
  // ranks' collectives part ways: the limit every rank applies must fit. Other tenants of the
  // tier (the trainer's own tensors) are the trainer's to leave room for.
  TensorStore& store = runtime.store();
  const uint64_t capacity = store.stats().tiers[static_cast<size_t>(comm_tier)].capacity;
  uint64_t engine_bytes = 0;
  auto add = [&](TensorHandle t) {
    if (!t.valid()) return;
    if (auto info = store.info(t); info.ok() && info->home == comm_tier) {
      engine_bytes += info->bytes;
    }
  };
  for (const Group& g : groups) {
    add(g.params);
    add(g.shard_params);
    add(g.secondary);
  }
  for (TensorHandle t : buckets) add(t);
  // A quarter is left for block alignment and for the holes that pinned blocks (groups in use,
  // gathers in flight) leave, which compaction cannot close.
  const uint64_t room = capacity > engine_bytes ? (capacity - engine_bytes) / 4 * 3 : 0;
  uint64_t largest = 0;
  for (uint32_t g = 0; g < groups.size(); ++g) {
    if (groups[g].partitioned) largest = std::max(largest, gathered_bytes(g));
  }
  if (room < largest) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "ZeroEngine: the %s tier (%d bytes) cannot hold the largest gathered parameter group "
        "(%d bytes) in three quarters of what the %d bytes of the engine's tensors homed there "
        "(buckets, shards, persistent parameters) leave; raise STRATA_GPU_BYTES, or lower "
        "bucket_bytes (smaller groups and buckets)",
        to_string(comm_tier), capacity, largest, engine_bytes));
  }
  if (room < live_limit) {
    live_limit = room;
    // Automatic (unset): fitting the tier is what it means. A value the caller set is not
    // what they get: say so.
    if (options.max_live_bytes) {
      log::warn_once(absl::StrFormat(
          "ZeroEngine: max_live_bytes = %d is more than the %s tier can hold beside the "
          "engine's own tensors; gathering at most %d bytes at once (set max_live_bytes to at "
          "most %d, or leave it unset for this limit, to silence this)",
          *options.max_live_bytes, to_string(comm_tier), room, room));
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::set_fetch_order(std::span<const ZeroParamId> ids) {
  Impl& s = *impl_;
  if (s.options.stage != 3) {
    return absl::FailedPreconditionError(
        "ZeroEngine::set_fetch_order: only stage 3 fetches parameters; this engine is stage " +
        std::to_string(s.options.stage));
  }
  std::vector<uint32_t> groups;
  for (ZeroParamId id : ids) {
    if (auto st = s.check_param(id); !st.ok()) return st;
    const uint32_t g = s.layout.param_segment(id.index).group;
    // A group's parameters used one after another are one use of the group.
    if (s.groups[g].partitioned && (groups.empty() || groups.back() != g)) groups.push_back(g);
  }
  return s.set_order(std::move(groups));
}

}  // namespace strata
