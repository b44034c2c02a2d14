// offload-bench: how fast does strata move tensors between its tiers on this machine, and how
// close is that to what the hardware does?
//
// Each path moves --bytes in --tensor-bytes tensors through the public TensorStore API (what a
// trainer gets; bench/swap/store_paths.h) and, in the same run with the same byte count, through a
// raw baseline: cudaMemcpyAsync (memcpy on the host backend; bench/swap/gpu_paths.cc) for cpu-gpu
// and gpu-cpu, the equivalent of fio's io_uring engine (bench/raw_io.cc) for cpu-nvme and nvme-cpu,
// and the lower of the two for gpu-nvme and nvme-gpu. --tensor-bytes takes a list (a sweep);
// --csv and --svg write the rows as CSV and as a plot (bench/swap/plot.cc); --tune sweeps the I/O
// settings (bench/swap/tune.cc). All of that runs in bench/swap/swap_workload.cc; this file parses
// the flags and hands each workload its options.
// --workload=train-step runs a synthetic training step through the TensorStore instead and
// compares prefetch + Belady, prefetch + LRU and on-demand against the overlap bound
// (bench/train_step/train_step.cc, docs/train-step.md).
// --workload=optimizer times OffloadOptimizer::step() for --params parameters against the
// memory-bandwidth floor, a naive scalar loop and, with STRATA_NVME_PATHS, the NVMe bound
// (bench/optimizer/optimizer_workload.cc, docs/bench.md). Under strata-run -n N (or with
// --zero-stage) it times the ZeRO-DP partitioned step (ZeroEngine) per rank against the single-rank
// step / N instead (bench/optimizer/optimizer_ranks.cc).
// --workload=collective, under strata-run -n N (or alone), times strata's collectives
// (all_gather, reduce_scatter, all_reduce, broadcast) per --tensor-bytes size against Gloo called
// directly in the same run (bench/collective/collective_workload.cc, docs/bench.md).
// --workload=zero, under strata-run -n N (or alone), times a ZeRO-DP stage 3 training step
// (ZeroEngine: parameters partitioned, gathered by the recorded order) over --layers synthetic
// layers with real host compute, against its overlap bound measured in the same run
// (bench/zero/zero_workload.cc, docs/bench.md).
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/collective/collective_workload.h"
#include "bench/common.h"
#include "bench/nvme_dirs.h"
#include "bench/optimizer/optimizer_ranks.h"
#include "bench/optimizer/optimizer_workload.h"
#include "bench/report.h"
#include "bench/swap/swap_workload.h"
#include "bench/train_step/overlap_step.h"
#include "bench/train_step/train_step.h"
#include "bench/zero/zero_workload.h"
#include "cli.h"
#include "strata/base/size.h"
#include "strata/config/config.h"

namespace strata::bench {
namespace {

std::string all_paths_text() {
  // Appended piece by piece: `text += sep + std::string(path)` made GCC 12 at -O3 report a false
  // -Werror=restrict inside std::string's operator+ (a Release build failed). Debian's Abseil has
  // its own string_view, which StrJoin's default formatter does not take.
  std::string text;
  for (std::string_view path : kAllPaths) {
    if (!text.empty()) text.push_back(',');
    text.append(path.data(), path.size());
  }
  return text;
}

// --paths=LIST: known names only, each once, run in kAllPaths order.
std::optional<std::string> parse_paths(const std::string& text, std::vector<std::string>* out) {
  std::vector<std::string> asked;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::string name(absl::StripAsciiWhitespace(item));
    if (std::find(std::begin(kAllPaths), std::end(kAllPaths), name) == std::end(kAllPaths)) {
      return "--paths: '" + name + "' is not a path; valid paths: " + all_paths_text();
    }
    asked.push_back(name);
  }
  out->clear();
  for (std::string_view path : kAllPaths) {
    if (std::find(asked.begin(), asked.end(), path) != asked.end()) out->emplace_back(path);
  }
  return std::nullopt;
}

bool write_file(const std::string& path, const std::string& text) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "w"), &std::fclose);
  return file != nullptr && std::fwrite(text.data(), 1, text.size(), file.get()) == text.size() &&
         std::fclose(file.release()) == 0;
}

int fail(const absl::Status& status) {
  return cli::print_error("offload-bench", std::string(status.message()));
}

