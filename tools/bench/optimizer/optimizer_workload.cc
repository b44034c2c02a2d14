#include "bench/optimizer/optimizer_workload.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <utility>

#include "bench/common.h"
#include "bench/fresh_pieces.h"
#include "bench/optimizer/optimizer_baselines.h"
#include "bench/raw_io.h"
#include "bench/report.h"
#include "strata/base/size.h"
#include "strata/device/backend.h"
#include "strata/runtime/runtime.h"

namespace strata::bench {
namespace {

// The parameters are split into tensors of at most this many elements (16 Mi: a 4096 x 4096
// weight), as a model's are, rather than one tensor of --params.
constexpr uint64_t kMaxTensorParams = uint64_t{1} << 24;
// The naive loop runs on at most this many parameters (a prefix) and is scaled to the rest.
constexpr uint64_t kNaiveMaxParams = uint64_t{1} << 24;
constexpr uint64_t kNaiveMaxRepeats = 3;
constexpr uint64_t kMaxParams = 1'000'000'000'000;  // 1000G: far beyond any machine's memory
constexpr uint64_t kStateBytes = 12;                // fp32 master, m and v
constexpr uint64_t kFillElements = uint64_t{1} << 20;
constexpr double kUsableMemoryFraction = 0.8;
constexpr absl::Duration kLandingTimeout = absl::Seconds(300);

uint64_t dtype_bytes(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

GradType grad_type_of(const std::string& dtype) {
  return dtype == "fp32" ? GradType::kF32 : dtype == "bf16" ? GradType::kBF16 : GradType::kF16;
}

ParamType param_type_of(const std::string& dtype) {
  return dtype == "fp32" ? ParamType::kF32 : dtype == "bf16" ? ParamType::kBF16 : ParamType::kF16;
}

absl::Status with_context(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("optimizer: %s: %s", what, status.message()));
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Element counts of the tensors the parameters are split into: as equal as possible.
std::vector<uint64_t> tensor_counts(uint64_t params) {
  const uint64_t tensors = (params + kMaxTensorParams - 1) / kMaxTensorParams;
  std::vector<uint64_t> counts;
  for (uint64_t t = 0; t < tensors; ++t) {
    counts.push_back(params / tensors + (t < params % tensors ? 1 : 0));
  }
  return counts;
}

// Host memory the workload touches at its peak: the floor's three fp32 buffers (kept through
// the CPU-state run, whose steps alternate with triad passes) plus the naive loop's gradients
// and copies, or plus that run's runtime: the CPU tier (states, landed gradients, parameter
// copies) and, on the host backend, the GPU arena; then the NVMe-state run's runtime alone.
uint64_t host_bytes_needed(const OptimizerOptions& o, bool host_arena, bool nvme,
                           uint64_t staging_bytes) {
  const uint64_t n = o.params;
  const uint64_t d = dtype_bytes(o.dtype);
  const uint64_t arena = host_arena ? 2 * d * n : 0;
  const uint64_t triad = kStateBytes * n;
  const uint64_t cpu_phase =
      triad + std::max(2 * d * std::min(n, kNaiveMaxParams), kStateBytes * n + 2 * d * n + arena);
  const uint64_t nvme_phase = nvme ? staging_bytes + 2 * d * n + arena : 0;
  return std::max(cpu_phase, nvme_phase);
}

// The configuration of one run: the environment's, with the tiers sized to the workload (as
// the other workloads do). The GPU arena holds every parameter and gradient (home GPU), plus
// the arena's compaction bounce buffer (1/64, at most 64 MiB) and alignment slack.
Config sized_config(const OptimizerOptions& o, const Config& base, TierKind home,
                    const std::vector<std::string>& nvme_paths, uint64_t tensors) {
  Config c = base;
  const uint64_t n = o.params;
  const uint64_t d = dtype_bytes(o.dtype);
  const uint64_t payload = 2 * d * n + tensors * 2 * 256;
  c.gpu_bytes = SizeSetting::of_bytes(
      round_up(payload + payload / 32 + (uint64_t{64} << 20), uint64_t{1} << 20));
  // The CPU tier: each parameter's landed gradient and CPU copy (the optimizer writes the
  // updated copy there before it goes to the GPU), the states when they live there, and room
  // for page rounding and the optimizer's own pinned buffers when the runtime has no staging.
  const uint64_t slack = tensors * 8 * kPage + (uint64_t{256} << 20);
  if (home == TierKind::kCpu) {
    c.nvme_paths.clear();
    c.cpu_bytes = SizeSetting::of_bytes(round_up(kStateBytes * n + 2 * d * n + slack));
  } else {
    c.nvme_paths = nvme_paths;
    c.cpu_bytes = SizeSetting::of_bytes(round_up(c.staging_bytes + 2 * d * n + slack));
    // Two swap slots per chunk of state (a step writes the slot not holding the last committed
    // state), striped over the paths, with room for rounding every chunk to stripe units. An
    // explicit STRATA_NVME_BYTES is kept.
    if (std::getenv("STRATA_NVME_BYTES") == nullptr) {
      const uint64_t per_path = 3 * kStateBytes * n / nvme_paths.size();
      c.nvme_bytes = SizeSetting::of_bytes(round_up(per_path, c.io_block) + 64 * c.io_block);
    }
  }
  return c;
}

// The naive loop on the floor's buffers (a, b and c serve as master, m and v), on at most
// kNaiveMaxParams of them.
void measure_naive(const OptimizerOptions& o, TriadBuffers& buffers, OptimizerReport& report,
                   std::ostream& human) {
  const uint64_t measured = std::min(o.params, kNaiveMaxParams);
  const uint64_t d = dtype_bytes(o.dtype);
  human << absl::StrFormat("optimizer: naive loop: scalar AdamW, one thread, %d params\n",
                           measured);
  human.flush();
  std::vector<std::byte> grad(measured * d);
  std::vector<std::byte> copy(measured * d);
  fill_values(grad.data(), measured, o.dtype, 1e-2F, /*seed=*/1);
  std::vector<double> seconds;
  const AdamHyper hyper = workload_hyper();
  for (uint64_t r = 0; r < std::min(o.repeat, kNaiveMaxRepeats); ++r) {
    const absl::Time start = absl::Now();
    naive_adam(hyper, r + 1, o.dtype, buffers.a(), buffers.b(), buffers.c(), grad.data(),
               copy.data(), measured);
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  report.naive_measured_params = measured;
  report.naive_measured_seconds = median(seconds);
  report.naive_seconds =
      report.naive_measured_seconds * static_cast<double>(o.params) / static_cast<double>(measured);
}

// Writes `tensor` (home GPU) with the repeating values in `pattern`, through the store.
absl::Status write_tensor(Runtime& rt, Stream& stream, TensorHandle tensor, uint64_t bytes,
                          const PinnedHostMemory& pattern) {
  TensorStore& store = rt.store();
  auto data = store.acquire(tensor, TierKind::kGpu, stream, AccessMode::kWrite);
  if (!data.ok()) return data.status();
  absl::Status status;
  for (uint64_t offset = 0; offset < bytes && status.ok(); offset += pattern.size()) {
    status = rt.device().copy_async(static_cast<std::byte*>(*data) + offset, pattern.data(),
                                    std::min(pattern.size(), bytes - offset),
                                    CopyKind::kHostToDevice, stream);
  }
  absl::Status released = store.release(tensor, stream);
  if (status.ok()) status = released;
  if (status.ok()) status = rt.device().synchronize(stream);
  return status;
}

// Waits until `landed` grad_ready() calls in all have completed (the copies and the gradient
// statistics), so that the timed step() runs the step alone.
absl::Status wait_landed(const OffloadOptimizer& optimizer, uint64_t landed) {
  const absl::Time deadline = absl::Now() + kLandingTimeout;
  while (optimizer.stats().grads_landed < landed) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "the gradients did not land within %s (%d of %d); the device's copies are stuck",
          absl::FormatDuration(kLandingTimeout), optimizer.stats().grads_landed, landed));
    }
    absl::SleepFor(absl::Microseconds(50));
  }
  return absl::OkStatus();
}

