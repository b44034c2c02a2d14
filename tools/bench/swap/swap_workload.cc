#include "bench/swap/swap_workload.h"

#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bench/nvme_dirs.h"
#include "bench/report.h"
#include "bench/swap/gpu_paths.h"
#include "bench/swap/plot.h"
#include "bench/swap/store_paths.h"
#include "bench/swap/tune.h"
#include "strata/base/format_bytes.h"
#include "strata/base/size.h"
#include "strata/config/config.h"
#include "strata/device/backend.h"
#include "strata/runtime/runtime.h"

namespace strata::bench {
namespace {

int fail(const absl::Status& status) {
  return cli::print_error("offload-bench", std::string(status.message()));
}

// One line: what creating a runtime with the environment's CPU and GPU tiers costs (what a
// trainer gets, not the tiers each pass sizes for itself), the background io_uring registration
// included. The swap files take the passes' size: their fallocate is not what is measured here.
std::string startup_line(Config config, const SizeSetting& nvme_bytes) {
  config.nvme_bytes = nvme_bytes;
  auto runtime = Runtime::create(config);
  if (!runtime.ok()) {
    return "runtime start-up: not measured: " + std::string(runtime.status().message());
  }
  (*runtime)->wait_for_registration();
  return "runtime start-up (the environment's CPU and GPU tiers): " +
         absl::StrJoin(absl::StrSplit(to_string((*runtime)->startup()), '\n', absl::SkipEmpty()),
                       "; ");
}

using File = std::unique_ptr<FILE, int (*)(FILE*)>;

// An output flag's destination, opened before anything runs so that a bad path fails at once
// rather than after minutes of measuring. Null for "" (not asked) and "-" (stdout).
std::optional<std::string> open_output(const std::string& flag, const std::string& path,
                                       File* file) {
  if (path.empty() || path == "-") return std::nullopt;
  file->reset(std::fopen(path.c_str(), "w"));
  if (*file == nullptr) {
    return "--" + flag + ": cannot write '" + path + "': " + std::strerror(errno);
  }
  return std::nullopt;
}

bool finish_output(File& file, const std::string& text) {
  return std::fwrite(text.data(), 1, text.size(), file.get()) == text.size() &&
         std::fclose(file.release()) == 0;
}

// A one-line progress bar on stderr, only for a person watching: not when stderr is piped or
// redirected (logs, tests) or under CI.
class Progress {
 public:
  Progress() : enabled_(isatty(STDERR_FILENO) == 1 && std::getenv("CI") == nullptr) {}
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void show(size_t done, size_t total, const std::string& label) {
    if (!enabled_ || total == 0) return;
    constexpr size_t kWidth = 30;
    const size_t filled = done * kWidth / total;
    std::cerr << "\r[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
              << done << "/" << total << " " << label << "\x1b[K" << std::flush;
    shown_ = true;
  }
  void clear() {
    if (shown_) std::cerr << "\r\x1b[K" << std::flush;
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
};

}  // namespace

int run_swap_workload(Options options, bool tune, const cli::FlagSet& flags) {
  if (options.json == "-" && options.csv == "-") {
    return flags.usage_error("--json=- and --csv=- both want stdout; give one of them a file");
  }
  bool gpu_paths = false, nvme_paths = false;
  for (const std::string& path : options.paths) {
    gpu_paths |= is_gpu_path(path);
    nvme_paths |= is_nvme_path(path);
  }
  if (nvme_paths && options.bytes % kPage != 0) {
    return flags.usage_error("--bytes: the NVMe paths need a multiple of 4KiB (O_DIRECT), not " +
                             std::to_string(options.bytes));
  }
  File json_file(nullptr, &std::fclose), csv_file(nullptr, &std::fclose),
      svg_file(nullptr, &std::fclose);
  if (auto error = open_output("json", options.json, &json_file)) return flags.usage_error(*error);
  if (auto error = open_output("csv", options.csv, &csv_file)) return flags.usage_error(*error);
  if (options.svg == "-") return flags.usage_error("--svg: give a file name (an SVG is no table)");
  if (auto error = open_output("svg", options.svg, &svg_file)) return flags.usage_error(*error);

  auto config = Config::from_environment();
  if (!config.ok()) return fail(config.status());
  std::optional<NvmeDirs> dirs;
  if (nvme_paths) {
    auto chosen = NvmeDirs::choose(config->nvme_paths);
    if (!chosen.ok()) return fail(chosen.status());
    dirs.emplace(*std::move(chosen));
    config->nvme_paths = dirs->paths();
  } else {
    config->nvme_paths.clear();
  }
  // The header shows the environment's settings; each group of paths then sizes its tiers to
  // the tensors of a pass (bench/swap/store_paths.cc).
  Config header = *config;
  const uint64_t largest =
      *std::max_element(options.tensor_sizes.begin(), options.tensor_sizes.end());
  header.cpu_bytes = SizeSetting::of_bytes(header.staging_bytes + round_up(options.bytes) +
                                           round_up(std::min(largest, options.bytes)));
  header.gpu_bytes = SizeSetting::of_bytes(gpu_paths ? gpu_tier_bytes(options.bytes) : 4 << 20);
  header.nvme_bytes = SizeSetting::of_bytes(round_up(options.bytes) + 4 * header.io_block);
  auto loaded = load_configuration(header);
  if (!loaded.ok()) return fail(loaded.status());
  const ResolvedConfig& resolved = loaded->first;
  auto device = make_device(resolved.backend, resolved.device);
  if (!device.ok()) return fail(device.status());
  const bool data_to_stdout = options.json == "-" || options.csv == "-";
  std::ostream& human = data_to_stdout ? std::cerr : std::cout;
  human << "offload-bench " << STRATA_VERSION << " on " << (*device)->description() << "\n"
        << render(resolved) << (tune ? "tune: " : "paths: ") << absl::StrJoin(options.paths, ",")
        << "; bytes " << format_bytes(options.bytes) << "; tensor sizes ";
  for (size_t i = 0; i < options.tensor_sizes.size(); ++i) {
    human << (i == 0 ? "" : ",") << format_bytes(options.tensor_sizes[i]);
  }
  human << "; repeat " << options.repeat << "\n";
  if (dirs.has_value()) human << "nvme: directories " << dirs->describe() << "\n";
  if (!tune) human << startup_line(*config, header.nvme_bytes) << "\n";
  human.flush();

  Progress progress;
  if (tune) {
    options.tensor_bytes = std::min(options.tensor_sizes.front(), options.bytes);
    absl::Status status =
        run_tune(options, *config, dirs->paths(), human,
                 [&](size_t done, size_t total) { progress.show(done, total, "I/O settings"); });
    progress.clear();
    return status.ok() ? 0 : fail(status);
  }

  Report report;
  report.engine = std::string(to_string(resolved.io_engine.kind));
  report.engine_reason = resolved.io_engine.reason;
  for (size_t i = 0; i < options.tensor_sizes.size(); ++i) {
    progress.show(i, options.tensor_sizes.size(),
                  "tensors of " + format_bytes(options.tensor_sizes[i]));
    Options sized = options;
    sized.tensor_bytes = std::min(options.tensor_sizes[i], options.bytes);
    auto result = run_store_paths(
        sized, *config, dirs.has_value() ? dirs->paths() : std::vector<std::string>(), human);
    if (!result.ok()) {
      progress.clear();
      return fail(result.status());
    }
    report.rows.insert(report.rows.end(), result->rows.begin(), result->rows.end());
    if (!result->engine.empty()) {
      report.engine = result->engine;
      report.engine_reason = result->engine_reason;
    }
    // Each size's notes once (the baselines' are the same for every size).
    for (const std::string& note : result->notes) {
      if (std::find(report.notes.begin(), report.notes.end(), note) == report.notes.end()) {
        report.notes.push_back(note);
      }
    }
  }
  progress.clear();
  if (dirs.has_value()) {
    report.nvme_paths = resolved.nvme_paths;
    report.notes.push_back("nvme: directories " + dirs->describe());
  }

  if (!data_to_stdout) print_table(report, **device, std::cout);
  const std::string json = json_line(to_json(report, resolved, **device)) + "\n";
  const std::string csv = to_csv(report);
  if (options.json == "-") std::cout << json;
  if (options.csv == "-") std::cout << csv;
  const std::string title = "offload-bench on " + (*device)->description();
  for (auto [file, text, flag, path] : {std::tuple{&json_file, &json, "json", &options.json},
                                        std::tuple{&csv_file, &csv, "csv", &options.csv}}) {
    if (*file != nullptr && !finish_output(*file, *text)) {
      return cli::print_error("offload-bench", std::string("cannot write --") + flag + "=" + *path +
                                                   ": " + std::strerror(errno));
    }
  }
  if (svg_file != nullptr && !finish_output(svg_file, to_svg(report.rows, title))) {
    return cli::print_error("offload-bench",
                            "cannot write --svg=" + options.svg + ": " + std::strerror(errno));
  }
  return 0;
}

}  // namespace strata::bench
