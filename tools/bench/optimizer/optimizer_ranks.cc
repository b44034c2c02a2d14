#include "bench/optimizer/optimizer_ranks.h"

#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <utility>

#include "bench/common.h"
#include "bench/fresh_pieces.h"
#include "bench/optimizer/optimizer_baselines.h"
#include "bench/optimizer/timed_comm.h"
#include "bench/report.h"
#include "strata/base/size.h"
#include "strata/comm/communicator.h"
#include "strata/device/backend.h"
#include "strata/runtime/runtime.h"
#include "strata/zero/zero_engine.h"
#include "strata/zero/zero_layout.h"

namespace strata::bench {
namespace {

// The optimizer workload's patterns: parameters 0.05 (seed 2), gradients 1e-2 (seed 1), each
// 1 Mi elements repeated over every tensor from its start.
constexpr uint64_t kFillElements = uint64_t{1} << 20;
constexpr uint64_t kStateBytes = 12;  // fp32 master, m and v
constexpr double kUsableMemoryFraction = 0.8;
constexpr uint64_t kTierSlack = uint64_t{256} << 20;
// Per sample, the doubles of one ZeroSample in the all-gather (see to_doubles()).
constexpr size_t kSampleDoubles = 12;
// Per rank after the samples: model states by tier (3), every tier, the buckets.
constexpr size_t kRankDoubles = 5;

uint64_t dtype_bytes(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

GradType grad_type_of(const std::string& dtype) {
  return dtype == "fp32" ? GradType::kF32 : dtype == "bf16" ? GradType::kBF16 : GradType::kF16;
}

ParamType param_type_of(const std::string& dtype) {
  return dtype == "fp32" ? ParamType::kF32 : dtype == "bf16" ? ParamType::kBF16 : ParamType::kF16;
}

int fail(const absl::Status& status) {
  return cli::print_error("offload-bench", std::string(status.message()));
}

absl::Status with_context(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("optimizer (ZeRO): %s: %s", what,
                                                     std::string(status.message())));
}

absl::Status finish(absl::StatusOr<std::unique_ptr<CollectiveWork>> work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

double seconds(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

// The layout the engine will make (ZeroLayout is a pure function of these), for sizing the
// tiers before the engine exists.
absl::StatusOr<ZeroLayout> plan_layout(const OptimizerOptions& o, int ranks) {
  const ZeroOptions defaults;
  std::vector<ZeroLayoutParam> params;
  const std::vector<uint64_t> counts = optimizer_tensor_counts(o.params);
  for (size_t t = 0; t < counts.size(); ++t) {
    params.push_back(ZeroLayoutParam{.name = absl::StrFormat("p%d", t),
                                     .shape = {static_cast<int64_t>(counts[t])},
                                     .count = counts[t]});
  }
  return ZeroLayout::plan(std::move(params), static_cast<uint32_t>(ranks),
                          defaults.bucket_bytes / dtype_bytes(o.dtype), defaults.alignment);
}

// Stage 2's buckets: each as large as the largest group (a parameter larger than
// bucket_bytes gets a group of its own).
uint64_t bucket_bytes_of(const ZeroLayout& layout, uint64_t d) {
  uint64_t largest = 0;
  for (const ZeroFlatGroup& g : layout.groups()) largest = std::max(largest, g.padded);
  return ZeroOptions().gradient_buckets * largest * d;
}

// One rank's runtime, for both state homes in turn: the GPU arena holds every flat parameter
// tensor and stage 1's full gradients (or stage 2's buckets), the CPU tier the slice's states
// (home CPU), its reduced gradients and parameter copies, and the NVMe staging; the swap space
// two slots of the slice's states per path.
Config ranked_config(const ZeroBenchOptions& o, const Config& base, const ZeroLayout& layout,
                     const std::vector<std::string>& nvme_paths) {
  Config c = base;
  const uint64_t d = dtype_bytes(o.optimizer.dtype);
  const uint64_t padded = layout.padded_elements();
  const uint64_t shard = layout.shard_elements();
  const uint64_t groups = layout.groups().size();
  const uint64_t payload =
      2 * d * padded + bucket_bytes_of(layout, d) + (groups + layout.params().size()) * 2 * 256;
  c.gpu_bytes = SizeSetting::of_bytes(
      round_up(payload + payload / 32 + (uint64_t{64} << 20), uint64_t{1} << 20));
  const uint64_t slack = groups * 8 * kPage + kTierSlack;
  c.nvme_paths = nvme_paths;
  c.cpu_bytes = SizeSetting::of_bytes(round_up((kStateBytes + 4 + 2 * d) * shard + slack +
                                               (nvme_paths.empty() ? 0 : c.staging_bytes)));
  if (!nvme_paths.empty() && std::getenv("STRATA_NVME_BYTES") == nullptr) {
    const uint64_t per_path = 3 * kStateBytes * shard / nvme_paths.size();
    c.nvme_bytes = SizeSetting::of_bytes(round_up(per_path, c.io_block) + 64 * c.io_block);
  }
  return c;
}

// Host memory of the whole job at its peak, all ranks on this machine (as under strata-run):
// every rank's runtime (its GPU arena too on the host backend) and rank 0's single-rank runtime
// beside it.
uint64_t host_bytes_needed(const ZeroBenchOptions& o, const ZeroLayout& layout, int ranks,
                           bool host_arena) {
  const uint64_t d = dtype_bytes(o.optimizer.dtype);
  const uint64_t n = o.optimizer.params;
  const uint64_t arena =
      host_arena ? 2 * d * layout.padded_elements() + bucket_bytes_of(layout, d) : 0;
  // The fp32 initial values of the largest tensor (16 Mi elements at most), during create().
  const uint64_t initial = 4 * std::min<uint64_t>(n, uint64_t{1} << 24);
  const uint64_t rank =
      arena + (kStateBytes + 4 + 2 * d) * layout.shard_elements() + kTierSlack + initial;
  const uint64_t single = (kStateBytes + 2 * d) * n + (host_arena ? 2 * d * n : 0) + kTierSlack;
  return static_cast<uint64_t>(ranks) * rank + single;
}

// The optimizer workload's parameter values: its dtype pattern, widened to fp32, repeated over
// `count` elements (every tensor starts the pattern afresh, so one buffer serves them all).
std::vector<float> initial_values(const std::string& dtype, uint64_t count) {
  std::vector<std::byte> pattern(kFillElements * dtype_bytes(dtype));
  fill_values(pattern.data(), kFillElements, dtype, 0.05F, /*seed=*/2);
  std::vector<float> values(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t k = i % kFillElements;
    if (dtype == "fp32") {
      std::memcpy(&values[i], pattern.data() + k * 4, 4);
    } else {
      uint16_t bits = 0;
      std::memcpy(&bits, pattern.data() + k * 2, 2);
      values[i] = dtype == "fp16" ? half_to_float(bits) : bf16_to_float(bits);
    }
  }
  return values;
}

std::vector<double> to_doubles(const ZeroSample& s) {
  return {s.step,          s.engine_step,   s.optimizer,
          s.adam,          s.stats_reduce,  s.wait,
          s.gather,        s.grad_phase,    s.engine_comm_bytes,
          s.comm_bytes[0], s.comm_bytes[1], s.comm_bytes[2]};
}

ZeroSample from_doubles(const double* v) {
  return ZeroSample{.step = v[0],
                    .engine_step = v[1],
                    .optimizer = v[2],
                    .adam = v[3],
                    .stats_reduce = v[4],
                    .wait = v[5],
                    .gather = v[6],
                    .grad_phase = v[7],
                    .engine_comm_bytes = v[8],
                    .comm_bytes = {v[9], v[10], v[11]}};
}

// What one rank measured with states at one home.
struct RankRecord {
  std::vector<ZeroSample> samples;
  ZeroMemory memory;
};

// One sample: the barrier, the gradient phase, then step() timed alone.
// `fresh` counts the CPU-tier pieces its timed parts pinned.
absl::StatusOr<ZeroSample> one_sample(ZeroEngine& engine, const AllReduceTimer& timer, Runtime& rt,
                                      Stream& stream, const std::vector<ZeroParamId>& ids,
                                      const std::vector<uint64_t>& counts, uint64_t d,
                                      const PinnedHostMemory& grad_pattern, FreshPieces& fresh) {
  Device& device = rt.device();
  Communicator& comm = engine.communicator();
  // Untimed: the CPU tier's io_uring registration queued so far does not run beside the sample.
  rt.wait_for_registration();
  if (absl::Status s = finish(comm.barrier()); !s.ok()) return with_context(s, "barrier");
  const CommStats before = comm.stats();
  const PinCounters pins = pin_counters(rt);
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < ids.size(); ++i) {
    auto grad = engine.acquire_grad(ids[i], TierKind::kGpu, stream);
    if (!grad.ok()) return with_context(grad.status(), "acquire_grad");
    // The buffer starts each micro-step at zero: writing the gradient adds it.
    const uint64_t bytes = counts[i] * d;
    for (uint64_t offset = 0; offset < bytes; offset += grad_pattern.size()) {
      if (absl::Status s = device.copy_async(
              static_cast<std::byte*>(*grad) + offset, grad_pattern.data(),
              std::min(grad_pattern.size(), bytes - offset), CopyKind::kHostToDevice, stream);
          !s.ok()) {
        return with_context(s, "writing a gradient");
      }
    }
    if (absl::Status s = engine.grad_ready(ids[i], stream); !s.ok()) {
      return with_context(s, "grad_ready");
    }
  }
  ZeroSample sample;
  sample.grad_phase = absl::ToDoubleSeconds(absl::Now() - start);
  const uint64_t reduce_before = timer.all_reduce_ns();
  const absl::Time step_start = absl::Now();
  auto result = engine.step();
  sample.step = absl::ToDoubleSeconds(absl::Now() - step_start);
  fresh.add(pins, pin_counters(rt));
  if (!result.ok()) return with_context(result.status(), "step");
  if (result->skipped) {
    return absl::InternalError(
        "optimizer (ZeRO): the step was skipped for an inf/nan gradient; the workload's "
        "gradients are finite, so this is a bug");
  }
  const ZeroStats stats = engine.stats();
  const CommStats after = comm.stats();
  sample.optimizer = seconds(stats.last_optimizer_ns);
  sample.adam = seconds(engine.optimizer().stats().last_adam_ns);
  sample.stats_reduce = seconds(timer.all_reduce_ns() - reduce_before);
  sample.wait = seconds(stats.last_step_wait_ns);
  sample.gather = seconds(stats.last_gather_ns);
  sample.engine_step = seconds(stats.last_step_ns);
  sample.engine_comm_bytes = static_cast<double>(stats.last_step_comm_bytes);
  const CollectiveKind kinds[] = {CollectiveKind::kReduceScatter, CollectiveKind::kAllGather,
                                  CollectiveKind::kAllReduce};
  for (size_t k = 0; k < 3; ++k) {
    sample.comm_bytes[k] = static_cast<double>(after[kinds[k]].bytes - before[kinds[k]].bytes);
  }
  // Untimed: the gathered parameters are where the model reads them before the next sample.
  for (const ZeroParamId& id : ids) {
    if (auto data = engine.acquire_param(id, TierKind::kGpu, stream); !data.ok()) {
      return with_context(data.status(), "reading the updated parameters");
    }
    if (absl::Status s = engine.release_param(id, stream); !s.ok()) return s;
  }
  if (absl::Status s = device.synchronize(stream); !s.ok()) return s;
  return sample;
}

// This rank's part with states at `home`: the engine over the shared runtime and communicator,
// one warm-up sample and --repeat timed ones. The engine is gone when this returns.
absl::StatusOr<RankRecord> run_ranked(const ZeroBenchOptions& o, Runtime& rt, Communicator& comm,
                                      TierKind home, ZeroReport& report, std::ostream& human) {
  // The engine's collectives go through this, which times its statistics all-reduce.
  AllReduceTimer timer(comm);
  const std::string& dtype = o.optimizer.dtype;
  const uint64_t d = dtype_bytes(dtype);
  const std::vector<uint64_t> counts = optimizer_tensor_counts(o.optimizer.params);
  std::vector<ZeroParam> params;
  std::vector<float> initial;
  {
    const uint64_t largest = *std::max_element(counts.begin(), counts.end());
    initial = initial_values(dtype, largest);
  }
  for (size_t t = 0; t < counts.size(); ++t) {
    ZeroParam& param = params.emplace_back();
    param.name = absl::StrFormat("p%d", t);
    param.shape = {static_cast<int64_t>(counts[t])};
    param.initial = std::span<const float>(initial.data(), counts[t]);
  }
  ZeroOptions options;
  options.stage = o.stage;
  options.param_type = param_type_of(dtype);
  options.grad_type = grad_type_of(dtype);
  options.optimizer.state_home = home;
  options.optimizer.defaults = workload_hyper();
  const std::string home_name = home == TierKind::kCpu ? "cpu" : "nvme";
  human << absl::StrFormat(
      "optimizer: ZeRO stage %d on %d ranks, states on %s: creating the "
      "engine (%d parameter tensors)\n",
      o.stage, comm.size(), home_name, counts.size());
  human.flush();
  // Declared before the engine: destroyed after it.
  Device& device = rt.device();
  auto stream = device.create_stream();
  if (!stream.ok()) return stream.status();
  auto pattern = device.allocate_pinned(kFillElements * d, "zero gradient pattern");
  if (!pattern.ok()) return pattern.status();
  fill_values(static_cast<std::byte*>((*pattern)->data()), kFillElements, dtype, 1e-2F,
              /*seed=*/1);
  auto engine_or = ZeroEngine::create(rt, timer, params, options);
  if (!engine_or.ok()) return with_context(engine_or.status(), "creating the engine");
  ZeroEngine& engine = **engine_or;
  initial = {};
  const ZeroLayout& layout = engine.layout();
  report.bucket_bytes = engine.options().bucket_bytes;
  report.gradient_buckets = engine.options().gradient_buckets;
  report.alignment = layout.alignment();
  report.groups = layout.groups().size();
  report.padded_params = layout.padded_elements();
  report.shard_params = layout.shard_elements();
  std::vector<ZeroParamId> ids;
  for (const ZeroParam& p : params) {
    auto id = engine.find(p.name);
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  human << absl::StrFormat("optimizer: ZeRO states on %s: 1 warm-up step, %d timed\n", home_name,
                           o.optimizer.repeat);
  human.flush();
  RankRecord record;
  FreshPieces fresh, warm_up;
  for (uint64_t s = 0; s <= o.optimizer.repeat; ++s) {
    auto sample =
        one_sample(engine, timer, rt, **stream, ids, counts, d, **pattern, s > 0 ? fresh : warm_up);
    if (!sample.ok()) return sample.status();
    if (s > 0) record.samples.push_back(*sample);
  }
  // This rank's (only rank 0 reports).
  if (std::string note = fresh.note(absl::StrFormat("optimizer (ZeRO stage %d), states on %s, "
                                                    "rank %d",
                                                    o.stage, home_name, comm.rank()),
                                    "timed sample");
      !note.empty()) {
    report.notes.push_back(std::move(note));
  }
  record.memory = engine.memory();
  return record;
}

// The lower middle index of `values` by value.
size_t median_index(const std::vector<double>& values) {
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return values[a] < values[b]; });
  return order[(order.size() - 1) / 2];
}

// Every rank's samples and memory, gathered to every rank; rank 0 fills `run` from them.
absl::Status combine(Communicator& comm, const RankRecord& mine, uint64_t repeat, ZeroRun& run) {
  std::vector<double> send;
  for (const ZeroSample& sample : mine.samples) {
    const std::vector<double> v = to_doubles(sample);
    send.insert(send.end(), v.begin(), v.end());
  }
  const ZeroMemory& m = mine.memory;
  for (size_t t = 0; t < 3; ++t) {
    send.push_back(static_cast<double>(m.params[t] + m.grads[t] + m.optimizer_states[t]));
  }
  send.push_back(static_cast<double>(m.model_states()));
  send.push_back(static_cast<double>(m.buckets[0] + m.buckets[1] + m.buckets[2]));
  const size_t per_rank = repeat * kSampleDoubles + kRankDoubles;
  std::vector<double> all(per_rank * static_cast<size_t>(comm.size()));
  if (absl::Status s =
          finish(comm.all_gather(send.data(), all.data(), per_rank, DataType::kFloat64));
      !s.ok()) {
    return with_context(s, "gathering the samples");
  }
  run.ranks.clear();
  for (int r = 0; r < comm.size(); ++r) {
    const double* base = all.data() + per_rank * static_cast<size_t>(r);
    ZeroRankSummary summary;
    summary.rank = r;
    std::vector<ZeroSample> samples;
    for (uint64_t s = 0; s < repeat; ++s) {
      samples.push_back(from_doubles(base + s * kSampleDoubles));
      summary.all_step_seconds.push_back(samples.back().step);
    }
    summary.median = samples[median_index(summary.all_step_seconds)];
    const double* tail = base + repeat * kSampleDoubles;
    for (size_t t = 0; t < 3; ++t) summary.by_tier[t] = static_cast<uint64_t>(tail[t]);
    summary.model_state_bytes = static_cast<uint64_t>(tail[3]);
    summary.bucket_bytes = static_cast<uint64_t>(tail[4]);
    run.ranks.push_back(std::move(summary));
  }
  // Each sample counts with its slowest rank.
  std::vector<int> slowest(repeat, 0);
  run.all_step_seconds.assign(repeat, 0);
  for (uint64_t s = 0; s < repeat; ++s) {
    for (const ZeroRankSummary& r : run.ranks) {
      if (r.all_step_seconds[s] > run.all_step_seconds[s]) {
        run.all_step_seconds[s] = r.all_step_seconds[s];
        slowest[s] = r.rank;
      }
    }
  }
  const size_t middle = median_index(run.all_step_seconds);
  run.step_seconds = run.all_step_seconds[middle];
  run.median_rank = slowest[middle];
  const double* chosen = all.data() + per_rank * static_cast<size_t>(run.median_rank);
  run.median = from_doubles(chosen + middle * kSampleDoubles);
  return absl::OkStatus();
}

absl::StatusOr<ZeroRun> run_home(const ZeroBenchOptions& o, const Config& base,
                                 const std::vector<std::string>& nvme_paths, Runtime& rt,
                                 Communicator& comm, TierKind home, ZeroReport& report,
                                 std::ostream& human) {
  ZeroRun run;
  run.state_home = home == TierKind::kCpu ? "cpu" : "nvme";
  auto record = run_ranked(o, rt, comm, home, report, human);
  if (!record.ok()) return record.status();
  // Rank 0 alone: the single-rank step over the whole model; the others wait.
  if (absl::Status s = finish(comm.barrier()); !s.ok()) return with_context(s, "barrier");
  if (comm.rank() == 0) {
    OptimizerReport single;
    human << absl::StrFormat(
        "optimizer: single-rank baseline on rank 0, states on %s (the "
        "other ranks wait)\n",
        run.state_home);
    human.flush();
    auto steps = run_single_rank_steps(o.optimizer, base, home, nvme_paths, single, human);
    if (!steps.ok()) return steps.status();
    run.single = *std::move(steps);
    run.ideal_seconds = run.single.step_seconds / static_cast<double>(comm.size());
    report.notes.insert(report.notes.end(), single.notes.begin(), single.notes.end());
    if (home == TierKind::kCpu) {
      report.config = single.config;
      report.device = single.device;
    } else if (single.nvme.has_value()) {
      report.nvme_engine = single.nvme->engine;
    }
  }
  if (absl::Status s = finish(comm.barrier()); !s.ok()) return with_context(s, "barrier");
  if (absl::Status s = combine(comm, *record, o.optimizer.repeat, run); !s.ok()) return s;
  return run;
}

absl::StatusOr<std::string> document(const ZeroReport& report) {
  auto device = make_device(report.config.backend, report.config.device);
  if (!device.ok()) return device.status();
  Report paths;  // no path rows: this workload's results are under "optimizer"
  paths.engine = report.nvme.has_value() ? report.nvme_engine : "none";
  paths.nvme_paths = report.nvme_paths;
  return document_with(to_json(paths, report.config, **device), "optimizer", zero_json(report));
}

}  // namespace

std::optional<std::string> parse_zero_stage(uint64_t value, uint32_t* out) {
  if (value != 1 && value != 2) {
    return absl::StrFormat(
        "--zero-stage=%d: must be 1 (optimizer states partitioned) or 2 (gradients too)%s", value,
        value == 0 ? "; leave the flag out (and run without strata-run) for the single-rank "
                     "workload"
                   : "; stage 3 (parameters partitioned too) is timed by --workload=zero");
  }
  *out = static_cast<uint32_t>(value);
  return std::nullopt;
}

bool zero_workload_wanted(bool zero_stage_given) {
  if (zero_stage_given) return true;
  // Launch variables that do not parse: the ranked workload reports them (never N copies of
  // the single-rank workload side by side).
  auto launch = LaunchInfo::from_environment();
  return !launch.ok() || launch->world_size > 1;
}

int run_optimizer_ranks_workload(const ZeroBenchOptions& o, const cli::FlagSet& flags) {
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
  auto layout = plan_layout(o.optimizer, ranks);
  if (!layout.ok()) return fail(layout.status());
  // The same check on every rank: all of them stop with the same usage error.
  const uint64_t needed = host_bytes_needed(o, *layout, ranks, env.backend == Backend::kHost);
  const auto usable = static_cast<uint64_t>(static_cast<double>(machine.physical_memory_bytes) *
                                            kUsableMemoryFraction);
  if (needed > usable) {
    const uint64_t per_param = std::max<uint64_t>(1, needed / o.optimizer.params);
    return flags.usage_error(absl::StrFormat(
        "--params=%d: %s on this machine and rank 0's single-rank baseline need about %s of "
        "host memory together (%d bytes per parameter), more than 80%% of this machine's %s "
        "(%s); lower --params to about %dM or less",
        o.optimizer.params, ranks == 1 ? "1 rank" : absl::StrFormat("%d ranks", ranks),
        format_bytes(needed), per_param, format_bytes(machine.physical_memory_bytes),
        machine.physical_memory_source, usable / per_param / 1'000'000));
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
  ZeroReport report;
  report.options = o;
  report.isa = std::string(adam_isa());
  report.threads = TriadBuffers::threads();
  report.tensors = optimizer_tensor_counts(o.optimizer.params).size();
  report.nvme_paths = env.nvme_paths;

  auto runtime = Runtime::create(ranked_config(o, *base, *layout, env.nvme_paths));
  if (!runtime.ok()) return fail(with_context(runtime.status(), "creating the runtime"));
  auto comm_or = Communicator::create(
      CommOptions{.launch = launch, .settings = base->comm, .device = &(*runtime)->device()});
  if (!comm_or.ok()) return fail(comm_or.status());
  Communicator& comm = **comm_or;
  report.ranks = comm.size();
  report.comm = comm.description();
  report.comm_backend = std::string(to_string(comm.backend()));
  human << "offload-bench " << STRATA_VERSION << " workload optimizer (ZeRO stage " << o.stage
        << "): " << o.optimizer.params << " params, " << o.optimizer.dtype << "; " << report.comm
        << "\n";
  human.flush();
  auto cpu = run_home(o, *base, env.nvme_paths, **runtime, comm, TierKind::kCpu, report, human);
  if (!cpu.ok()) return fail(cpu.status());
  report.cpu = *std::move(cpu);
  if (!env.nvme_paths.empty()) {
    auto nvme = run_home(o, *base, env.nvme_paths, **runtime, comm, TierKind::kNvme, report, human);
    if (!nvme.ok()) return fail(nvme.status());
    report.nvme = *std::move(nvme);
  }
  if (!lead) return 0;
  human << "offload-bench on " << report.device << "\n" << render(report.config);
  print_zero(report, human);
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
