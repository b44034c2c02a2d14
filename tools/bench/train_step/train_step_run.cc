#include "bench/train_step/train_step_run.h"

#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <string>
#include <thread>

#include "bench/train_step/simulated_compute.h"

namespace strata::bench {
namespace {

MoveStats all_moves(const StoreStats& s) {
  MoveStats total;
  for (const auto& row : s.moves) {
    for (const MoveStats& m : row) {
      total.bytes += m.bytes;
      total.moves += m.moves;
      total.ns += m.ns;
    }
  }
  return total;
}

}  // namespace

absl::Status run_step(TensorStore& store, Device& device, Stream& stream,
                      const std::vector<TensorHandle>& tensors,
                      const std::vector<PlannedLayer>& plan, bool sync_each_layer,
                      const std::shared_ptr<std::atomic<int64_t>>& spent_ns, ActivationStash* stash,
                      uint64_t activation_bytes, const std::shared_ptr<Timeline>& timeline) {
  std::vector<ActivationId> saved(tensors.size(), 0);  // by tensor index
  auto use = [&](size_t index) -> absl::Status {
    const PlannedLayer& layer = plan[index];
    const std::string name = absl::StrFormat("%s %d", layer.pass, layer.layer);
    const int64_t layer_start = timeline != nullptr ? timeline->now_ns() : 0;
    size_t acquired = 0;
    absl::Status status;
    for (const PlannedAccess& a : layer.accesses) {
      if (stash != nullptr && !tensors[a.tensor].valid()) {  // an activation
        if (a.write) {
          auto buffer = stash->allocate(activation_bytes, TierKind::kGpu, stream);
          status = buffer.status();
          if (buffer.ok()) saved[a.tensor] = buffer->id;
        } else {
          status = stash->load(saved[a.tensor], stream).status();
        }
      } else {
        const AccessMode mode = a.overwrite ? AccessMode::kOverwrite
                                : a.write   ? AccessMode::kWrite
                                            : AccessMode::kRead;
        auto data = store.acquire(tensors[a.tensor], TierKind::kGpu, stream, mode);
        status = data.status();
      }
      if (!status.ok()) break;
      ++acquired;
    }
    if (status.ok()) {
      const absl::Duration compute = absl::Microseconds(layer.compute_ms * 1000);
      status = device.launch_host_callback(stream, [compute, spent_ns, timeline, name] {
        const int64_t start = timeline != nullptr ? timeline->now_ns() : 0;
        simulate_compute(compute, spent_ns.get());
        if (timeline != nullptr) {
          timeline->add(
              Timeline::Span{"compute", name, "compute", start, timeline->now_ns(), 0, 0, {}});
        }
      });
    }
    for (size_t i = 0; i < acquired; ++i) {
      const PlannedAccess& a = layer.accesses[i];
      absl::Status released;
      if (stash != nullptr && !tensors[a.tensor].valid()) {
        released = a.write ? stash->offload(saved[a.tensor], stream)
                           : stash->free(saved[a.tensor], stream);
      } else {
        released = store.release(tensors[a.tensor], stream);
      }
      if (!released.ok() && status.ok()) status = released;
      // Dead after this read: its copies go without a write-back (ordered after the compute
      // that reads it by the release's event, as any eviction is).
      if (released.ok() && a.last_use && tensors[a.tensor].valid()) {
        if (auto discarded = store.discard(tensors[a.tensor]); !discarded.ok() && status.ok()) {
          status = discarded;
        }
      }
    }
    if (status.ok() && sync_each_layer) {
      const int64_t wait_start = timeline != nullptr ? timeline->now_ns() : 0;
      status = device.synchronize(stream);
      if (timeline != nullptr) {
        timeline->add(Timeline::Span{Timeline::thread_track(),
                                     "compute stream",
                                     "wait",
                                     wait_start,
                                     timeline->now_ns(),
                                     0,
                                     0,
                                     {}});
      }
    }
    if (timeline != nullptr) {
      timeline->add(Timeline::Span{
          Timeline::thread_track(), name, "layer", layer_start, timeline->now_ns(), 0, 0, {}});
    }
    return status;
  };
  if (stash != nullptr) stash->step_begin();
  store.step_begin();
  absl::Status status;
  for (size_t i = 0; i < plan.size() && status.ok(); ++i) status = use(i);
  store.step_end();
  absl::Status synced = device.synchronize(stream);
  return status.ok() ? synced : status;
}

TrainStepRun make_run(const char* policy, double seconds, const StepCounters& c) {
  const StoreStats& a = c.after;
  const StoreStats& b = c.before;
  TrainStepRun r;
  r.policy = policy;
  r.step_seconds = seconds;
  r.compute_seconds = c.compute_seconds;
  r.stall_seconds = static_cast<double>(a.stall_ns - b.stall_ns) * 1e-9;
  const MoveStats moves_after = all_moves(a);
  const MoveStats moves_before = all_moves(b);
  r.bytes_moved = moves_after.bytes - moves_before.bytes;
  const auto gpu = static_cast<size_t>(TierKind::kGpu);
  uint64_t in_moves = 0, in_ns = 0, out_moves = 0, out_ns = 0;
  for (size_t other = 0; other < a.moves.size(); ++other) {
    r.bytes_to_gpu += a.moves[other][gpu].bytes - b.moves[other][gpu].bytes;
    r.bytes_from_gpu += a.moves[gpu][other].bytes - b.moves[gpu][other].bytes;
    in_moves += a.moves[other][gpu].moves - b.moves[other][gpu].moves;
    in_ns += a.moves[other][gpu].ns - b.moves[other][gpu].ns;
    out_moves += a.moves[gpu][other].moves - b.moves[gpu][other].moves;
    out_ns += a.moves[gpu][other].ns - b.moves[gpu][other].ns;
  }
  auto mean = [](uint64_t ns, uint64_t n) {
    return n == 0 ? 0.0 : static_cast<double>(ns) * 1e-9 / static_cast<double>(n);
  };
  r.seconds_per_fetch = mean(in_ns, in_moves);
  r.seconds_per_write_back = mean(out_ns, out_moves);
  const uint64_t moves = moves_after.moves - moves_before.moves;
  r.seconds_per_move = moves == 0 ? 0
                                  : static_cast<double>(moves_after.ns - moves_before.ns) * 1e-9 /
                                        static_cast<double>(moves);
  r.hits = a.hits - b.hits;
  r.misses = a.misses - b.misses;
  r.prefetches_issued = a.prefetches_issued - b.prefetches_issued;
  r.prefetches_used = a.prefetches_used - b.prefetches_used;
  r.prefetches_late = a.prefetches_late - b.prefetches_late;
  r.prefetches_wasted = a.prefetches_wasted - b.prefetches_wasted;
  r.prefetches_failed = a.prefetches_failed - b.prefetches_failed;
  r.early_writebacks = a.early_writebacks - b.early_writebacks;
  r.early_writebacks_used = a.early_writebacks_used - b.early_writebacks_used;
  r.early_writebacks_wasted = a.early_writebacks_wasted - b.early_writebacks_wasted;
  r.discards = a.discards - b.discards;
  r.gpu_tier_peak_bytes = a.tiers[static_cast<size_t>(TierKind::kGpu)].peak_used;
  if (c.stash_before.has_value() && c.stash_after.has_value()) {
    const ActivationStashStats& sb = *c.stash_before;
    const ActivationStashStats& sa = *c.stash_after;
    TrainStepRun::Stash st;
    st.loads = sa.loads - sb.loads;
    st.loads_prefetched = sa.loads_prefetched - sb.loads_prefetched;
    st.loads_kept = sa.loads_kept - sb.loads_kept;
    st.loads_on_demand = sa.loads_on_demand - sb.loads_on_demand;
    st.bytes_out = sa.offloaded_bytes - sb.offloaded_bytes;
    st.window_waits = sa.window_waits - sb.window_waits;
    st.window_wait_seconds = static_cast<double>(sa.window_wait_ns - sb.window_wait_ns) * 1e-9;
    st.gpu_peak_bytes = sa.gpu_peak_bytes;
    r.stash = st;
  }
  r.prefetch_accuracy = r.prefetches_issued == 0 ? 0
                                                 : static_cast<double>(r.prefetches_used) /
                                                       static_cast<double>(r.prefetches_issued);
  return r;
}

}  // namespace strata::bench
