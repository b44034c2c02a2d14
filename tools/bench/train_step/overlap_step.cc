#include "bench/train_step/overlap_step.h"

#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "bench/common.h"
#include "bench/optimizer/optimizer_baselines.h"
#include "bench/train_step/simulated_compute.h"
#include "strata/base/size.h"
#include "strata/device/backend.h"
#include "strata/runtime/runtime.h"

namespace strata::bench {
namespace {

constexpr uint64_t kStateBytes = 12;   // fp32 master, m and v
constexpr uint64_t kElementBytes = 2;  // fp16 weights and gradients
constexpr uint64_t kFillElements = uint64_t{1} << 20;
constexpr uint16_t kF16Inf = 0x7C00;
// Far below the gradients' norm (fill_values' values are about 1e-2 each): every step clips.
constexpr float kClipBelowNorm = 1e-6F;

absl::Status with_context(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrFormat("overlap-step: %s: %s", what, status.message()));
}

double seconds_of(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

// The environment's configuration with the tiers sized to the model: the GPU arena holds every
// weight and gradient (and the arena's compaction bounce buffer, 1/64); the CPU tier the landed
// gradients, the parameters' CPU copies, the states when they live there, the overlap's
// backups (12 bytes an element) and held copies (2), and room for page rounding and pinned
// buffers.
Config sized_config(const TrainStepOptions& o, const Config& base, bool nvme,
                    const std::vector<std::string>& nvme_paths) {
  Config c = base;
  const uint64_t n = o.layers * (o.layer_bytes / kElementBytes);
  const uint64_t payload = 2 * o.layers * o.layer_bytes + o.layers * 2 * 256;
  c.gpu_bytes = SizeSetting::of_bytes(
      round_up(payload + payload / 16 + (uint64_t{4} << 20), uint64_t{1} << 20));
  // The optimizer's own pinned pool (at most 64 MiB) when the runtime has no staging.
  const uint64_t slack = o.layers * 16 * kPage + (uint64_t{80} << 20);
  const uint64_t grads_and_copies = 2 * kElementBytes * n + kElementBytes * n;
  if (!nvme) {
    c.nvme_paths.clear();
    c.cpu_bytes = SizeSetting::of_bytes(round_up(2 * kStateBytes * n + grads_and_copies + slack));
  } else {
    c.nvme_paths = nvme_paths;
    c.cpu_bytes = SizeSetting::of_bytes(round_up(c.staging_bytes + grads_and_copies + slack));
    // Two swap slots per chunk of state, striped over the paths (as the optimizer workload).
    if (std::getenv("STRATA_NVME_BYTES") == nullptr) {
      const uint64_t per_path = 3 * kStateBytes * n / nvme_paths.size();
      c.nvme_bytes = SizeSetting::of_bytes(round_up(per_path, c.io_block) + 64 * c.io_block);
    }
  }
  return c;
}

// Enqueues copies of `bytes` from `src` (pinned) to `tensor` (home GPU) at `offset`, repeating
// `src`, on `stream`.
absl::Status enqueue_write(Runtime& rt, Stream& stream, TensorHandle tensor, uint64_t offset,
                           uint64_t bytes, const PinnedHostMemory& src) {
  TensorStore& store = rt.store();
  auto data = store.acquire(tensor, TierKind::kGpu, stream, AccessMode::kWrite);
  if (!data.ok()) return data.status();
  absl::Status status;
  for (uint64_t done = 0; done < bytes && status.ok(); done += src.size()) {
    status =
        rt.device().copy_async(static_cast<std::byte*>(*data) + offset + done, src.data(),
                               std::min(src.size(), bytes - done), CopyKind::kHostToDevice, stream);
  }
  absl::Status released = store.release(tensor, stream);
  return status.ok() ? released : status;
}

// The same, waited for.
absl::Status write_tensor(Runtime& rt, Stream& stream, TensorHandle tensor, uint64_t offset,
                          uint64_t bytes, const PinnedHostMemory& src) {
  absl::Status status = enqueue_write(rt, stream, tensor, offset, bytes, src);
  return status.ok() ? rt.device().synchronize(stream) : status;
}

struct Setup {
  std::string name;
  bool overlap = false;
  float max_grad_norm = 0;
  uint64_t inf_every = 0;
};

Setup setup_of(const std::string& name, uint64_t inf_every) {
  Setup s{.name = name};
  s.overlap = name != "off";
  if (name == "on-clip") s.max_grad_norm = kClipBelowNorm;
  if (name == "on-inf") s.inf_every = inf_every;
  return s;
}

// One configuration in its own Runtime: a warm-up step, then `steps` measured ones.
absl::StatusOr<OverlapStepRun> run_configuration(const TrainStepOptions& o, const Setup& setup,
                                                 const Config& config, OverlapStepReport& report,
                                                 std::ostream& human) {
  auto loaded = load_configuration(config);
  if (!loaded.ok()) return loaded.status();
  RuntimeOptions runtime_options;
  auto device = make_train_step_device(o, loaded->first);
  if (!device.ok()) return device.status();
  runtime_options.device = *std::move(device);
  auto runtime = Runtime::create(config, std::move(runtime_options));
  if (!runtime.ok()) return with_context(runtime.status(), "creating the runtime");
  Runtime& rt = **runtime;
  Device& dev = rt.device();
  if (report.device.empty()) {
    report.device = dev.description();
    for (const std::string& warning : rt.warnings()) report.notes.push_back("warning: " + warning);
  }
  auto stream = dev.create_stream();
  if (!stream.ok()) return stream.status();
  auto param_pattern = dev.allocate_pinned(kFillElements * kElementBytes, "overlap-step weights");
  if (!param_pattern.ok()) return param_pattern.status();
  auto grad_pattern = dev.allocate_pinned(kFillElements * kElementBytes, "overlap-step gradients");
  if (!grad_pattern.ok()) return grad_pattern.status();
  auto inf = dev.allocate_pinned(kPage, "overlap-step inf");
  if (!inf.ok()) return inf.status();
  fill_values(static_cast<std::byte*>((*param_pattern)->data()), kFillElements, "fp16", 0.05F, 2);
  fill_values(static_cast<std::byte*>((*grad_pattern)->data()), kFillElements, "fp16", 1e-2F, 1);
  std::memcpy((*inf)->data(), &kF16Inf, sizeof(kF16Inf));

  OffloadOptimizerOptions options;
  options.state_home = report.state_home == "nvme" ? TierKind::kNvme : TierKind::kCpu;
  options.defaults = workload_hyper();
  options.max_grad_norm = setup.max_grad_norm;
  options.overlap.enabled = setup.overlap;
  auto created = OffloadOptimizer::create(rt, options);
  if (!created.ok()) return with_context(created.status(), "creating the optimizer");
  OffloadOptimizer& optimizer = **created;

  const uint64_t count = o.layer_bytes / kElementBytes;
  std::vector<TensorHandle> params, grads;
  std::vector<ParamId> ids;
  for (uint64_t l = 0; l < o.layers; ++l) {
    auto param =
        rt.store().create(absl::StrFormat("overlap.param.%d", l), o.layer_bytes, TierKind::kGpu);
    if (!param.ok()) return with_context(param.status(), "creating the weights");
    auto grad =
        rt.store().create(absl::StrFormat("overlap.grad.%d", l), o.layer_bytes, TierKind::kGpu);
    if (!grad.ok()) return with_context(grad.status(), "creating the gradients");
    if (auto s = write_tensor(rt, **stream, *param, 0, o.layer_bytes, **param_pattern); !s.ok()) {
      return with_context(s, "writing the weights");
    }
    if (auto s = write_tensor(rt, **stream, *grad, 0, o.layer_bytes, **grad_pattern); !s.ok()) {
      return with_context(s, "writing the gradients");
    }
    ParamSpec spec;
    spec.name = absl::StrFormat("layer%d", l);
    spec.param = *param;
    spec.grad = *grad;
    spec.param_type = ParamType::kF16;
    spec.grad_type = GradType::kF16;
    spec.count = count;
    auto id = optimizer.add_param(spec);
    if (!id.ok()) return with_context(id.status(), "adding the parameters");
    params.push_back(*param);
    grads.push_back(*grad);
    ids.push_back(*id);
  }
  report.chunk_elements = optimizer.stats().chunk_elements;

  OverlapStepRun run;
  run.name = setup.name;
  run.overlap = setup.overlap;
  run.max_grad_norm = setup.max_grad_norm;
  run.inf_every = setup.inf_every;
  const absl::Duration compute = absl::Microseconds(o.compute_ms * 1000);
  auto spent_ns = std::make_shared<std::atomic<int64_t>>(0);
  human << absl::StrFormat("overlap-step: %s: 1 warm-up step, %d measured\n", setup.name, o.steps);
  human.flush();
  auto launch_compute = [&]() -> absl::Status {
    return dev.launch_host_callback(
        **stream, [compute, spent_ns] { simulate_compute(compute, spent_ns.get()); });
  };
  // When the stream reaches a point (with or without --sync-each-layer): the end of the
  // forward's first layer and of the forward.
  auto first_layer_end_ns = std::make_shared<std::atomic<int64_t>>(0);
  auto forward_end_ns = std::make_shared<std::atomic<int64_t>>(0);
  auto stamp = [&](const std::shared_ptr<std::atomic<int64_t>>& at) -> absl::Status {
    return dev.launch_host_callback(**stream, [at] { *at = absl::GetCurrentTimeNanos(); });
  };
  for (uint64_t s = 0; s <= o.steps; ++s) {
    // The inf goes into layer 0's gradient (the last to land) during the timed backward, so
    // that nothing untimed runs between step() and the next forward while uploads are in
    // flight; the gradient's first value goes back after the (skipped: no uploads) step.
    const bool inject = setup.inf_every > 0 && s > 0 && s % setup.inf_every == 0;
    rt.wait_for_registration();  // no io_uring registration of the CPU tier beside the step
    const uint64_t rollbacks_before = optimizer.stats().overlap_rollbacks;
    const absl::Time start = absl::Now();
    // Forward: each weight's first use waits for its own upload by the previous step().
    for (uint64_t l = 0; l < o.layers; ++l) {
      auto data = rt.store().acquire(params[l], TierKind::kGpu, **stream, AccessMode::kRead);
      if (!data.ok()) return with_context(data.status(), "forward: reading the weights");
      if (auto st = launch_compute(); !st.ok()) return with_context(st, "forward: the compute");
      if (l == 0) {
        if (auto st = stamp(first_layer_end_ns); !st.ok()) return with_context(st, "forward");
      }
      if (auto st = rt.store().release(params[l], **stream); !st.ok()) return st;
      if (o.sync_each_layer) {
        if (auto st = dev.synchronize(**stream); !st.ok()) return with_context(st, "forward");
      }
    }
    if (auto st = stamp(forward_end_ns); !st.ok()) return with_context(st, "forward");
    for (uint64_t l = o.layers; l-- > 0;) {
      if (auto st = launch_compute(); !st.ok()) return with_context(st, "launching the compute");
      if (l == 0 && inject) {
        if (auto st = enqueue_write(rt, **stream, grads[0], 0, kElementBytes, **inf); !st.ok()) {
          return with_context(st, "injecting an inf");
        }
      }
      if (auto st = optimizer.grad_ready(ids[l], **stream); !st.ok()) {
        return with_context(st, "grad_ready");
      }
      // --sync-each-layer: the host waits for the layer's compute before the next, as the
      // policy runs do; without it the host runs ahead, as a trainer's hooks on a GPU do.
      if (o.sync_each_layer) {
        if (auto st = dev.synchronize(**stream); !st.ok()) return with_context(st, "backward");
      }
    }
    if (auto st = dev.synchronize(**stream); !st.ok()) return with_context(st, "backward");
    const absl::Time last_gradient = absl::Now();
    // The warm-up step lets every unit step early, so that the overlap's backups and held
    // copies (CPU-tier tensors made on a unit's first early step, pinned on first use) exist
    // before the measured steps, whichever units those reach.
    if (s == 0 && setup.overlap) optimizer.wait_for_early_steps();
    auto result = optimizer.step();
    const absl::Time end = absl::Now();
    if (!result.ok()) return with_context(result.status(), "step");
    const OffloadOptimizerStats stats = optimizer.stats();
    const absl::Time forward_end = absl::FromUnixNanos(forward_end_ns->load());
    if (result->skipped != inject) {
      return absl::InternalError(absl::StrFormat(
          "overlap-step: %s: step %d was %sskipped, but an inf was %sinjected: a bug", setup.name,
          s, result->skipped ? "" : "not ", inject ? "" : "not "));
    }
    if (inject) {  // the gradient's first value back
      if (auto st = write_tensor(rt, **stream, grads[0], 0, kElementBytes, **grad_pattern);
          !st.ok()) {
        return with_context(st, "restoring the gradient");
      }
    }
    if (s == 0) {  // the warm-up step: every unit stepped early before step()
      run.warmup_early_elements = result->early_elements;
      run.warmup_redone_elements = stats.last_redone_elements;
      run.warmup_rolled_back = stats.overlap_rollbacks > rollbacks_before;
      continue;
    }
    OverlapStepSample sample;
    sample.exposed_seconds = seconds_of(stats.last_step_ns);
    sample.forward_seconds = absl::ToDoubleSeconds(forward_end - start);
    sample.forward_wait_seconds =
        sample.forward_seconds - static_cast<double>(o.layers) * o.compute_ms * 1e-3;
    sample.first_layer_wait_seconds =
        absl::ToDoubleSeconds(absl::FromUnixNanos(first_layer_end_ns->load()) - start) -
        o.compute_ms * 1e-3;
    sample.backward_seconds = absl::ToDoubleSeconds(last_gradient - forward_end);
    sample.step_seconds = absl::ToDoubleSeconds(end - start);
    sample.rolled_back = result->rolled_back;
    sample.skipped = result->skipped;
    sample.early_elements = result->early_elements;
    sample.redone_elements = stats.last_redone_elements;
    sample.stats = stats;
    run.samples.push_back(sample);
  }
  // The last step's uploads, untimed, before the tensors go.
  for (const TensorHandle& param : params) {
    auto data = rt.store().acquire(param, TierKind::kGpu, **stream, AccessMode::kRead);
    if (!data.ok()) return with_context(data.status(), "reading the updated weights");
    if (auto st = rt.store().release(param, **stream); !st.ok()) return st;
  }
  if (auto st = dev.synchronize(**stream); !st.ok()) return with_context(st, "the uploads");
  // Summaries.
  std::vector<double> steps, forwards, waits, first_waits, rolled, kept;
  for (const OverlapStepSample& sample : run.samples) {
    steps.push_back(sample.step_seconds);
    forwards.push_back(sample.forward_seconds);
    waits.push_back(sample.forward_wait_seconds);
    first_waits.push_back(sample.first_layer_wait_seconds);
    (sample.rolled_back ? rolled : kept).push_back(sample.exposed_seconds);
    if (sample.rolled_back) ++run.rollbacks;
  }
  run.step_seconds = median_of(steps);
  run.forward_seconds = median_of(forwards);
  run.forward_wait_seconds = median_of(waits);
  run.first_layer_wait_seconds = median_of(first_waits);
  run.rolled_back_exposed_seconds = median_of(rolled);
  run.kept_exposed_seconds = median_of(kept);
  std::vector<OverlapStepSample> sorted = run.samples;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.exposed_seconds < b.exposed_seconds; });
  run.median = sorted[(sorted.size() - 1) / 2];
  return run;
}

}  // namespace

