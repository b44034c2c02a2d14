#include "bench/zero/zero_steps.h"

#include <absl/strings/str_format.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "bench/optimizer/optimizer_baselines.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status with_context(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("zero: %s: %s", std::string(what),
                                                     std::string(status.message())));
}

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double seconds(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

// What a step needs besides the engine.
struct Rig {
  ZeroEngine& engine;
  Runtime& runtime;
  Communicator& comm;
  Stream& stream;
  HostCompute& compute;
  std::vector<ZeroParamId> ids;
  uint64_t compute_elements = 0;  // per layer and pass
  const PinnedHostMemory& gradient;
  uint64_t layer_bytes = 0;
};

template <typename F>
auto timed(double& into, F&& f) {
  const Clock::time_point start = Clock::now();
  auto result = f();
  into += since(start);
  return result;
}

uint64_t nvme_reads(const StoreStats& s) {
  uint64_t bytes = 0;
  for (size_t to = 0; to < 3; ++to)
    bytes += s.moves[static_cast<size_t>(TierKind::kNvme)][to].bytes;
  return bytes;
}

// acquire_param() returns with the gather ordered on the trainer's stream, not done (at stage 3
// the engine waits for no collective on the host: docs/zero.md). The compute here runs on the
// host, so, as a trainer computing on the host does, it waits for the stream first: the time
// is the exposed gather (gather_wait), what a GPU kernel queued behind the gather would wait.
absl::Status wait_for_gather(Rig& r, Zero3Sample& s) {
  return timed(s.gather_wait, [&] { return r.runtime.device().synchronize(r.stream); });
}

// One training step from `start` (the end of the previous step()) to the end of its step() and
// of its work on the trainer's stream.
absl::StatusOr<Zero3Sample> one_step(Rig& r, Clock::time_point start) {
  ZeroEngine& engine = r.engine;
  Stream& stream = r.stream;
  const ZeroStats z0 = engine.stats();
  const CommStats c0 = r.comm.stats();
  const StoreStats t0 = r.runtime.store().stats();
  const OffloadOptimizerStats o0 = engine.optimizer().stats();
  Zero3Sample s;
  for (const ZeroParamId& id : r.ids) {
    auto p =
        timed(s.acquire_param, [&] { return engine.acquire_param(id, TierKind::kGpu, stream); });
    if (!p.ok()) return with_context(p.status(), "forward: acquire_param");
    if (auto st = wait_for_gather(r, s); !st.ok()) return with_context(st, "forward");
    s.compute += r.compute.run(r.compute_elements);
    if (auto st = timed(s.release_param, [&] { return engine.release_param(id, stream); });
        !st.ok()) {
      return with_context(st, "forward: release_param");
    }
  }
  const Clock::time_point forward_end = Clock::now();
  s.forward = std::chrono::duration<double>(forward_end - start).count();
  for (auto it = r.ids.rbegin(); it != r.ids.rend(); ++it) {
    const ZeroParamId id = *it;
    auto p =
        timed(s.acquire_param, [&] { return engine.acquire_param(id, TierKind::kGpu, stream); });
    if (!p.ok()) return with_context(p.status(), "backward: acquire_param");
    if (auto st = wait_for_gather(r, s); !st.ok()) return with_context(st, "backward");
    s.compute += r.compute.run(r.compute_elements);
    auto grad =
        timed(s.acquire_grad, [&] { return engine.acquire_grad(id, TierKind::kGpu, stream); });
    if (!grad.ok()) return with_context(grad.status(), "backward: acquire_grad");
    // The buffer starts each micro-step at zero: writing the gradient adds it. The copy stands
    // for the layer's compute writing its gradient, so it is waited for here: left on the
    // stream, the next layer's wait for its gather would count it as communication.
    if (auto st = timed(s.grad_copy,
                        [&] {
                          absl::Status copied =
                              r.runtime.device().copy_async(*grad, r.gradient.data(), r.layer_bytes,
                                                            CopyKind::kHostToDevice, stream);
                          if (!copied.ok()) return copied;
                          return r.runtime.device().synchronize(stream);
                        });
        !st.ok()) {
      return with_context(st, "backward: writing a gradient");
    }
    if (auto st = timed(s.grad_ready, [&] { return engine.grad_ready(id, stream); }); !st.ok()) {
      return with_context(st, "backward: grad_ready");
    }
    if (auto st = timed(s.release_param, [&] { return engine.release_param(id, stream); });
        !st.ok()) {
      return with_context(st, "backward: release_param");
    }
  }
  const Clock::time_point backward_end = Clock::now();
  s.backward = std::chrono::duration<double>(backward_end - forward_end).count();
  auto result = timed(s.step_call, [&] { return engine.step(); });
  if (!result.ok()) return with_context(result.status(), "step()");
  if (result->skipped) {
    return absl::InternalError(
        "zero: step() was skipped for an inf/nan gradient; the workload's gradients are finite, "
        "so this is a bug");
  }
  // The step ends when its work on the trainer's stream has (step() waits for the work that
  // used the gathered layers; this makes it certain, and costs nothing when it did).
  if (auto st = r.runtime.device().synchronize(stream); !st.ok()) {
    return with_context(st, "the end of the step");
  }
  s.step = since(start);
  const ZeroStats z1 = engine.stats();
  const CommStats c1 = r.comm.stats();
  const StoreStats t1 = r.runtime.store().stats();
  auto delta = [](uint64_t a, uint64_t b) { return static_cast<double>(b - a); };
  s.optimizer = seconds(z1.last_optimizer_ns);
  s.fetch_wait = seconds(z1.fetch_wait_ns - z0.fetch_wait_ns);
  s.reduce_scatter_wait = seconds(z1.last_step_wait_ns);
  s.gathers_on_demand = delta(z0.gathers_on_demand, z1.gathers_on_demand);
  s.gathers_prefetched = delta(z0.gathers_prefetched, z1.gathers_prefetched);
  s.gathers = s.gathers_on_demand + s.gathers_prefetched;
  s.reuses = delta(z0.reuses, z1.reuses);
  s.prefetch_late = delta(z0.prefetch_late, z1.prefetch_late);
  s.dropped_unused = delta(z0.gathers_dropped_unused, z1.gathers_dropped_unused);
  s.order_changes = delta(z0.order_changes, z1.order_changes);
  s.gathered_peak_bytes = static_cast<double>(z1.gathered_peak_bytes);
  s.all_gather_bytes =
      delta(c0[CollectiveKind::kAllGather].bytes, c1[CollectiveKind::kAllGather].bytes);
  s.reduce_scatter_bytes =
      delta(c0[CollectiveKind::kReduceScatter].bytes, c1[CollectiveKind::kReduceScatter].bytes);
  s.nvme_read_bytes = delta(nvme_reads(t0), nvme_reads(t1));
  const OffloadOptimizerStats o1 = engine.optimizer().stats();
  s.optimizer_step = seconds(o1.last_step_ns);
  s.early_elements = static_cast<double>(o1.last_early_elements);
  s.rolled_back = o1.overlap_rollbacks > o0.overlap_rollbacks ? 1 : 0;
  s.early_wait = seconds(o1.last_early_wait_ns);
  return s;
}

}  // namespace