// One Runtime and one OffloadOptimizer with states at `home`: a warm-up step, then --repeat
// timed steps. With `floor`, each timed step sits between a timed triad pass and a timed
// in-place pass, their order swapped every step, so that drift on a shared machine hits the
// floor and the step alike.
struct FloorSamples {
  TriadBuffers* buffers = nullptr;
  std::vector<double> triad_seconds;
  std::vector<double> in_place_seconds;
};

absl::StatusOr<OptimizerStepRun> run_steps(const OptimizerOptions& o, const Config& config,
                                           TierKind home, OptimizerReport& report,
                                           std::ostream& human, FloorSamples* floor) {
  const std::string home_name = home == TierKind::kCpu ? "cpu" : "nvme";
  auto runtime = Runtime::create(config);
  if (!runtime.ok()) return with_context(runtime.status(), "creating the runtime");
  Runtime& rt = **runtime;
  Device& device = rt.device();
  for (const std::string& warning : rt.warnings()) {
    report.notes.push_back(home_name + ": warning: " + warning);
  }
  if (home == TierKind::kCpu) {
    report.config = rt.config();
    report.device = device.description();
  } else if (rt.nvme() != nullptr) {
    const SwapStats swap = rt.nvme()->stats();
    report.nvme->engine = swap.engine;
    report.nvme->engine_reason = swap.engine_reason;
  }
  // Declared after the runtime: destroyed before it, the optimizer first.
  auto stream = device.create_stream();
  if (!stream.ok()) return stream.status();
  const uint64_t d = dtype_bytes(o.dtype);
  auto param_pattern = device.allocate_pinned(kFillElements * d, "optimizer parameter pattern");
  if (!param_pattern.ok()) return param_pattern.status();
  auto grad_pattern = device.allocate_pinned(kFillElements * d, "optimizer gradient pattern");
  if (!grad_pattern.ok()) return grad_pattern.status();
  fill_values(static_cast<std::byte*>((*param_pattern)->data()), kFillElements, o.dtype, 0.05F,
              /*seed=*/2);
  fill_values(static_cast<std::byte*>((*grad_pattern)->data()), kFillElements, o.dtype, 1e-2F,
              /*seed=*/1);

  OffloadOptimizerOptions options;
  options.state_home = home;
  options.defaults = workload_hyper();
  auto created = OffloadOptimizer::create(rt, options);
  if (!created.ok()) return with_context(created.status(), "creating the optimizer");
  OffloadOptimizer& optimizer = **created;

  human << absl::StrFormat("optimizer: states on %s: creating %d parameter tensors\n", home_name,
                           report.tensors);
  human.flush();
  std::vector<TensorHandle> params;
  std::vector<ParamId> ids;
  const std::vector<uint64_t> counts = tensor_counts(o.params);
  for (size_t t = 0; t < counts.size(); ++t) {
    const uint64_t bytes = counts[t] * d;
    auto param = rt.store().create(absl::StrFormat("bench.param.%d", t), bytes, TierKind::kGpu);
    if (!param.ok()) return with_context(param.status(), "creating the parameters");
    auto grad = rt.store().create(absl::StrFormat("bench.grad.%d", t), bytes, TierKind::kGpu);
    if (!grad.ok()) return with_context(grad.status(), "creating the gradients");
    if (auto status = write_tensor(rt, **stream, *param, bytes, **param_pattern); !status.ok()) {
      return with_context(status, "writing the parameters");
    }
    if (auto status = write_tensor(rt, **stream, *grad, bytes, **grad_pattern); !status.ok()) {
      return with_context(status, "writing the gradients");
    }
    ParamSpec spec;
    spec.name = absl::StrFormat("p%d", t);
    spec.param = *param;
    spec.grad = *grad;
    spec.param_type = param_type_of(o.dtype);
    spec.grad_type = grad_type_of(o.dtype);
    spec.count = counts[t];
    auto id = optimizer.add_param(spec);
    if (!id.ok()) return with_context(id.status(), "adding the parameters");
    params.push_back(*param);
    ids.push_back(*id);
  }

  struct Sample {
    double seconds = 0;
    OffloadOptimizerStats stats;
    uint64_t read = 0, written = 0;
  };
  std::vector<Sample> samples;
  FreshPieces fresh;
  human << absl::StrFormat("optimizer: states on %s: 1 warm-up step, %d timed\n", home_name,
                           o.repeat);
  human.flush();
  for (uint64_t s = 0; s <= o.repeat; ++s) {
    const OffloadOptimizerStats before = optimizer.stats();
    for (const ParamId& id : ids) {
      if (auto status = optimizer.grad_ready(id, **stream); !status.ok()) {
        return with_context(status, "grad_ready");
      }
    }
    if (auto status = wait_landed(optimizer, before.grads_landed + ids.size()); !status.ok()) {
      return with_context(status, "landing the gradients");
    }
    // Untimed: the CPU tier's io_uring registration queued so far does not run beside the
    // timed step or floor pass.
    rt.wait_for_registration();
    const bool triad_first = s % 2 == 1;
    const auto time_floor = [&](bool triad) {
      if (floor == nullptr || s == 0) return;
      const absl::Time start = absl::Now();
      if (triad) {
        floor->buffers->triad(0.5F);
      } else {
        floor->buffers->in_place(-1.0F);
      }
      (triad ? floor->triad_seconds : floor->in_place_seconds)
          .push_back(absl::ToDoubleSeconds(absl::Now() - start));
    };
    time_floor(triad_first);
    const PinCounters pins = pin_counters(rt);
    const absl::Time start = absl::Now();
    auto result = optimizer.step();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (s > 0) fresh.add(pins, pin_counters(rt));
    if (!result.ok()) return with_context(result.status(), "step");
    if (result->skipped) {
      return absl::InternalError(
          "optimizer: the step was skipped for an inf/nan gradient; the workload's gradients are "
          "finite, so this is a bug");
    }
    const OffloadOptimizerStats after = optimizer.stats();
    // Untimed: the updated parameters' copies to the GPU are done before the next step.
    for (const TensorHandle& param : params) {
      auto data = rt.store().acquire(param, TierKind::kGpu, **stream, AccessMode::kRead);
      if (!data.ok()) return with_context(data.status(), "reading the updated parameters");
      if (auto status = rt.store().release(param, **stream); !status.ok()) return status;
    }
    if (auto status = device.synchronize(**stream); !status.ok()) return status;
    rt.wait_for_registration();
    time_floor(!triad_first);
    if (s == 0) continue;  // the warm-up step
    samples.push_back(Sample{seconds, after, after.nvme_bytes_read - before.nvme_bytes_read,
                             after.nvme_bytes_written - before.nvme_bytes_written});
  }
  if (std::string note = fresh.note("optimizer, states on " + home_name, "timed step");
      !note.empty()) {
    report.notes.push_back(std::move(note));
  }
  OptimizerStepRun run;
  run.state_home = home_name;
  for (const Sample& sample : samples) run.all_step_seconds.push_back(sample.seconds);
  std::sort(samples.begin(), samples.end(),
            [](const Sample& a, const Sample& b) { return a.seconds < b.seconds; });
  const Sample& middle = samples[(samples.size() - 1) / 2];
  run.step_seconds = middle.seconds;
  run.stats = middle.stats;
  run.nvme_bytes_read = middle.read;
  run.nvme_bytes_written = middle.written;
  return run;
}

