#include "bench/zero/zero_workload.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <utility>

#include "bench/common.h"
#include "bench/nvme_dirs.h"
#include "bench/report.h"
#include "bench/zero/zero_steps.h"
#include "strata/base/size.h"
#include "strata/comm/communicator.h"
#include "strata/device/backend.h"
#include "strata/runtime/runtime.h"
#include "strata/zero/zero_engine.h"

namespace strata::bench {
namespace {

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
    &Zero3Sample::gather_wait,
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
    &Zero3Sample::optimizer_step,
    &Zero3Sample::early_elements,
    &Zero3Sample::rolled_back,
    &Zero3Sample::early_wait,
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

// One rank's runtime: the GPU tier holds the gathered layers, the two gradient buckets, the
// raw baselines' buffers and (gpu home) the shards, plus the shards' transient copies when the
// optimizer writes them; the CPU tier the optimizer's states (12 bytes a parameter), its fp32
// gradient shard, the shards (cpu home) and the NVMe staging; the NVMe tier the shards, twice.
Config runtime_config(const Zero3Options& o, const Zero3Plan& p, const Config& base,
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

// Every rank's samples and memory, gathered to every rank; fills the report's step figures.
absl::Status combine(Communicator& comm, const Zero3RankRecord& mine, uint64_t steps,
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
    for (const Zero3Sample& s : samples) {
      summary.mean_nvme_read_bytes += s.nvme_read_bytes;
      summary.rollback_rate += s.rolled_back;
    }
    summary.mean_nvme_read_bytes /= static_cast<double>(steps);
    summary.rollback_rate /= static_cast<double>(steps);
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
                     ? std::string(to_string(report.config.io_engine.kind))
                     : "none";
  paths.nvme_paths = report.config.nvme_paths;
  return document_with(to_json(paths, report.config, **device), "zero", zero3_json(report));
}

// Where the engine's collectives read and write: Gloo moves host memory, so on a CUDA device
// they use the CPU tier.
TierKind comm_tier_of(Runtime& rt, Communicator& comm) {
  const bool host_device = rt.device().backend() == Backend::kHost;
  return host_device || comm.backend() == CommBackendKind::kNccl ? TierKind::kGpu : TierKind::kCpu;
}

// The baselines on every rank that come before the engine exists: the compute's calibration and
// the raw shard read (the raw collectives run beside the engine: see run_zero_workload).
absl::Status run_baselines(const Zero3Options& o, const Zero3Plan& plan,
                           const ResolvedConfig& config, const std::vector<std::string>& nvme_paths,
                           Communicator& comm, HostCompute& compute, Zero3Report& report,
                           std::ostream& human) {
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

int run_zero_workload(const Zero3Options& o, const cli::FlagSet& flags) {
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
  const Zero3Plan plan = plan_of(o, ranks);
  // The same checks on every rank: all of them stop with the same usage error.
  if (plan.max_live_bytes < plan.gathered_bytes) {
    return flags.usage_error(absl::StrFormat(
        "--max-live-bytes=%d: below one layer's gathered bytes at %d ranks (%d: --layer-bytes "
        "padded to %d x %d elements); give at least that, or auto",
        plan.max_live_bytes, ranks, plan.gathered_bytes, ranks, kZero3Alignment));
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
  auto record = run_zero3_steps(o, plan, **runtime, comm, compute,
                                report.compute.elements_per_layer, raw_collectives, human);
  if (!record.ok()) return fail(record.status());
  if (absl::Status s = combine(comm, *record, o.steps, report); !s.ok()) return fail(s);
  if (!lead) return 0;
  // Rank 0's (the others' are not gathered).
  if (std::string note = record->fresh.note("zero, rank 0", "timed step"); !note.empty()) {
    report.notes.push_back(std::move(note));
  }
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