Zero3Plan plan_of(const Zero3Options& o, int ranks) {
  Zero3Plan p;
  const uint64_t unit = static_cast<uint64_t>(ranks) * kZero3Alignment;
  p.layer_params = o.layer_bytes / kZero3ParamBytes;
  p.padded = (p.layer_params + unit - 1) / unit * unit;
  p.shard = p.padded / static_cast<uint64_t>(ranks);
  p.gathered_bytes = p.padded * kZero3ParamBytes;
  p.prefetch_bytes = o.prefetch_bytes.value_or(2 * p.gathered_bytes);
  p.max_live_bytes = o.max_live_bytes.value_or(4 * p.gathered_bytes);
  p.reuse_window_bytes = o.reuse_window_bytes.value_or(ZeroOptions().reuse_window_bytes);
  p.model_shard_bytes = o.layers * p.shard * kZero3ParamBytes;
  return p;
}

absl::StatusOr<Zero3RankRecord> run_zero3_steps(const Zero3Options& o, const Zero3Plan& plan,
                                                Runtime& rt, Communicator& comm,
                                                HostCompute& compute, uint64_t compute_elements,
                                                const std::function<absl::Status()>& beside_engine,
                                                std::ostream& human) {
  std::vector<ZeroParam> params;
  for (uint64_t l = 0; l < o.layers; ++l) {
    ZeroParam& param = params.emplace_back();
    param.name = absl::StrFormat("layer%d", l);
    param.shape = {static_cast<int64_t>(plan.layer_params)};
  }
  ZeroOptions options;
  options.stage = 3;
  options.param_type = ParamType::kF16;
  options.grad_type = GradType::kF16;
  options.bucket_bytes = o.layer_bytes;  // one group per layer
  options.alignment = kZero3Alignment;
  options.param_home = o.param_home == "gpu"   ? TierKind::kGpu
                       : o.param_home == "cpu" ? TierKind::kCpu
                                               : TierKind::kNvme;
  options.persist_below_bytes = 0;  // every layer partitioned
  options.prefetch_bytes = plan.prefetch_bytes;
  options.max_live_bytes = plan.max_live_bytes;
  options.reuse_window_bytes = plan.reuse_window_bytes;
  options.optimizer.state_home = TierKind::kCpu;
  options.optimizer.defaults = workload_hyper();
  options.optimizer.overlap.enabled = o.overlap;
  Device& device = rt.device();
  // Declared before the engine: destroyed after it.
  auto stream = device.create_stream();
  if (!stream.ok()) return stream.status();
  auto gradient = device.allocate_pinned(o.layer_bytes, "zero gradient pattern");
  if (!gradient.ok()) return gradient.status();
  fill_values(static_cast<std::byte*>((*gradient)->data()), plan.layer_params, "fp16", 1e-2F,
              /*seed=*/1);
  human << absl::StrFormat("zero: creating the engine (%d layers, shards in %s)\n", o.layers,
                           o.param_home);
  human.flush();
  auto engine = ZeroEngine::create(rt, comm, params, options);
  if (!engine.ok()) return with_context(engine.status(), "creating the engine");
  Rig rig{.engine = **engine,
          .runtime = rt,
          .comm = comm,
          .stream = **stream,
          .compute = compute,
          .ids = {},
          .compute_elements = compute_elements,
          .gradient = **gradient,
          .layer_bytes = o.layer_bytes};
  for (const ZeroParam& p : params) {
    auto id = (*engine)->find(p.name);
    if (!id.ok()) return id.status();
    rig.ids.push_back(*id);
  }
  if (absl::Status st = beside_engine(); !st.ok()) return st;
  human << absl::StrFormat("zero: 1 warm-up step (it records the order), %d timed\n", o.steps);
  human.flush();
  Zero3RankRecord record;
  // Untimed, before the warm-up step and between it and the first timed step: the CPU tier's
  // io_uring registration queued so far (nothing, usually, after the warm-up). The timed steps
  // run back to back; pieces they first use are counted (record.fresh) instead.
  rt.wait_for_registration();
  Clock::time_point start = Clock::now();
  for (uint64_t s = 0; s <= o.steps; ++s) {
    const PinCounters pins = pin_counters(rt);
    auto sample = one_step(rig, start);
    if (!sample.ok()) return sample.status();
    if (s == 0) rt.wait_for_registration();
    start = Clock::now();
    if (s > 0) {
      record.fresh.add(pins, pin_counters(rt));
      record.samples.push_back(*sample);
    }
  }
  if (absl::Status st = device.synchronize(**stream); !st.ok()) return st;
  record.memory = (*engine)->memory();
  if (absl::Status st = beside_engine(); !st.ok()) return st;
  return record;
}

}  // namespace strata::bench