// The raw io_uring write and read rates over the NVMe directories, for the state's bytes,
// alternated (ABBA) so that drift hits both alike.
absl::Status measure_raw_nvme(const OptimizerOptions& o, const ResolvedConfig& config,
                              OptimizerNvme& nvme, std::vector<std::string>& notes,
                              std::ostream& human) {
  human << absl::StrFormat("optimizer: nvme baseline: raw io_uring write and read of %s over %s\n",
                           format_bytes(round_up(nvme.state_bytes)),
                           absl::StrJoin(nvme.paths, ","));
  human.flush();
  auto raw = RawIo::create({.dirs = nvme.paths,
                            .bytes = round_up(nvme.state_bytes),
                            .block = config.io_block,
                            .depth = config.io_depth});
  if (absl::IsUnavailable(raw.status())) {
    notes.push_back("nvme baseline: none: " + std::string(raw.status().message()));
    return absl::OkStatus();
  }
  if (!raw.ok()) return with_context(raw.status(), "nvme baseline");
  nvme.buffered_dirs = (*raw)->buffered_dirs();
  auto paired = measure_paired((*raw)->bytes(), o.repeat, [&] { return (*raw)->write_pass(); },
                               [&] { return (*raw)->read_pass(); });
  if (!paired.ok()) return with_context(paired.status(), "nvme baseline");
  nvme.write_bytes_per_second = paired->runtime.median * 1e9;
  nvme.read_bytes_per_second = paired->baseline.median * 1e9;
  notes.push_back(absl::StrFormat(
      "nvme baseline: fio-equivalent io_uring, O_DIRECT, bs=%s, iodepth=%d, one job per "
      "directory (%d), plain READ/WRITE on an O_TMPFILE file in the same directory%s",
      format_bytes(config.io_block), config.io_depth, nvme.paths.size(),
      nvme.buffered_dirs.empty()
          ? ""
          : "; O_DIRECT refused in " + absl::StrJoin(nvme.buffered_dirs, ",") +
                ": buffered there"));
  return absl::OkStatus();
}

