// offload-bench: how fast does strata move tensors between its tiers on this machine, and how
// close is that to what the hardware does?
//
// Each path moves --bytes in --tensor-bytes tensors through the runtime and, in the same run with
// the same byte count, through a raw baseline (tools/bench/):
//   cpu-gpu, gpu-cpu    pinned CPU tier <-> GPU arena (MemoryTier blocks, one stream) against
//                       cudaMemcpyAsync, or memcpy on the host backend (gpu_paths.cc)
//   cpu-nvme, nvme-cpu  pinned CPU tier <-> SwapSpace extents (checksums included) against the
//                       equivalent of fio's io_uring engine on a file in the same directories
//                       (nvme_paths.cc, raw_io.cc)
// --workload=train-step runs a synthetic training step through the TensorStore instead and
// compares prefetch + Belady, prefetch + LRU and on-demand against the overlap bound
// (bench/train_step.cc, docs/train-step.md).
// Sweeps, --tune and plots come with the bench issue.
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

#include "bench/common.h"
#include "bench/gpu_paths.h"
#include "bench/nvme_dirs.h"
#include "bench/nvme_paths.h"
#include "bench/report.h"
#include "bench/train_step.h"
#include "cli.h"
#include "strata/backend.h"
#include "strata/config.h"
#include "strata/size.h"
#include "strata/tier.h"