int run_train_step_workload(const TrainStepOptions& options, const OverlapStepOptions& overlap,
                            const std::string& json) {
  auto config = Config::from_environment();
  if (!config.ok()) return fail(config.status());
  std::optional<NvmeDirs> dirs;
  if (options.home == "nvme") {
    auto chosen = NvmeDirs::choose(config->nvme_paths);
    if (!chosen.ok()) return fail(chosen.status());
    dirs.emplace(*std::move(chosen));
  }
  const bool json_to_stdout = json == "-";
  std::ostream& human = json_to_stdout ? std::cerr : std::cout;
  human << "offload-bench " << STRATA_VERSION << " workload train-step"
        << (dirs.has_value() ? "; nvme: directories " + dirs->describe() : std::string()) << "\n";
  human.flush();
  auto report = run_train_step(
      options, *config, dirs.has_value() ? dirs->paths() : std::vector<std::string>(), human);
  if (!report.ok()) return fail(report.status());
  human << "offload-bench on " << report->device << "\n" << render(report->config);
  if (!json_to_stdout) print_train_step(*report, std::cout);
  std::optional<OverlapStepReport> overlapped;
  if (overlap.mode != "none") {
    auto run =
        run_overlap_step(options, overlap, *config,
                         dirs.has_value() ? dirs->paths() : std::vector<std::string>(), human);
    if (!run.ok()) return fail(run.status());
    overlapped = *std::move(run);
    if (!json_to_stdout) print_overlap_step(*overlapped, std::cout);
  }
  if (json.empty()) return 0;
  // The document's "device" is the device the runs used (a throttled HostDevice on host).
  auto device = make_train_step_device(options, report->config);
  if (!device.ok()) return fail(device.status());
  Report paths;  // no path rows: this workload's results are under "train_step"
  paths.engine = report->engine;
  paths.engine_reason = report->engine_reason;
  paths.nvme_paths = report->config.nvme_paths;
  Json document = to_json(paths, report->config, **device);
  document["train_step"] = train_step_json(*report);
  const std::string text =
      document_with(std::move(document), "overlap_step",
                    overlapped.has_value() ? overlap_step_json(*overlapped) : Json());
  if (json_to_stdout) {
    std::cout << text;
  } else if (!write_file(json, text)) {
    return cli::print_error("offload-bench",
                            "cannot write --json=" + json + ": " + std::strerror(errno));
  }
  return 0;
}

// --tensor-bytes=SIZE[,SIZE...]: every size through parse_size, none zero, each once.
std::optional<std::string> parse_tensor_sizes(const std::string& text, std::vector<uint64_t>* out) {
  out->clear();
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::string size_text(absl::StripAsciiWhitespace(item));
    auto size = parse_size(size_text);
    if (!size.ok()) {
      return "--tensor-bytes: '" + size_text + "': " + std::string(size.status().message());
    }
    if (*size == 0) return "--tensor-bytes: '" + size_text + "': must be at least 1";
    if (std::find(out->begin(), out->end(), *size) != out->end()) {
      return "--tensor-bytes: '" + size_text + "' is listed twice";
    }
    out->push_back(*size);
  }
  return std::nullopt;
}