int fail(const absl::Status& status) {
  std::cerr << "offload-bench: " << status.message() << "\n";
  return 1;
}

}  // namespace

std::vector<uint64_t> optimizer_tensor_counts(uint64_t params) { return tensor_counts(params); }

absl::StatusOr<OptimizerStepRun> run_single_rank_steps(const OptimizerOptions& o,
                                                       const Config& base, TierKind home,
                                                       const std::vector<std::string>& nvme_paths,
                                                       OptimizerReport& report,
                                                       std::ostream& human) {
  report.tensors = tensor_counts(o.params).size();
  if (home == TierKind::kNvme && !report.nvme.has_value()) report.nvme.emplace();
  return run_steps(o, sized_config(o, base, home, nvme_paths, report.tensors), home, report, human,
                   nullptr);
}

std::optional<std::string> parse_param_count(const std::string& text, uint64_t* out) {
  const std::string usage = "--params: '" + text +
                            "' is not a parameter count: use digits with an optional K, M or G "
                            "suffix (10^3, 10^6, 10^9), e.g. 1000000, 1M, 100M, 1G";
  std::string digits = text;
  uint64_t unit = 1;
  if (!digits.empty()) {
    switch (absl::ascii_toupper(digits.back())) {
      case 'K':
        unit = 1'000;
        break;
      case 'M':
        unit = 1'000'000;
        break;
      case 'G':
        unit = 1'000'000'000;
        break;
      default:
        break;
    }
    if (unit != 1) digits.pop_back();
  }
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return absl::ascii_isdigit(c); })) {
    return usage;
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(digits, &value) || value > kMaxParams / unit) {
    return "--params: '" + text + "' is more than the 1000G this workload accepts";
  }
  if (value == 0) return "--params: must be at least 1";
  *out = value * unit;
  return std::nullopt;
}