namespace strata::bench {
namespace {

std::string all_paths_text() {
  // Debian's Abseil has its own string_view, which StrJoin's default formatter does not take.
  std::string text;
  for (std::string_view path : kAllPaths) text += (text.empty() ? "" : ",") + std::string(path);
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
  std::cerr << "offload-bench: " << status.message() << "\n";
  return 1;
}

// to_json's document is one object; the workload's results become its last key.
std::string with_train_step(std::string document, const std::string& train_step) {
  document.pop_back();  // the closing brace
  return document + ", \"train_step\": " + train_step + "}";
}

int run_train_step_workload(const TrainStepOptions& options, const std::string& json) {
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
  if (json.empty()) return 0;
  // The document's "device" is the device the runs used (a throttled HostDevice on host).
  auto device = make_train_step_device(options, report->config);
  if (!device.ok()) return fail(device.status());
  Report paths;  // no path rows: this workload's results are under "train_step"
  paths.engine = report->engine;
  paths.engine_reason = report->engine_reason;
  paths.nvme_paths = report->config.nvme_paths;
  const std::string document =
      with_train_step(to_json(paths, report->config, **device), train_step_json(*report)) + "\n";
  if (json_to_stdout) {
    std::cout << document;
  } else if (!write_file(json, document)) {
    std::cerr << "offload-bench: cannot write --json=" << json << ": " << std::strerror(errno)
              << "\n";
    return 1;
  }
  return 0;
}

int run(int argc, const char* const* argv) {
  Options options;
  cli::FlagSet flags("offload-bench",
                     "Measures strata's tier-to-tier bandwidth against a raw baseline measured "
                     "in the same run.\nThe tiers are configured from STRATA_* variables; their "
                     "sizes are set to fit --bytes. The NVMe paths use STRATA_NVME_PATHS, or a "
                     "temporary directory under $TMPDIR (or /tmp) when it is unset.\n"
                     "--workload=train-step instead times a synthetic training step (forward "
                     "and backward over --layers layers) with prefetch + Belady, prefetch + LRU "
                     "and on-demand, against max(compute, bytes / measured link bandwidth).");
  cli::Flag& bytes_flag =
      flags.add_size("bytes", &options.bytes, "bytes moved per path and repetition");
  cli::Flag& tensor_flag =
      flags.add_size("tensor-bytes", &options.tensor_bytes, "bytes per copy (one tensor)");
  cli::Flag& repeat_flag =
      flags.add_uint64("repeat", &options.repeat, "timed repetitions (after one warm-up)");
  bool no_baseline = false;
  cli::Flag& baseline_flag = flags.add_bool("no-baseline", &no_baseline, "skip the raw baseline");
  flags.add_string("json", &options.json, "also write JSON results to FILE, or - for stdout");
  std::string paths_text = all_paths_text();
  cli::Flag& paths_flag = flags.add_string("paths", &paths_text,
                                           "comma-separated paths to measure: " + all_paths_text());
  std::string workload = "paths";
  flags.add_enum("workload", &workload, {"paths", "train-step"},
                 "paths: tier-to-tier bandwidth per path; train-step: a synthetic training step "
                 "against its overlap bound (docs/train-step.md)");
  TrainStepOptions train;
  // Only meaningful with --workload=train-step; checked below.
  const std::vector<cli::Flag*> train_flags = {
      &flags.add_uint64("layers", &train.layers, "train-step: layers (one parameter tensor each)"),
      &flags.add_size("layer-bytes", &train.layer_bytes,
                      "train-step: bytes per layer (a multiple of 4KiB)"),
      &flags.add_double("compute-ms", &train.compute_ms,
                        "train-step: simulated compute per layer and pass, in milliseconds"),
      &flags.add_uint64("arena-layers", &train.arena_layers,
                        "train-step: layers the GPU arena holds"),
      &flags.add_enum("home", &train.home, {"nvme", "cpu"},
                      "train-step: the layers' home tier (nvme uses STRATA_NVME_PATHS or a "
                      "temporary directory, as the NVMe paths do)"),
      &flags.add_double("link-gbps", &train.link_gbps,
                        "train-step: HostDevice H2D/D2H throttle in GB/s, PCIe Gen4 x16-like by "
                        "default; 0 = unthrottled; ignored on CUDA"),
      &flags.add_uint64("steps", &train.steps,
                        "train-step: measured steps per policy, after one warm-up step"),
      &flags.add_bool("sync-each-layer", &train.sync_each_layer,
                      "train-step: the host waits for each layer's compute before the next "
                      "acquire (no run-ahead: only prefetching hides transfers)"),
  };
  std::vector<std::string> positional;
  if (auto exit_code = flags.parse_or_exit(argc, argv, &positional)) return *exit_code;
  if (!positional.empty()) return flags.usage_error("unexpected argument '" + positional[0] + "'");
  if (workload == "train-step") {
    const std::vector<cli::Flag*> path_flags = {&bytes_flag, &tensor_flag, &repeat_flag,
                                                &baseline_flag, &paths_flag};
    for (const cli::Flag* path_flag : path_flags) {
      if (path_flag->was_set()) {
        return flags.usage_error("--" + path_flag->name() +
                                 " applies to --workload=paths, not train-step");
      }
    }
    if (auto error = validate(train)) return flags.usage_error(*error);
    return run_train_step_workload(train, options.json);
  }
  for (const cli::Flag* flag : train_flags) {
    if (flag->was_set()) {
      return flags.usage_error("--" + flag->name() + " applies to --workload=train-step only");
    }
  }
  if (options.repeat == 0) return flags.usage_error("--repeat: must be at least 1");
  if (options.bytes == 0) return flags.usage_error("--bytes: must be at least 1");
  if (options.tensor_bytes == 0) return flags.usage_error("--tensor-bytes: must be at least 1");
  if (auto error = parse_paths(paths_text, &options.paths)) return flags.usage_error(*error);
  if (options.tensor_bytes > options.bytes) options.tensor_bytes = options.bytes;
  options.baseline = !no_baseline;
  const bool gpu_paths = options.wants(kCpuGpu) || options.wants(kGpuCpu);
  const bool nvme_paths = options.wants(kCpuNvme) || options.wants(kNvmeCpu);
  if (nvme_paths && options.bytes % kPage != 0) {
    return flags.usage_error("--bytes: the NVMe paths need a multiple of 4KiB (O_DIRECT), not " +
                             std::to_string(options.bytes));
  }

  auto config = Config::from_environment();
  if (!config.ok()) return fail(config.status());
  std::optional<NvmeDirs> dirs;
  if (nvme_paths) {
    auto chosen = NvmeDirs::choose(config->nvme_paths);
    if (!chosen.ok()) return fail(chosen.status());
    dirs.emplace(*std::move(chosen));
    config->nvme_paths = dirs->paths();
    config->nvme_bytes = SizeSetting::of_bytes(
        nvme_bytes_per_path(options, config->io_block, config->nvme_paths.size()));
  } else {
    config->nvme_paths.clear();
  }
  // The bench sizes the tiers to what it moves, not to the trainer defaults: a source and a
  // landing block in the pinned CPU tier, one block in the GPU arena.
  const uint64_t cpu_block =
      std::max(round_up(options.bytes), nvme_paths ? nvme_cpu_block_bytes(options) : 0);
  config->cpu_bytes = SizeSetting::of_bytes(2 * cpu_block + 2 * kPage);
  config->gpu_bytes =
      SizeSetting::of_bytes(gpu_paths ? gpu_tier_bytes(options.bytes) + (1 << 20) : 2 << 20);
  auto loaded = load_configuration(*config);
  if (!loaded.ok()) return fail(loaded.status());
  const ResolvedConfig& resolved = loaded->first;
  auto device = make_device(resolved.backend, resolved.device);
  if (!device.ok()) return fail(device.status());
  const bool json_to_stdout = options.json == "-";
  std::ostream& human = json_to_stdout ? std::cerr : std::cout;
  human << "offload-bench " << STRATA_VERSION << " on " << (*device)->description() << "\n"
        << render(resolved) << "paths: " << absl::StrJoin(options.paths, ",") << "\n";
  human.flush();

  auto cpu = MemoryTier::create_pinned_cpu(**device, resolved.cpu_bytes);
  if (!cpu.ok()) return fail(cpu.status());
  // Held (pinned) for the whole run, as a trainer holds acquired tensors.
  auto source = (*cpu)->allocate(cpu_block);
  auto landing = (*cpu)->allocate(cpu_block);
  for (const auto* block : {&source, &landing}) {
    if (!block->ok()) return fail(block->status());
    if (absl::Status status = (*cpu)->pin(**block); !status.ok()) return fail(status);
  }
  auto* src = static_cast<std::byte*>(*(*cpu)->address(*source));
  auto* dst = static_cast<std::byte*>(*(*cpu)->address(*landing));
  fill_pattern(src, cpu_block, /*seed=*/42);

  Report report;
  report.engine = std::string(to_string(resolved.io_engine));
  report.engine_reason = resolved.io_engine_reason;
  if (gpu_paths) {
    auto rows = run_gpu_paths(options, **device, src, dst);
    if (!rows.ok()) return fail(rows.status());
    report.rows = *std::move(rows);
  }
  if (nvme_paths) {
    auto nvme = run_nvme_paths(options, resolved, dirs->describe(), **cpu, src, dst, human);
    if (!nvme.ok()) return fail(nvme.status());
    report.rows.insert(report.rows.end(), nvme->rows.begin(), nvme->rows.end());
    report.engine = nvme->stats.engine;
    report.engine_reason = nvme->stats.engine_reason;
    report.nvme_paths = resolved.nvme_paths;
    report.notes = std::move(nvme->notes);
    report.notes.push_back("nvme: directories " + dirs->describe());
  }

  if (!json_to_stdout) print_table(report, **device, std::cout);
  if (!options.json.empty()) {
    const std::string json = to_json(report, resolved, **device) + "\n";
    if (json_to_stdout) {
      std::cout << json;
    } else if (!write_file(options.json, json)) {
      std::cerr << "offload-bench: cannot write --json=" << options.json << ": "
                << std::strerror(errno) << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) { return strata::bench::run(argc, argv); }
