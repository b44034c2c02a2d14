#include "bench/train_step/train_step.h"

#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <utility>

#include "bench/common.h"
#include "bench/fresh_pieces.h"
#include "bench/train_step/train_step_link.h"
#include "bench/train_step/train_step_run.h"
#include "strata/activations/activation_stash.h"
#include "strata/base/size.h"
#include "strata/device/backend.h"
#include "strata/device/host_device.h"
#include "strata/runtime/runtime.h"

namespace strata::bench {
namespace {

struct Policy {
  const char* name;
  bool prefetch;
  bool belady;
};
// On-demand keeps Belady eviction so that it differs from the first run in prefetching only,
// and LRU keeps prefetching so that it differs in the eviction rule only.
constexpr Policy kPolicies[] = {
    {"belady", true, true}, {"lru", true, false}, {"on-demand", false, true}};

const Policy* find_policy(std::string_view name) {
  for (const Policy& p : kPolicies) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

constexpr uint64_t kGpuAlignment = 256;  // MemoryTier::create_gpu_arena's default granularity
constexpr uint64_t kMaxBounce = uint64_t{64} << 20;

// The layer's footprint in the GPU arena and in the pinned CPU tier (their granularities).
uint64_t gpu_footprint(uint64_t bytes) { return round_up(bytes, kGpuAlignment); }
uint64_t cpu_footprint(uint64_t bytes) { return round_up(bytes, kPage); }

// What create_gpu_arena(bytes) leaves for blocks after its compaction bounce buffer (1/64 of
// the allocation, at most 64 MiB).
uint64_t usable_arena(uint64_t bytes) {
  uint64_t bounce = std::min(kMaxBounce, bytes / 64) / kGpuAlignment * kGpuAlignment;
  if (bounce == 0) bounce = kGpuAlignment;
  return bytes < bounce ? 0 : (bytes - bounce) / kGpuAlignment * kGpuAlignment;
}

bool stashed(const TrainStepOptions& o) {
  return o.activations == "stash" && o.activation_bytes > 0;
}

// A layer's tensors in the arena: its weight, its saved activation (--activation-bytes > 0,
// unless the stash's window holds the activations) and its gradient (--optimizer).
uint64_t layer_gpu_footprint(const TrainStepOptions& o) {
  uint64_t bytes = 0;
  for (LayerTensor kind : layer_tensors(o)) {
    if (kind == LayerTensor::kActivation && stashed(o)) continue;
    bytes += gpu_footprint(tensor_bytes(o, kind));
  }
  return bytes;
}
uint64_t layer_cpu_footprint(const TrainStepOptions& o) {
  uint64_t bytes = 0;
  for (LayerTensor kind : layer_tensors(o)) bytes += cpu_footprint(tensor_bytes(o, kind));
  return bytes;
}

// The smallest STRATA_GPU_BYTES whose arena holds `layers` layers: any more and a further layer
// could fit, which would quietly make the arena larger than the flag says.
uint64_t gpu_bytes_for(uint64_t layers, const TrainStepOptions& o) {
  const uint64_t payload =
      layers * layer_gpu_footprint(o) + (stashed(o) ? gpu_footprint(stash_window_bytes(o)) : 0);
  uint64_t bytes = std::max(payload, 2 * kGpuAlignment);
  while (usable_arena(bytes) < payload) bytes += round_up(payload - usable_arena(bytes), 256);
  return bytes;
}

// STRATA_NVME_BYTES per path: every layer plus the link probe's extent, striped over `paths`.
uint64_t nvme_bytes_for(const TrainStepOptions& o, uint64_t stripe, uint64_t paths) {
  auto per_path = [&](uint64_t bytes) {
    const uint64_t units = (bytes + stripe - 1) / stripe;
    return (units + paths - 1) / paths * stripe;
  };
  uint64_t layer = 0;
  for (LayerTensor kind : layer_tensors(o)) layer += per_path(tensor_bytes(o, kind));
  return o.layers * layer + per_path(kProbeLayers * o.layer_bytes) + 2 * stripe;
}

absl::Status with_context(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("train-step: %s: %s", what, status.message()));
}

// Writes every layer's tensors once (layer-major, each layer's in layer_tensors() order, as
// step_plan() indexes them), makes each home copy the only one, so that each policy's warm-up
// step starts from the same cold state: nothing on the GPU (and, for home=nvme, nothing in the
// CPU tier either, or the store would fetch from there instead of from NVMe).
absl::StatusOr<std::vector<TensorHandle>> create_layers(const TrainStepOptions& o, Runtime& runtime,
                                                        Stream& stream) {
  TensorStore& store = runtime.store();
  const TierKind home = o.home == "cpu" ? TierKind::kCpu : TierKind::kNvme;
  std::vector<TensorHandle> layers;
  auto add = [&](std::string name, uint64_t bytes, uint32_t seed) -> absl::Status {
    auto handle = store.create(std::move(name), bytes, home);
    if (!handle.ok()) return handle.status();
    auto data = store.acquire(*handle, TierKind::kCpu, stream, AccessMode::kWrite);
    if (!data.ok()) return data.status();
    fill_pattern(static_cast<std::byte*>(*data), bytes, seed);
    if (auto status = store.release(*handle, stream); !status.ok()) return status;
    // One tensor at a time: the CPU tier only holds staging and a layer for home=nvme.
    if (home == TierKind::kNvme) {
      if (auto status = store.evict(*handle, TierKind::kCpu); !status.ok()) return status;
    }
    layers.push_back(*handle);
    return absl::OkStatus();
  };
  const std::vector<LayerTensor> kinds = layer_tensors(o);
  for (uint64_t i = 0; i < o.layers; ++i) {
    for (size_t k = 0; k < kinds.size(); ++k) {
      static constexpr const char* kNames[] = {"weight", "activation", "gradient"};
      const char* name = kNames[static_cast<int>(kinds[k])];
      if (kinds[k] == LayerTensor::kActivation && stashed(o)) {
        layers.emplace_back();  // the stash makes it each step
        continue;
      }
      const auto seed = static_cast<uint32_t>(i * kinds.size() + k);
      if (auto status =
              add(absl::StrFormat("layer.%d.%s", i, name), tensor_bytes(o, kinds[k]), seed);
          !status.ok()) {
        return status;
      }
    }
  }
  if (auto status = store.flush(); !status.ok()) return status;
  for (const TensorHandle& layer : layers) {
    if (!layer.valid()) continue;
    if (auto status = store.evict(layer, TierKind::kGpu); !status.ok()) return status;
  }
  return layers;
}

// The configuration every run uses: the environment's, with the tiers sized to the workload.
Config sized_config(const TrainStepOptions& o, const Config& base,
                    const std::vector<std::string>& nvme_paths) {
  Config c = base;
  c.gpu_bytes = SizeSetting::of_bytes(gpu_bytes_for(o.arena_layers, o));
  if (o.home == "cpu") {
    // Every layer's home copy; no NVMe tier, so no staging either.
    c.nvme_paths.clear();
    c.cpu_bytes = SizeSetting::of_bytes(o.layers * layer_cpu_footprint(o) + 2 * kPage);
  } else {
    c.nvme_paths = nvme_paths;
    c.nvme_bytes = SizeSetting::of_bytes(nvme_bytes_for(o, c.io_block, nvme_paths.size()));
    // Staging, then either the layer being written before it goes to NVMe or the link probe's
    // block (never both at once).
    c.cpu_bytes = SizeSetting::of_bytes(c.staging_bytes +
                                        kProbeLayers * cpu_footprint(o.layer_bytes) + 4 * kPage);
  }
  return c;
}

}  // namespace

std::optional<std::string> validate(const TrainStepOptions& o) {
  if (o.layers == 0) return "--layers: must be at least 1";
  if (o.layer_bytes == 0 || o.layer_bytes % kPage != 0) {
    return "--layer-bytes: must be a positive multiple of 4KiB (NVMe I/O is O_DIRECT), not " +
           std::to_string(o.layer_bytes);
  }
  if (o.activation_bytes % kPage != 0) {
    return "--activation-bytes: must be a multiple of 4KiB (0: no activations), not " +
           std::to_string(o.activation_bytes);
  }
  if (!(o.compute_ms >= 0) || o.compute_ms > 60'000) {
    return "--compute-ms: must be between 0 and 60000, not " + std::to_string(o.compute_ms);
  }
  if (!(o.optimizer_ms >= 0) || o.optimizer_ms > 60'000) {
    return "--optimizer-ms: must be between 0 and 60000, not " + std::to_string(o.optimizer_ms);
  }
  if (o.policies.empty()) return "--policies: name at least one of belady, lru, on-demand";
  for (size_t i = 0; i < o.policies.size(); ++i) {
    if (find_policy(o.policies[i]) == nullptr) {
      return "--policies: unknown policy '" + o.policies[i] +
             "' (choose from belady, lru, on-demand, comma-separated)";
    }
    for (size_t j = 0; j < i; ++j) {
      if (o.policies[j] == o.policies[i]) {
        return "--policies: '" + o.policies[i] + "' is named twice";
      }
    }
  }
  if (o.arena_layers == 0) return "--arena-layers: must be at least 1";
  if (o.home != "nvme" && o.home != "cpu") return "--home: must be nvme or cpu";
  if (!(o.link_gbps >= 0)) return "--link-gbps: must be >= 0 (0: unthrottled)";
  if (o.steps == 0) return "--steps: must be at least 1";
  if (o.activations != "store" && o.activations != "stash") {
    return "--activations: must be store (store tensors paged by the scheduler) or stash (an "
           "ActivationStash), not '" +
           o.activations + "'";
  }
  if (stashed(o)) {
    if (stash_window_bytes(o) < o.activation_bytes) {
      return "--activation-window-bytes: must hold at least one activation (" +
             std::to_string(o.activation_bytes) + " bytes), not " +
             std::to_string(stash_window_bytes(o));
    }
    if (stash_prefetch_bytes(o) > stash_window_bytes(o)) {
      return "--activation-prefetch-bytes: must be at most the window (" +
             std::to_string(stash_window_bytes(o)) + " bytes), not " +
             std::to_string(stash_prefetch_bytes(o));
    }
  }
  return std::nullopt;
}

double TrainStepBound::transfer_seconds() const {
  return link_bytes_per_second > 0
             ? static_cast<double>(std::max(transfer_bytes, d2h_bytes)) / link_bytes_per_second
             : 0;
}

uint64_t stash_window_bytes(const TrainStepOptions& o) {
  return o.activation_window_bytes > 0 ? o.activation_window_bytes : 4 * o.activation_bytes;
}

uint64_t stash_prefetch_bytes(const TrainStepOptions& o) {
  return o.activation_prefetch_bytes > 0 ? o.activation_prefetch_bytes : 2 * o.activation_bytes;
}

double TrainStepBound::seconds() const { return std::max(compute_seconds, transfer_seconds()); }

double TrainStepBound::arena_seconds() const { return std::max(seconds(), arena.seconds); }

absl::StatusOr<std::unique_ptr<Device>> make_train_step_device(const TrainStepOptions& options,
                                                               const ResolvedConfig& config) {
  if (config.backend == Backend::kCuda) return make_device(config.backend, config.device);
  HostDeviceOptions host;
  host.h2d_bytes_per_second = options.link_gbps * 1e9;
  host.d2h_bytes_per_second = options.link_gbps * 1e9;
  return make_host_device(host);
}

absl::StatusOr<TrainStepReport> run_train_step(const TrainStepOptions& o, const Config& base,
                                               const std::vector<std::string>& nvme_paths,
                                               std::ostream& human) {
  TrainStepReport report;
  report.options = o;
  const Config config = sized_config(o, base, nvme_paths);
  const std::vector<PlannedLayer> plan = step_plan(o);
  double compute_ms = 0;
  for (const PlannedLayer& layer : plan) compute_ms += layer.compute_ms;
  report.bound.compute_seconds = compute_ms * 1e-3;
  // What must move: the offline paging model of this very step in an arena of the configured
  // size. Belady's MIN is the fewest fetches for tensors of one size; for these mixed sizes it is
  // the standard reference, not a proof (docs/train-step.md). LRU's figure beside it is the
  // reason the policies differ.
  std::vector<uint64_t> footprint;
  for (uint64_t i = 0; i < o.layers; ++i) {
    for (LayerTensor kind : layer_tensors(o))
      footprint.push_back(gpu_footprint(tensor_bytes(o, kind)));
  }
  // With the stash the activations are not paged by the arena's policy: the model pages the
  // weights and gradients in the arena left beside the window.
  std::vector<PlannedLayer> paged = plan;
  if (stashed(o)) {
    const size_t per_layer = layer_tensors(o).size();
    const auto activation = static_cast<size_t>(
        std::find(layer_tensors(o).begin(), layer_tensors(o).end(), LayerTensor::kActivation) -
        layer_tensors(o).begin());
    for (PlannedLayer& layer : paged) {
      std::erase_if(layer.accesses,
                    [&](const PlannedAccess& a) { return a.tensor % per_layer == activation; });
    }
  }
  report.bound.arena_bytes = usable_arena(gpu_bytes_for(o.arena_layers, o));
  const uint64_t paged_arena =
      report.bound.arena_bytes -
      (stashed(o) ? std::min(report.bound.arena_bytes, gpu_footprint(stash_window_bytes(o))) : 0);
  report.bound.belady = model_paging(paged, footprint, paged_arena, /*belady=*/true);
  report.bound.lru = model_paging(paged, footprint, paged_arena, /*belady=*/false);
  report.bound.transfer_bytes = report.bound.belady.fetched_bytes;
  if (stashed(o)) {
    // keep_tail keeps backward's first activations (within the prefetch distance) on the GPU;
    // every other one goes out in forward and comes back in backward.
    const uint64_t kept = std::min(o.layers, stash_prefetch_bytes(o) / o.activation_bytes);
    report.bound.activation_transfer_bytes = (o.layers - kept) * o.activation_bytes;
    report.bound.transfer_bytes += report.bound.activation_transfer_bytes;
    report.bound.d2h_bytes =
        report.bound.belady.written_back_bytes + report.bound.activation_transfer_bytes;
  }

  // Every policy's runtime is set up (layers written, warm-up step run) before any step is
  // timed, and the measured steps then take turns: step s of each policy, then step s + 1. Run
  // one policy after another, the first one's steps came right after the writes of the layers
  // and the link probes, and on this VM's disk its NVMe reads were 2-3x slower
  // (docs/bench.md); drift of any kind (disk, page cache, load from other processes) now falls on
  // every policy alike.
  struct PolicyRun {
    const Policy* policy = nullptr;
    std::unique_ptr<Runtime> runtime;
    std::unique_ptr<Stream> stream;  // after the runtime: destroyed before its device
    std::vector<TensorHandle> layers;
    std::shared_ptr<std::atomic<int64_t>> spent_ns = std::make_shared<std::atomic<int64_t>>(0);
    std::vector<std::pair<double, StepCounters>> steps;
    std::unique_ptr<ActivationStash> stash;  // --activations=stash
    FreshPieces fresh;                       // CPU-tier pieces first used in measured steps
    std::shared_ptr<Timeline> timeline;      // --timeline
  };
  std::vector<PolicyRun> runs;
  for (const std::string& name : o.policies) {
    PolicyRun& run = runs.emplace_back();
    run.policy = find_policy(name);
    const bool first = runs.size() == 1;
    auto loaded = load_configuration(config);
    if (!loaded.ok()) return loaded.status();
    RuntimeOptions runtime_options;
    runtime_options.store.prefetch = run.policy->prefetch;
    runtime_options.store.belady = run.policy->belady;
    if (!o.early_writeback) runtime_options.store.early_writeback_bytes = 0;
    auto device = make_train_step_device(o, loaded->first);
    if (!device.ok()) return device.status();
    runtime_options.device = *std::move(device);
    auto runtime = Runtime::create(config, std::move(runtime_options));
    if (!runtime.ok()) return with_context(runtime.status(), "creating the runtime");
    run.runtime = *std::move(runtime);
    Runtime& rt = *run.runtime;
    Device& dev = rt.device();
    if (first) {
      report.config = rt.config();
      report.device = dev.description();
      report.engine = "none";
      if (rt.nvme() != nullptr) {
        const SwapStats swap = rt.nvme()->stats();
        report.engine = swap.engine;
        report.engine_reason = swap.engine_reason;
      }
      for (const std::string& warning : rt.warnings())
        report.notes.push_back("warning: " + warning);
      // The link is measured once, on the first run's runtime: same device, same swap files.
      auto h2d = probe_h2d(dev, o.layer_bytes);
      if (!h2d.ok()) return with_context(h2d.status(), "measuring the H2D link");
      report.bound.h2d_bytes_per_second = *h2d;
      report.bound.link_bytes_per_second = *h2d;
      if (rt.nvme() != nullptr) {
        auto read = probe_nvme_read(rt.cpu(), *rt.nvme(), o.layer_bytes);
        if (!read.ok()) return with_context(read.status(), "measuring the NVMe read");
        report.bound.nvme_bytes_per_second = *read;
        report.bound.link_bytes_per_second = std::min(*h2d, *read);
      }
    }
    auto stream = dev.create_stream();
    if (!stream.ok()) return stream.status();
    run.stream = *std::move(stream);
    auto layers = create_layers(o, rt, *run.stream);
    if (!layers.ok()) return with_context(layers.status(), "writing the layers");
    run.layers = *std::move(layers);
    if (stashed(o)) {
      ActivationStashOptions so;
      so.home = o.home == "cpu" ? TierKind::kCpu : TierKind::kNvme;
      so.window_bytes = stash_window_bytes(o);
      so.prefetch_bytes = stash_prefetch_bytes(o);
      auto stash = ActivationStash::create(rt.store(), dev, so);
      if (!stash.ok()) return with_context(stash.status(), "creating the activation stash");
      run.stash = *std::move(stash);
    }
    human << absl::StrFormat("train-step: %s: warm-up step (records the access trace)\n",
                             run.policy->name);
    human.flush();
    if (auto status = run_step(rt.store(), dev, *run.stream, run.layers, plan, o.sync_each_layer,
                               run.spent_ns, run.stash.get(), o.activation_bytes);
        !status.ok()) {
      return with_context(status, "warm-up step");
    }
  }
  if (!o.timeline.empty()) {
    // Made together: one origin, so that the trace shows the policies' turns on one time axis.
    for (PolicyRun& run : runs) {
      run.timeline = std::make_shared<Timeline>();
      run.runtime->store().set_timeline(run.timeline);
    }
  }
  human << absl::StrFormat(
      "train-step: %d measured step(s) per policy, the policies taking turns\n", o.steps);
  human.flush();
  for (uint64_t s = 0; s < o.steps; ++s) {
    for (PolicyRun& run : runs) {
      // Untimed: no runtime's io_uring registration of its CPU tier runs beside the step (every
      // policy's runtime is alive, each may have pieces queued).
      for (PolicyRun& other : runs) other.runtime->wait_for_registration();
      const PinCounters pins = pin_counters(*run.runtime);
      TensorStore& store = run.runtime->store();
      StepCounters counters;
      store.reset_peak_usage();
      counters.before = store.stats();
      if (run.stash != nullptr) counters.stash_before = run.stash->stats();
      run.spent_ns->store(0);
      if (run.timeline != nullptr) counters.timeline_start_ns = run.timeline->now_ns();
      const absl::Time start = absl::Now();
      if (auto status = run_step(store, run.runtime->device(), *run.stream, run.layers, plan,
                                 o.sync_each_layer, run.spent_ns, run.stash.get(),
                                 o.activation_bytes, run.timeline);
          !status.ok()) {
        return with_context(status, absl::StrFormat("measured step (%s)", run.policy->name));
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      if (run.timeline != nullptr) {
        counters.timeline_end_ns = run.timeline->now_ns();
        run.timeline->add(Timeline::Span{"step",
                                         absl::StrFormat("step %d", s + 1),
                                         "step",
                                         counters.timeline_start_ns,
                                         counters.timeline_end_ns,
                                         0,
                                         0,
                                         {Timeline::Arg::str("policy", run.policy->name)}});
      }
      if (run.stash != nullptr) {
        if (auto status = run.stash->synchronize(); !status.ok()) {
          return with_context(status, "the activation stash");
        }
        counters.stash_after = run.stash->stats();
      }
      counters.after = store.stats();
      counters.compute_seconds = static_cast<double>(run.spent_ns->load()) * 1e-9;
      run.steps.emplace_back(seconds, counters);
      run.fresh.add(pins, pin_counters(*run.runtime));
    }
  }
  for (const PolicyRun& run : runs) {
    const std::string fresh = run.fresh.note(run.policy->name, "measured step");
    if (!fresh.empty()) report.notes.push_back(fresh);
  }
  if (!o.timeline.empty()) {
    std::vector<std::pair<std::string, const Timeline*>> processes;
    for (PolicyRun& run : runs) {
      run.runtime->store().set_timeline(nullptr);
      processes.emplace_back(run.policy->name, run.timeline.get());
    }
    if (auto status = write_timeline_file(o.timeline, Timeline::chrome_json(processes));
        !status.ok()) {
      return status;
    }
    report.notes.push_back("timeline: every measured step of every policy in " + o.timeline +
                           " (Chrome trace: chrome://tracing or ui.perfetto.dev)");
  }
  // The arena-aware bound over the whole plan (with the stash too: its activations are GPU tier
  // tensors, and its window a soft reservation, so the whole arena is the capacity).
  TrainStepBound& tb = report.bound;
  tb.arena = arena_bound(plan, footprint, tb.arena_bytes, tb.h2d_bytes_per_second);
  tb.arena_link_bytes_per_second = tb.h2d_bytes_per_second;
  tb.arena_capacity_bytes = tb.arena_bytes;
  if (tb.nvme_bytes_per_second.has_value()) {
    // One hop back: what is in neither the arena nor the CPU tier at the cut comes off NVMe.
    const uint64_t capacity = tb.arena_bytes + report.config.cpu_bytes;
    ArenaBound nvme = arena_bound(plan, footprint, capacity, *tb.nvme_bytes_per_second);
    if (nvme.seconds > tb.arena.seconds) {
      tb.arena = std::move(nvme);
      tb.arena_link = "NVMe read";
      tb.arena_link_bytes_per_second = *tb.nvme_bytes_per_second;
      tb.arena_capacity_bytes = capacity;
    }
  }
  for (PolicyRun& policy_run : runs) {
    std::vector<std::pair<double, StepCounters>>& steps = policy_run.steps;
    std::vector<double> all;
    for (const auto& step : steps) all.push_back(step.first);
    std::sort(steps.begin(), steps.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    const auto& [seconds, counters] = steps[(steps.size() - 1) / 2];
    TrainStepRun run = make_run(policy_run.policy->name, seconds, counters);
    run.all_step_seconds = std::move(all);
    if (policy_run.timeline != nullptr) {
      run.timeline = summarize_step(policy_run.timeline->spans(), counters.timeline_start_ns,
                                    counters.timeline_end_ns);
    }
    const double bound = report.bound.seconds();
    run.ratio_to_bound = bound > 0 ? run.step_seconds / bound : 0;
    run.ratio_to_arena_bound = tb.arena_seconds() > 0 ? run.step_seconds / tb.arena_seconds() : 0;
    report.runs.push_back(std::move(run));
  }
  report.notes.push_back(
      report.config.backend == Backend::kCuda
          ? "compute: simulated by a timed wait in a host function on the compute stream "
            "(cudaLaunchHostFunc), not a busy kernel: the stream is busy for that time the same way"
          : "compute: simulated by a timed wait on the compute stream's worker thread");
  return report;
}

}  // namespace strata::bench