std::optional<std::string> validate(const OptimizerOptions& o) {
  if (o.params == 0) return "--params: must be at least 1";
  if (o.dtype != "fp16" && o.dtype != "bf16" && o.dtype != "fp32") {
    return "--dtype: must be fp16, bf16 or fp32";
  }
  if (o.repeat == 0) return "--repeat: must be at least 1";
  return std::nullopt;
}

uint64_t bytes_per_param(const std::string& dtype) {
  // Gradient read, master/m/v read and written (24), parameter copy written.
  return dtype_bytes(dtype) + 2 * kStateBytes + dtype_bytes(dtype);
}

double OptimizerNvme::overlapped_bound_seconds() const {
  if (read_bytes_per_second <= 0 || write_bytes_per_second <= 0) return 0;
  return std::max(static_cast<double>(state_bytes) / read_bytes_per_second,
                  static_cast<double>(state_bytes) / write_bytes_per_second);
}

double OptimizerNvme::bound_seconds() const {
  if (read_bytes_per_second <= 0 || write_bytes_per_second <= 0) return 0;
  return static_cast<double>(state_bytes) / read_bytes_per_second +
         static_cast<double>(state_bytes) / write_bytes_per_second;
}

int run_optimizer_workload(const OptimizerOptions& o, const std::string& json,
                           const cli::FlagSet& flags) {
  std::unique_ptr<FILE, int (*)(FILE*)> json_file(nullptr, &std::fclose);
  if (!json.empty() && json != "-") {
    json_file.reset(std::fopen(json.c_str(), "w"));
    if (json_file == nullptr) {
      return flags.usage_error("--json: cannot write '" + json + "': " + std::strerror(errno));
    }
  }
  auto base = Config::from_environment();
  if (!base.ok()) return fail(base.status());
  auto loaded = load_configuration(*base);
  if (!loaded.ok()) return fail(loaded.status());
  const ResolvedConfig& env = loaded->first;
  const MachineInfo& machine = loaded->second;
  const bool nvme = !env.nvme_paths.empty();
  const uint64_t needed =
      host_bytes_needed(o, env.backend == Backend::kHost, nvme, env.staging_bytes);
  const auto usable = static_cast<uint64_t>(static_cast<double>(machine.physical_memory_bytes) *
                                            kUsableMemoryFraction);
  if (needed > usable) {
    const uint64_t per_param = std::max<uint64_t>(1, needed / o.params);
    return flags.usage_error(absl::StrFormat(
        "--params=%d: the workload needs about %s of host memory at its peak (%d bytes per "
        "parameter: fp32 master, m and v, the floor's buffers of the same size, %s gradients and "
        "copies%s), more than 80%% of this machine's %s (%s); lower --params to about %dM or less",
        o.params, format_bytes(needed), per_param, o.dtype,
        env.backend == Backend::kHost ? ", the host backend's GPU arena" : "",
        format_bytes(machine.physical_memory_bytes), machine.physical_memory_source,
        usable / per_param / 1'000'000));
  }

  const bool json_to_stdout = json == "-";
  std::ostream& human = json_to_stdout ? std::cerr : std::cout;
  OptimizerReport report;
  report.options = o;
  report.isa = std::string(adam_isa());
  report.threads = TriadBuffers::threads();
  report.tensors = tensor_counts(o.params).size();
  human << "offload-bench " << STRATA_VERSION << " workload optimizer: " << o.params << " params, "
        << o.dtype << "\n";
  human.flush();
  {
    human << absl::StrFormat("optimizer: floor: triad a = b + s*c over 3 x %s, %d threads, %s\n",
                             format_bytes(o.params * 4), report.threads,
                             TriadBuffers::description());
    human.flush();
    auto triad = TriadBuffers::create(o.params);
    if (!triad.ok()) return fail(triad.status());
    triad->triad(0.5F);  // warm-up
    triad->in_place(-1.0F);
    measure_naive(o, *triad, report, human);
    FloorSamples floor;
    floor.buffers = &*triad;
    auto cpu = run_steps(o, sized_config(o, *base, TierKind::kCpu, {}, report.tensors),
                         TierKind::kCpu, report, human, &floor);
    if (!cpu.ok()) return fail(cpu.status());
    report.cpu = *std::move(cpu);
    const auto bytes = static_cast<double>(bytes_per_param(o.dtype) * o.params);
    report.triad_bytes = triad->bytes_per_pass();
    report.triad_bytes_per_second =
        static_cast<double>(report.triad_bytes) / median(floor.triad_seconds);
    report.floor_seconds = bytes / report.triad_bytes_per_second;
    report.in_place_bytes_per_second =
        static_cast<double>(triad->in_place_bytes_per_pass()) / median(floor.in_place_seconds);
    report.in_place_floor_seconds = bytes / report.in_place_bytes_per_second;
  }
  if (nvme) {
    report.nvme.emplace();
    report.nvme->paths = env.nvme_paths;
    report.nvme->state_bytes = kStateBytes * o.params;
    if (auto status = measure_raw_nvme(o, env, *report.nvme, report.notes, human); !status.ok()) {
      return fail(status);
    }
    auto run = run_steps(o, sized_config(o, *base, TierKind::kNvme, env.nvme_paths, report.tensors),
                         TierKind::kNvme, report, human, nullptr);
    if (!run.ok()) return fail(run.status());
    report.nvme->run = *std::move(run);
  }
  human << "offload-bench on " << report.device << "\n" << render(report.config);
  if (!json_to_stdout) print_optimizer(report, std::cout);
  if (json.empty()) return 0;

  auto device = make_device(report.config.backend, report.config.device);
  if (!device.ok()) return fail(device.status());
  Report paths;  // no path rows: this workload's results are under "optimizer"
  paths.engine = report.nvme.has_value() ? report.nvme->engine : "none";
  paths.engine_reason = report.nvme.has_value() ? report.nvme->engine_reason : "";
  paths.nvme_paths = report.nvme.has_value() ? report.nvme->paths : std::vector<std::string>();
  const std::string document =
      document_with(to_json(paths, report.config, **device), "optimizer", optimizer_json(report));
  if (json_to_stdout) {
    std::cout << document;
  } else if (std::fwrite(document.data(), 1, document.size(), json_file.get()) != document.size() ||
             std::fclose(json_file.release()) != 0) {
    std::cerr << "offload-bench: cannot write --json=" << json << ": " << std::strerror(errno)
              << "\n";
    return 1;
  }
  return 0;
}

}  // namespace strata::bench