std::optional<std::string> validate(const OverlapStepOptions& o) {
  if (o.mode != "off" && o.mode != "on" && o.mode != "both" && o.mode != "none") {
    return "--overlap-step: must be off, on, both or none, not '" + o.mode + "'";
  }
  if (o.inf_every == 0) {
    return "--overlap-inf-every: must be at least 1 (an inf every that many measured steps)";
  }
  return std::nullopt;
}

std::vector<std::string> overlap_configurations(const std::string& mode) {
  if (mode == "off") return {"off"};
  if (mode == "on") return {"on", "on-clip", "on-inf"};
  if (mode == "both") return {"off", "on", "on-clip", "on-inf"};
  return {};
}

double OverlapStepReport::bound_seconds() const {
  return std::max({compute_seconds, transfer_seconds, optimizer_seconds});
}

const OverlapStepRun* OverlapStepReport::find(const std::string& name) const {
  for (const OverlapStepRun& run : runs) {
    if (run.name == name) return &run;
  }
  return nullptr;
}

double OverlapStepReport::exposed_ratio(const OverlapStepRun& run) const {
  const OverlapStepRun* off = find("off");
  if (off == nullptr || off->median.exposed_seconds <= 0) return 0;
  return run.median.exposed_seconds / off->median.exposed_seconds;
}