int run(int argc, const char* const* argv) {
  Options options;
  cli::FlagSet flags(
      "offload-bench",
      "Measures strata's tier-to-tier bandwidth through the TensorStore (what a trainer gets) "
      "against a raw baseline measured in the same run.\nThe tiers are configured from STRATA_* "
      "variables; their sizes are set to fit --bytes. The NVMe paths use STRATA_NVME_PATHS, or "
      "a temporary directory under $TMPDIR (or /tmp), removed afterwards, when it is unset. On "
      "the host backend the GPU paths are host-simulated.\n"
      "--workload=train-step instead times a synthetic training step (forward and backward over "
      "--layers layers) with prefetch + Belady, prefetch + LRU and on-demand, against "
      "max(compute, bytes / measured link bandwidth).\n"
      "--workload=optimizer times the CPU optimizer step (OffloadOptimizer::step()) for --params "
      "parameters against the memory-bandwidth floor measured in the same run, a naive scalar "
      "loop and, when STRATA_NVME_PATHS is set, states on NVMe against the raw NVMe bound. Under "
      "strata-run -n N (or with --zero-stage) it times the ZeRO-DP partitioned step per rank "
      "against the single-rank step / N instead.\n"
      "--workload=collective, run under strata-run -n N (or alone), times strata's all_gather, "
      "reduce_scatter, all_reduce and broadcast for each --tensor-bytes size (default 64KiB to "
      "64MiB; --bytes per sample, default 64MiB) against Gloo called directly, alternated in "
      "the same run.\n"
      "--workload=zero, run under strata-run -n N (or alone), times a ZeRO-DP stage 3 step "
      "(forward and backward over --layers layers of --layer-bytes, --layer-compute of host "
      "compute per layer, shards in --param-home) against max(compute, gathers and "
      "reduce-scatters timed through the Communicator directly, the shard read) + optimizer, and "
      "reports the exposed communication.");
  cli::Flag& bytes_flag = flags.add_size(
      "bytes", &options.bytes, "bytes moved per path, tensor size and repetition (--tune: 64MiB)");
  std::string tensor_text = "64MiB";
  cli::Flag& tensor_flag = flags.add_string(
      "tensor-bytes", &tensor_text,
      "bytes per tensor; a comma-separated list is a sweep: every path runs for each size "
      "(--tune: 16MiB)");
  cli::Flag& repeat_flag =
      flags.add_uint64("repeat", &options.repeat, "timed repetitions (after one warm-up)");
  bool no_baseline = false;
  cli::Flag& baseline_flag = flags.add_bool("no-baseline", &no_baseline, "skip the raw baselines");
  flags.add_string("json", &options.json, "also write JSON results to FILE, or - for stdout");
  cli::Flag& csv_flag =
      flags.add_string("csv", &options.csv, "also write the rows as CSV to FILE, or - for stdout");
  cli::Flag& svg_flag = flags.add_string(
      "svg", &options.svg, "also write a plot (SVG) of GB/s against tensor size per path to FILE");
  std::string paths_text = all_paths_text();
  cli::Flag& paths_flag = flags.add_string("paths", &paths_text,
                                           "comma-separated paths to measure: " + all_paths_text());
  bool tune = false;
  cli::Flag& tune_flag = flags.add_bool(
      "tune", &tune,
      "sweep STRATA_IO_BLOCK (256KiB,1MiB,4MiB) x STRATA_IO_DEPTH (4,16,32,64) x "
      "STRATA_IO_ENGINE (io_uring,psync) on cpu-nvme and nvme-cpu and print the export line "
      "for the least pinned memory within 3% of the best");
  std::string workload = "swap";
  flags.add_enum(
      "workload", &workload, {"swap", "paths", "train-step", "optimizer", "collective", "zero"},
      "swap: tier-to-tier bandwidth per path (paths: the same, its old name); "
      "train-step: a synthetic training step against its overlap bound "
      "(docs/train-step.md); optimizer: the CPU optimizer step against the "
      "memory-bandwidth floor (docs/bench.md); collective: strata's collectives "
      "against Gloo called directly, under strata-run -n N (docs/bench.md); zero: a ZeRO-DP "
      "stage 3 step against its overlap bound, under strata-run -n N (docs/bench.md)");
  TrainStepOptions train;
  std::string policies_text = absl::StrJoin(train.policies, ",");
  // Shared by --workload=train-step and zero (which has its own defaults).
  cli::Flag& layers_flag =
      flags.add_uint64("layers", &train.layers,
                       "train-step: layers (a weight, an activation and a gradient each); zero: "
                       "layers (one fp16 parameter each), default 8");
  cli::Flag& layer_bytes_flag =
      flags.add_size("layer-bytes", &train.layer_bytes,
                     "train-step: bytes of each layer's weight and of its gradient; zero: fp16 "
                     "parameter bytes of each layer, default 1MiB (a multiple of 4KiB)");
  cli::Flag& steps_flag =
      flags.add_uint64("steps", &train.steps,
                       "train-step: measured steps per policy, after one warm-up step; zero: "
                       "measured steps, after one warm-up step, default 5");
  // Only meaningful with --workload=train-step (the first three with zero too); checked below.
  std::vector<cli::Flag*> train_flags = {&layers_flag, &layer_bytes_flag, &steps_flag};
  for (cli::Flag* flag : add_train_step_flags(flags, &train, &policies_text)) {
    train_flags.push_back(flag);
  }
  OverlapStepOptions overlap;
  cli::Flag& overlap_flag = flags.add_enum(
      "overlap-step", &overlap.mode, {"off", "on", "both", "none"},
      "train-step: the optimizer time exposed after backward through an OffloadOptimizer, "
      "without overlap (off), with it and forced rollbacks (on), both, or none "
      "(bench/train_step/overlap_step.h); zero: the engine's optimizer with overlap (on) or "
      "without (off, "
      "the default there)");
  train_flags.push_back(&overlap_flag);
  train_flags.push_back(&flags.add_uint64(
      "overlap-inf-every", &overlap.inf_every,
      "train-step: --overlap-step's on-inf configuration injects an inf every this many steps"));
  OptimizerOptions optimizer;
  std::string params_text = "32M";  // OptimizerOptions::params
  uint64_t zero_stage = 0;          // not given
  cli::Flag& zero_stage_flag = flags.add_uint64(
      "zero-stage", &zero_stage,
      "optimizer: time the ZeRO-DP partitioned step (ZeroEngine) at this stage, 1 (optimizer "
      "states) or 2 (gradients too), against the single-rank step / ranks; the default under "
      "strata-run -n N with N > 1 is 2. zero: 3, the only stage it times");
  // Only meaningful with --workload=optimizer; checked below.
  const std::vector<cli::Flag*> optimizer_flags = {
      &flags.add_string("params", &params_text,
                        "optimizer: parameters, digits with an optional K, M or G suffix (10^3, "
                        "10^6, 10^9): 100M, 1G"),
      &flags.add_enum("dtype", &optimizer.dtype, {"fp16", "bf16", "fp32"},
                      "optimizer: dtype of the gradients and the parameter copies (fp32 master "
                      "weights and moments either way)"),
      &zero_stage_flag,
  };
  Zero3FlagText zero3_text;
  const std::vector<cli::Flag*> zero3_flags = add_zero3_flags(flags, &zero3_text);
  std::vector<std::string> positional;
  if (auto exit_code = flags.parse_or_exit(argc, argv, &positional)) return *exit_code;
  if (!positional.empty()) return flags.usage_error("unexpected argument '" + positional[0] + "'");
  if (workload != "optimizer") {
    for (const cli::Flag* flag : optimizer_flags) {
      if (flag->was_set() && !(workload == "zero" && flag == &zero_stage_flag)) {
        return flags.usage_error("--" + flag->name() + " applies to --workload=optimizer only");
      }
    }
  }
  if (workload != "zero") {
    for (const cli::Flag* flag : zero3_flags) {
      if (flag->was_set()) {
        return flags.usage_error("--" + flag->name() + " applies to --workload=zero only");
      }
    }
  }
  if (workload == "zero") {
    const std::vector<cli::Flag*> other_flags = {&bytes_flag,    &tensor_flag, &repeat_flag,
                                                 &baseline_flag, &paths_flag,  &csv_flag,
                                                 &svg_flag,      &tune_flag};
    for (const cli::Flag* flag : other_flags) {
      if (flag->was_set()) {
        return flags.usage_error("--" + flag->name() + " applies to --workload=swap, not zero");
      }
    }
    for (const cli::Flag* flag : train_flags) {
      if (flag->was_set() && flag != &layers_flag && flag != &layer_bytes_flag &&
          flag != &steps_flag && flag != &overlap_flag) {
        return flags.usage_error("--" + flag->name() + " applies to --workload=train-step only");
      }
    }
    Zero3Options zero;
    if (layers_flag.was_set()) zero.layers = train.layers;
    if (layer_bytes_flag.was_set()) zero.layer_bytes = train.layer_bytes;
    if (steps_flag.was_set()) zero.steps = train.steps;
    if (overlap_flag.was_set()) {
      if (overlap.mode != "off" && overlap.mode != "on") {
        return flags.usage_error(
            "--overlap-step: --workload=zero runs one configuration: off or "
            "on, not '" +
            overlap.mode + "' (compare two runs)");
      }
      zero.overlap = overlap.mode == "on";
    }
    if (zero_stage_flag.was_set()) {
      if (auto error = parse_zero3_stage(zero_stage)) return flags.usage_error(*error);
    }
    if (auto error = parse_zero3_flags(zero3_text, &zero)) return flags.usage_error(*error);
    zero.json = options.json;
    if (auto error = validate(zero)) return flags.usage_error(*error);
    return run_zero_workload(zero, flags);
  }
  if (workload == "collective") {
    const std::vector<cli::Flag*> other_flags = {&baseline_flag, &paths_flag, &csv_flag, &svg_flag,
                                                 &tune_flag};
    for (const cli::Flag* flag : other_flags) {
      if (flag->was_set()) {
        return flags.usage_error("--" + flag->name() +
                                 " applies to --workload=swap, not collective");
      }
    }
    for (const cli::Flag* flag : train_flags) {
      if (flag->was_set()) {
        return flags.usage_error("--" + flag->name() + " applies to --workload=train-step only");
      }
    }
    CollectiveBenchOptions collective;
    if (bytes_flag.was_set()) collective.bytes = options.bytes;
    if (repeat_flag.was_set()) collective.repeat = options.repeat;
    collective.sizes = default_collective_sizes();
    if (tensor_flag.was_set()) {
      if (auto error = parse_tensor_sizes(tensor_text, &collective.sizes)) {
        return flags.usage_error(*error);
      }
    }
    collective.json = options.json;
    if (auto error = validate(collective)) return flags.usage_error(*error);
    return run_collective_workload(collective, flags);
  }
  if (workload == "optimizer") {
    const std::vector<cli::Flag*> other_flags = {
        &bytes_flag, &tensor_flag, &baseline_flag, &paths_flag, &csv_flag, &svg_flag, &tune_flag};
    for (const cli::Flag* flag : other_flags) {
      if (flag->was_set()) {
        return flags.usage_error("--" + flag->name() +
                                 " applies to --workload=swap, not optimizer");
      }
    }
    for (const cli::Flag* flag : train_flags) {
      if (flag->was_set()) {
        return flags.usage_error("--" + flag->name() + " applies to --workload=train-step only");
      }
    }
    if (auto error = parse_param_count(params_text, &optimizer.params)) {
      return flags.usage_error(*error);
    }
    optimizer.repeat = options.repeat;
    if (auto error = validate(optimizer)) return flags.usage_error(*error);
    const bool zero_given = optimizer_flags.back()->was_set();
    if (zero_workload_wanted(zero_given)) {
      ZeroBenchOptions zero{.optimizer = optimizer, .json = options.json};
      if (zero_given) {
        if (auto error = parse_zero_stage(zero_stage, &zero.stage)) {
          return flags.usage_error(*error);
        }
      }
      return run_optimizer_ranks_workload(zero, flags);
    }
    return run_optimizer_workload(optimizer, options.json, flags);
  }
  if (workload == "train-step") {
    const std::vector<cli::Flag*> path_flags = {&bytes_flag,    &tensor_flag, &repeat_flag,
                                                &baseline_flag, &paths_flag,  &csv_flag,
                                                &svg_flag,      &tune_flag};
    for (const cli::Flag* path_flag : path_flags) {
      if (path_flag->was_set()) {
        return flags.usage_error("--" + path_flag->name() +
                                 " applies to --workload=swap, not train-step");
      }
    }
    train.policies = absl::StrSplit(policies_text, ',');
    if (auto error = validate(train)) return flags.usage_error(*error);
    if (auto error = validate(overlap)) return flags.usage_error(*error);
    return run_train_step_workload(train, overlap, options.json);
  }
  for (const cli::Flag* flag : train_flags) {
    if (flag->was_set()) {
      return flags.usage_error("--" + flag->name() + " applies to --workload=train-step only");
    }
  }
  if (options.repeat == 0) return flags.usage_error("--repeat: must be at least 1");
  if (options.bytes == 0) return flags.usage_error("--bytes: must be at least 1");
  if (auto error = parse_paths(paths_text, &options.paths)) return flags.usage_error(*error);
  if (auto error = parse_tensor_sizes(tensor_text, &options.tensor_sizes)) {
    return flags.usage_error(*error);
  }
  if (tune) {
    for (const cli::Flag* flag : {&paths_flag, &csv_flag, &svg_flag, &baseline_flag}) {
      if (flag->was_set())
        return flags.usage_error("--" + flag->name() + " does not apply to --tune");
    }
    if (options.tensor_sizes.size() > 1) {
      return flags.usage_error("--tune takes one --tensor-bytes size, not a list");
    }
    if (!bytes_flag.was_set()) options.bytes = uint64_t{64} << 20;
    if (!tensor_flag.was_set()) options.tensor_sizes = {uint64_t{16} << 20};
    options.paths = {std::string(kCpuNvme), std::string(kNvmeCpu)};
  }
  options.baseline = !no_baseline;
  return run_swap_workload(std::move(options), tune, flags);
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
