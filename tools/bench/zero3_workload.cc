#include "bench/zero3_workload.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <utility>

#include "bench/common.h"
#include "bench/nvme_dirs.h"
#include "bench/optimizer_baselines.h"
#include "bench/report.h"
#include "strata/base/size.h"
#include "strata/comm/communicator.h"
#include "strata/device/backend.h"
#include "strata/offload/zero_engine.h"
#include "strata/runtime/runtime.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kParamBytes = 2;  // fp16 parameters and gradients
constexpr uint32_t kAlignment = 64;  // ZeroOptions' default
constexpr double kUsableMemoryFraction = 0.8;
constexpr uint64_t kTierSlack = uint64_t{256} << 20;
// The raw baselines: samples after one warm-up, and collectives per sample.
constexpr uint64_t kBaselineSamples = 5;
constexpr uint64_t kCallsPerSample = 4;

// Every double of a Zero3Sample, in the order the ranks exchange them.
constexpr double Zero3Sample::*kFields[] = {
    &Zero3Sample::step,
    &Zero3Sample::forward,
    &Zero3Sample::backward,
    &Zero3Sample::step_call,
    &Zero3Sample::compute,
    &Zero3Sample::optimizer,
    &Zero3Sample::fetch_wait,
    &Zero3Sample::reduce_scatter_wait,
    &Zero3Sample::acquire_param,
    &Zero3Sample::release_param,
    &Zero3Sample::acquire_grad,
    &Zero3Sample::grad_ready,
    &Zero3Sample::grad_copy,
    &Zero3Sample::gathers,
    &Zero3Sample::gathers_on_demand,
    &Zero3Sample::gathers_prefetched,
    &Zero3Sample::reuses,
    &Zero3Sample::prefetch_late,
    &Zero3Sample::dropped_unused,
    &Zero3Sample::order_changes,
    &Zero3Sample::gathered_peak_bytes,
    &Zero3Sample::all_gather_bytes,
    &Zero3Sample::reduce_scatter_bytes,
    &Zero3Sample::nvme_read_bytes,
};
constexpr size_t kSampleDoubles = std::size(kFields);
// Per rank after its samples: model states by tier (3) and in all.
constexpr size_t kRankDoubles = 4;

int fail(const absl::Status& status) {
  return cli::print_error("offload-bench", std::string(status.message()));
}

absl::Status with_context(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("zero: %s: %s", std::string(what),
                                                     std::string(status.message())));
}