double OverlapStepReport::exposed_after_landing_ratio(const OverlapStepRun& run) const {
  const OverlapStepRun* off = find("off");
  if (off == nullptr || off->median.exposed_after_landing_seconds() <= 0) return 0;
  return run.median.exposed_after_landing_seconds() / off->median.exposed_after_landing_seconds();
}

double OverlapStepReport::rollback_cost(const OverlapStepRun& run) const {
  const OverlapStepRun* off = find("off");
  if (off == nullptr || off->median.exposed_seconds <= 0 || run.rollbacks == 0) return 0;
  return run.rolled_back_exposed_seconds / off->median.exposed_seconds;
}

double OverlapStepReport::ratio_to_bound(const OverlapStepRun& run) const {
  const double bound = bound_seconds();
  return bound > 0 ? run.step_seconds / bound : 0;
}

absl::StatusOr<OverlapStepReport> run_overlap_step(const TrainStepOptions& train,
                                                   const OverlapStepOptions& options,
                                                   const Config& base,
                                                   const std::vector<std::string>& nvme_paths,
                                                   std::ostream& human) {
  OverlapStepReport report;
  report.train = train;
  report.options = options;
  const bool nvme = train.home == "nvme";
  report.state_home = nvme ? "nvme" : "cpu";
  report.params = train.layers * (train.layer_bytes / kElementBytes);
  // Forward and backward.
  report.compute_seconds = 2 * static_cast<double>(train.layers) * train.compute_ms * 1e-3;
  const Config config = sized_config(train, base, nvme, nvme_paths);
  human << absl::StrFormat(
      "overlap-step: %d layers of %s fp16 (%d params), %.3g ms compute per layer, states on %s\n",
      train.layers, format_bytes(train.layer_bytes), report.params, train.compute_ms,
      report.state_home);
  human.flush();
  for (const std::string& name : overlap_configurations(options.mode)) {
    auto run = run_configuration(train, setup_of(name, options.inf_every), config, report, human);
    if (!run.ok()) return run.status();
    report.runs.push_back(*std::move(run));
  }
  auto resolved = load_configuration(config);
  if (!resolved.ok()) return resolved.status();
  if (resolved->first.backend == Backend::kHost && train.link_gbps > 0) {
    report.transfer_seconds =
        static_cast<double>(train.layers * train.layer_bytes) / (train.link_gbps * 1e9);
  } else {
    report.notes.push_back(
        "transfer: not in the bound (the link is not throttled to a known rate here)");
  }
  const OverlapStepRun* off = report.find("off");
  if (off != nullptr) {
    report.optimizer_seconds = off->median.exposed_after_landing_seconds();
  } else {
    const OffloadOptimizerStats& s = report.runs.front().median.stats;
    report.optimizer_seconds = seconds_of(s.last_adam_ns + s.last_early_adam_ns);
    report.notes.push_back(
        "optimizer (bound): without the off run, the on run's Adam time, early and in step()");
  }
  report.notes.push_back(
      "compute: simulated by a timed wait on the compute stream (no core burnt); the "
      "configurations ran one after another, each in a fresh runtime");
  return report;
}

}  // namespace strata::bench