absl::Status finish(absl::StatusOr<std::unique_ptr<CollectiveWork>> work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double seconds(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

// The layout ZeroLayout makes of one layer (one flat group): padded to ranks × alignment.
struct Plan {
  uint64_t layer_params = 0;
  uint64_t padded = 0;
  uint64_t shard = 0;
  uint64_t gathered_bytes = 0;  // one layer gathered
  uint64_t prefetch_bytes = 0;
  uint64_t max_live_bytes = 0;
  uint64_t reuse_window_bytes = 0;
  uint64_t model_shard_bytes = 0;  // this rank's shard of every layer
};

Plan plan_of(const Zero3Options& o, int ranks) {
  Plan p;
  const uint64_t unit = static_cast<uint64_t>(ranks) * kAlignment;
  p.layer_params = o.layer_bytes / kParamBytes;
  p.padded = (p.layer_params + unit - 1) / unit * unit;
  p.shard = p.padded / static_cast<uint64_t>(ranks);
  p.gathered_bytes = p.padded * kParamBytes;
  p.prefetch_bytes = o.prefetch_bytes.value_or(2 * p.gathered_bytes);
  p.max_live_bytes = o.max_live_bytes.value_or(4 * p.gathered_bytes);
  p.reuse_window_bytes = o.reuse_window_bytes.value_or(ZeroOptions().reuse_window_bytes);
  p.model_shard_bytes = o.layers * p.shard * kParamBytes;
  return p;
}

// One rank's runtime: the GPU tier holds the gathered layers, the two gradient buckets, the
// raw baselines' buffers and (gpu home) the shards, plus the shards' transient copies when the
// optimizer writes them; the CPU tier the optimizer's states (12 bytes a parameter), its fp32
// gradient shard, the shards (cpu home) and the NVMe staging; the NVMe tier the shards, twice.
Config runtime_config(const Zero3Options& o, const Plan& p, const Config& base,
                      const std::vector<std::string>& nvme_paths) {
  Config c = base;
  const uint64_t model_shard = p.model_shard_bytes;
  const uint64_t gpu_payload =
      p.max_live_bytes + 3 * p.gathered_bytes + 2 * model_shard + (o.layers + 16) * 2 * kPage;
  c.gpu_bytes = SizeSetting::of_bytes(
      round_up(gpu_payload + gpu_payload / 32 + (uint64_t{64} << 20), uint64_t{1} << 20));
  const uint64_t states = (12 + 4) * o.layers * p.shard;
  c.nvme_paths = nvme_paths;
  c.cpu_bytes =
      SizeSetting::of_bytes(round_up(states + 2 * model_shard + o.layers * 8 * kPage + kTierSlack +
                                     (nvme_paths.empty() ? 0 : c.staging_bytes)));
  if (!nvme_paths.empty() && std::getenv("STRATA_NVME_BYTES") == nullptr) {
    const uint64_t per_path = 2 * model_shard / nvme_paths.size();
    c.nvme_bytes = SizeSetting::of_bytes(round_up(per_path, c.io_block) + 64 * c.io_block);
  }
  return c;
}

uint64_t host_bytes_needed(const Config& c, const ResolvedConfig& env, int ranks) {
  const uint64_t gpu =
      env.backend == Backend::kHost && c.gpu_bytes.has_value() ? c.gpu_bytes->bytes : 0;
  return static_cast<uint64_t>(ranks) * (gpu + c.cpu_bytes.bytes + kComputeBufferBytes * 2);
}

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

// One training step from `start` (the end of the previous step()) to the end of its step().
absl::StatusOr<Zero3Sample> one_step(Rig& r, Clock::time_point start) {
  ZeroEngine& engine = r.engine;
  Stream& stream = r.stream;
  const ZeroStats z0 = engine.stats();
  const CommStats c0 = r.comm.stats();
  const StoreStats t0 = r.runtime.store().stats();
  Zero3Sample s;
  for (const ZeroParamId& id : r.ids) {
    auto p =
        timed(s.acquire_param, [&] { return engine.acquire_param(id, TierKind::kGpu, stream); });
    if (!p.ok()) return with_context(p.status(), "forward: acquire_param");
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
    s.compute += r.compute.run(r.compute_elements);
    auto grad =
        timed(s.acquire_grad, [&] { return engine.acquire_grad(id, TierKind::kGpu, stream); });
    if (!grad.ok()) return with_context(grad.status(), "backward: acquire_grad");
    // The buffer starts each micro-step at zero: writing the gradient adds it.
    if (auto st = timed(s.grad_copy,
                        [&] {
                          return r.runtime.device().copy_async(*grad, r.gradient.data(),
                                                               r.layer_bytes,
                                                               CopyKind::kHostToDevice, stream);
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
  return s;
}

struct RankRecord {
  std::vector<Zero3Sample> samples;
  ZeroMemory memory;
};

// This rank's engine over the runtime and communicator: one warm-up step and --steps timed ones.
// `beside_engine` runs with the engine created, before the warm-up step and after the last one
// (the raw collectives: see run_zero3_workload).
absl::StatusOr<RankRecord> run_steps(const Zero3Options& o, const Plan& plan, Runtime& rt,
                                     Communicator& comm, HostCompute& compute,
                                     uint64_t compute_elements,
                                     const std::function<absl::Status()>& beside_engine,
                                     std::ostream& human) {
  std::vector<ZeroParam> params;
  for (uint64_t l = 0; l < o.layers; ++l) {
    params.push_back(ZeroParam{.name = absl::StrFormat("layer%d", l),
                               .shape = {static_cast<int64_t>(plan.layer_params)},
                               .initial = {}});
  }
  ZeroOptions options;
  options.stage = 3;
  options.param_type = ParamType::kF16;
  options.grad_type = GradType::kF16;
  options.bucket_bytes = o.layer_bytes;  // one group per layer
  options.alignment = kAlignment;
  options.param_home = o.param_home == "gpu"   ? TierKind::kGpu
                       : o.param_home == "cpu" ? TierKind::kCpu
                                               : TierKind::kNvme;
  options.persist_below_bytes = 0;  // every layer partitioned
  options.prefetch_bytes = plan.prefetch_bytes;
  options.max_live_bytes = plan.max_live_bytes;
  options.reuse_window_bytes = plan.reuse_window_bytes;
  options.optimizer.state_home = TierKind::kCpu;
  options.optimizer.defaults = workload_hyper();
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
  RankRecord record;
  Clock::time_point start = Clock::now();
  for (uint64_t s = 0; s <= o.steps; ++s) {
    auto sample = one_step(rig, start);
    if (!sample.ok()) return sample.status();
    start = Clock::now();
    if (s > 0) record.samples.push_back(*sample);
  }
  if (absl::Status st = device.synchronize(**stream); !st.ok()) return st;
  record.memory = (*engine)->memory();
  if (absl::Status st = beside_engine(); !st.ok()) return st;
  return record;
}

// Every rank's samples and memory, gathered to every rank; fills the report's step figures.
absl::Status combine(Communicator& comm, const RankRecord& mine, uint64_t steps,
                     Zero3Report& report) {
  std::vector<double> send;
  for (const Zero3Sample& sample : mine.samples) {
    for (auto field : kFields) send.push_back(sample.*field);
  }
  const ZeroMemory& m = mine.memory;
  for (size_t t = 0; t < 3; ++t) {
    send.push_back(static_cast<double>(m.params[t] + m.grads[t] + m.optimizer_states[t]));
  }
  send.push_back(static_cast<double>(m.model_states()));
  const size_t per_rank = steps * kSampleDoubles + kRankDoubles;
  std::vector<double> all(per_rank * static_cast<size_t>(comm.size()));
  if (absl::Status s =
          finish(comm.all_gather(send.data(), all.data(), per_rank, DataType::kFloat64));
      !s.ok()) {
    return with_context(s, "gathering the samples");
  }
  auto sample_at = [&](int rank, uint64_t step) {
    const double* v = all.data() + per_rank * static_cast<size_t>(rank) + step * kSampleDoubles;
    Zero3Sample s;
    for (size_t f = 0; f < kSampleDoubles; ++f) s.*kFields[f] = v[f];
    return s;
  };
  report.per_rank.clear();
  for (int r = 0; r < comm.size(); ++r) {
    Zero3RankSummary summary;
    summary.rank = r;
    std::vector<Zero3Sample> samples;
    for (uint64_t s = 0; s < steps; ++s) {
      samples.push_back(sample_at(r, s));
      summary.all_step_seconds.push_back(samples.back().step);
    }
    summary.median = samples[lower_median_index(summary.all_step_seconds)];
    for (const Zero3Sample& s : samples) summary.mean_nvme_read_bytes += s.nvme_read_bytes;
    summary.mean_nvme_read_bytes /= static_cast<double>(steps);
    const double* tail = all.data() + per_rank * static_cast<size_t>(r) + steps * kSampleDoubles;
    for (size_t t = 0; t < 3; ++t) summary.model_states_by_tier[t] = static_cast<uint64_t>(tail[t]);
    summary.model_state_bytes = static_cast<uint64_t>(tail[3]);
    report.per_rank.push_back(std::move(summary));
  }
  // Each step counts with its slowest rank.
  std::vector<int> slowest(steps, 0);
  report.all_step_seconds.assign(steps, 0);
  for (uint64_t s = 0; s < steps; ++s) {
    for (const Zero3RankSummary& r : report.per_rank) {
      if (r.all_step_seconds[s] > report.all_step_seconds[s]) {
        report.all_step_seconds[s] = r.all_step_seconds[s];
        slowest[s] = r.rank;
      }
    }
  }
  const size_t middle = lower_median_index(report.all_step_seconds);
  report.step_seconds = report.all_step_seconds[middle];
  report.slowest_rank = slowest[middle];
  report.median = sample_at(report.slowest_rank, middle);
  return absl::OkStatus();
}

absl::StatusOr<std::string> document(const Zero3Report& report) {
  auto device = make_device(report.config.backend, report.config.device);
  if (!device.ok()) return device.status();
  Report paths;  // no path rows: this workload's results are under "zero"
  paths.engine = report.raw_read.has_value() || report.options.param_home == "nvme"
                     ? std::string(to_string(report.config.io_engine))
                     : "none";
  paths.nvme_paths = report.config.nvme_paths;
  std::string text = to_json(paths, report.config, **device);
  text.pop_back();  // the closing brace: the results become the document's last key
  return text + ", \"zero\": " + zero3_json(report) + "}\n";
}

// Where the engine's collectives read and write: Gloo moves host memory, so on a CUDA device
// they use the CPU tier.
TierKind comm_tier_of(Runtime& rt, Communicator& comm) {
  const bool host_device = rt.device().backend() == Backend::kHost;
  return host_device || comm.backend() == CommBackendKind::kNccl ? TierKind::kGpu : TierKind::kCpu;
}

// The baselines on every rank that come before the engine exists: the compute's calibration and
// the raw shard read (the raw collectives run beside the engine: see run_zero3_workload).
absl::Status run_baselines(const Zero3Options& o, const Plan& plan, const ResolvedConfig& config,
                           const std::vector<std::string>& nvme_paths, Communicator& comm,
                           HostCompute& compute, Zero3Report& report, std::ostream& human) {
  human << "zero: baselines: calibrating the compute"
        << (nvme_paths.empty() ? "" : "; raw io_uring read of each rank's shard") << "\n";
  human.flush();
  auto calibration = compute.calibrate(comm, o.layer_compute);
  if (!calibration.ok()) return calibration.status();
  report.compute = *std::move(calibration);
  if (!nvme_paths.empty()) {
    auto read = time_raw_shard_read(comm, nvme_paths, plan.model_shard_bytes, config.io_block,
                                    config.io_depth, kBaselineSamples);
    if (absl::IsUnavailable(read.status())) {
      report.notes.push_back("shard read baseline: none: " + std::string(read.status().message()) +
                             " (the bound has no shard-read term)");
    } else if (!read.ok()) {
      return read.status();
    } else {
      report.notes.push_back(read->describe);
      report.raw_read = *std::move(read);
    }
  }
  return absl::OkStatus();
}

}  // namespace

Zero3Bound bound_of(const Zero3Report& report, const Zero3Sample& s) {
  Zero3Bound b;
  b.compute = s.compute;
  b.gather = s.gathers * report.raw_comm.all_gather_seconds;
  b.reduce_scatter =
      static_cast<double>(report.options.layers) * report.raw_comm.reduce_scatter_seconds;
  b.comm = b.gather + b.reduce_scatter;
  b.shard_read = report.raw_read.has_value() ? report.raw_read->seconds : 0;
  b.optimizer = s.optimizer;
  b.seconds = std::max({b.compute, b.comm, b.shard_read}) + b.optimizer;
  return b;
}

Zero3Goal goal_of(const Zero3Report& report, const Zero3Sample& s) {
  const Zero3Bound b = bound_of(report, s);
  Zero3Goal g;
  g.applies = b.compute >= b.comm && b.compute >= b.shard_read;
  g.met = g.applies && s.exposed_fraction() <= kExposedGoal;
  return g;
}

int run_zero3_workload(const Zero3Options& o, const cli::FlagSet& flags) {
  auto launch_or = LaunchInfo::from_environment();
  if (!launch_or.ok()) return fail(launch_or.status());
  LaunchInfo launch = *launch_or;
  // Alone (no launcher): a free port, so that a lone run never collides with another job.
  if (!launch.launched) launch.master_port = 0;
  auto base = Config::from_environment();
  if (!base.ok()) return fail(base.status());
  auto loaded = load_configuration(*base);
  if (!loaded.ok()) return fail(loaded.status());
  const ResolvedConfig& env = loaded->first;
  const MachineInfo& machine = loaded->second;
  const int ranks = launch.world_size;
  const Plan plan = plan_of(o, ranks);
  // The same checks on every rank: all of them stop with the same usage error.
  if (plan.max_live_bytes < plan.gathered_bytes) {
    return flags.usage_error(absl::StrFormat(
        "--max-live-bytes=%d: below one layer's gathered bytes at %d ranks (%d: --layer-bytes "
        "padded to %d x %d elements); give at least that, or auto",
        plan.max_live_bytes, ranks, plan.gathered_bytes, ranks, kAlignment));
  }
  std::optional<NvmeDirs> dirs;
  if (o.param_home == "nvme") {
    auto chosen = NvmeDirs::choose(base->nvme_paths);
    if (!chosen.ok()) return fail(chosen.status());
    dirs.emplace(*std::move(chosen));
  }
  const std::vector<std::string> nvme_paths =
      dirs.has_value() ? dirs->paths() : std::vector<std::string>();
  const Config config = runtime_config(o, plan, *base, nvme_paths);
  const uint64_t needed = host_bytes_needed(config, env, ranks);
  const auto usable = static_cast<uint64_t>(static_cast<double>(machine.physical_memory_bytes) *
                                            kUsableMemoryFraction);
  if (needed > usable) {
    return flags.usage_error(absl::StrFormat(
        "--layers=%d --layer-bytes=%d: %d rank(s) on this machine need about %s of host memory, "
        "more than 80%% of this machine's %s (%s); lower --layers, --layer-bytes or "
        "--max-live-bytes",
        o.layers, o.layer_bytes, ranks, format_bytes(needed),
        format_bytes(machine.physical_memory_bytes), machine.physical_memory_source));
  }
  const bool lead = launch.rank == 0;
  std::unique_ptr<FILE, int (*)(FILE*)> json_file(nullptr, &std::fclose);
  if (lead && !o.json.empty() && o.json != "-") {
    json_file.reset(std::fopen(o.json.c_str(), "w"));
    if (json_file == nullptr) {
      return flags.usage_error("--json: cannot write '" + o.json + "': " + std::strerror(errno));
    }
  }
  const bool json_to_stdout = o.json == "-";
  // Only rank 0 speaks; the others' progress lines go nowhere.
  std::ostream null_stream(nullptr);
  std::ostream& human = !lead ? null_stream : json_to_stdout ? std::cerr : std::cout;

  auto runtime = Runtime::create(config);
  if (!runtime.ok()) return fail(with_context(runtime.status(), "creating the runtime"));
  auto comm_or = Communicator::create(
      CommOptions{.launch = launch, .settings = base->comm, .device = &(*runtime)->device()});
  if (!comm_or.ok()) return fail(comm_or.status());
  Communicator& comm = **comm_or;
  Zero3Report report;
  report.options = o;
  report.ranks = comm.size();
  report.comm = comm.description();
  report.comm_backend = std::string(to_string(comm.backend()));
  report.config = (*runtime)->config();
  report.device = (*runtime)->device().description();
  report.layer_params = plan.layer_params;
  report.padded_params = plan.padded;
  report.shard_params = plan.shard;
  report.gathered_layer_bytes = plan.gathered_bytes;
  report.prefetch_bytes = plan.prefetch_bytes;
  report.max_live_bytes = plan.max_live_bytes;
  report.reuse_window_bytes = plan.reuse_window_bytes;
  report.shard_bytes = plan.model_shard_bytes;
  if (dirs.has_value()) report.nvme_dirs = dirs->describe();
  human << "offload-bench " << STRATA_VERSION << " workload zero (ZeRO stage 3): " << o.layers
        << " layers of " << format_bytes(o.layer_bytes) << ", shards in " << o.param_home << "; "
        << report.comm << "\n";
  if (dirs.has_value()) human << "nvme: directories " << report.nvme_dirs << "\n";
  human.flush();

  HostCompute compute;
  if (absl::Status s =
          run_baselines(o, plan, report.config, nvme_paths, comm, compute, report, human);
      !s.ok()) {
    return fail(s);
  }
  // The raw collectives, timed with the engine created (idle) before the warm-up step and after
  // the last step, their samples together: so that a load that drifts during the run weighs on
  // both sides, and the process is in the state the steps ran in. (That state matters here:
  // until glibc's dynamic mmap threshold is raised — ZeroEngine::create raises it, freeing its
  // initial values — every Gloo reduce-scatter maps and unmaps its buffers, which made one of
  // a 1 MiB layer 25x slower on this machine; docs/bench.md.)
  bool first = true;
  auto raw_collectives = [&]() -> absl::Status {
    human << "zero: raw all_gather and reduce_scatter of one layer through the Communicator\n";
    human.flush();
    auto raw = time_raw_collectives(**runtime, comm, comm_tier_of(**runtime, comm), plan.shard,
                                    kBaselineSamples, kCallsPerSample);
    if (!raw.ok()) return raw.status();
    if (first) {
      report.raw_comm = *std::move(raw);
    } else {
      merge(report.raw_comm, *raw);
    }
    first = false;
    return absl::OkStatus();
  };
  auto record = run_steps(o, plan, **runtime, comm, compute, report.compute.elements_per_layer,
                          raw_collectives, human);
  if (!record.ok()) return fail(record.status());
  if (absl::Status s = combine(comm, *record, o.steps, report); !s.ok()) return fail(s);
  if (!lead) return 0;
  human << "offload-bench on " << report.device << "\n" << render(report.config);
  print_zero3(report, human);
  if (o.json.empty()) return 0;
  auto text = document(report);
  if (!text.ok()) return fail(text.status());
  if (json_to_stdout) {
    std::cout << *text;
  } else if (std::fwrite(text->data(), 1, text->size(), json_file.get()) != text->size() ||
             std::fclose(json_file.release()) != 0) {
    return cli::print_error("offload-bench",
                            "cannot write --json=" + o.json + ": " + std::strerror(errno));
  }
  return 0;
}

}  // namespace strata::bench
