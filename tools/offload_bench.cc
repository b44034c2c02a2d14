// offload-bench: how fast does strata move tensors between its tiers on this machine, and how
// close is that to what the hardware does?
//
// This first version measures the two links every later path is built on: pinned CPU tier →
// GPU arena (cpu-gpu) and back (gpu-cpu), through MemoryTier blocks, in tensor-sized copies on
// one stream. The baseline, measured in the same run with the same byte count, is the raw copy:
// cudaMemcpyAsync between a plain pinned buffer and a plain device allocation on CUDA, memcpy
// between two page-aligned host buffers on the host backend. The NVMe paths, sweeps, --tune and
// plots come with the NVMe and bench issues.
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "cli.h"
#include "strata/backend.h"
#include "strata/config.h"
#include "strata/size.h"
#include "strata/tier.h"

namespace strata {
namespace {

struct Options {
  uint64_t bytes = uint64_t{256} << 20;
  uint64_t tensor_bytes = uint64_t{64} << 20;
  uint64_t repeat = 5;
  bool baseline = true;
  std::string json;
};

struct Summary {
  double median = 0, min = 0, max = 0;
};

Summary summarize(std::vector<double> gbps) {
  std::sort(gbps.begin(), gbps.end());
  Summary s;
  s.min = gbps.front();
  s.max = gbps.back();
  const size_t n = gbps.size();
  s.median = n % 2 == 1 ? gbps[n / 2] : (gbps[n / 2 - 1] + gbps[n / 2]) / 2;
  return s;
}

struct Row {
  std::string path;
  uint64_t tensor_bytes = 0;
  uint64_t total_bytes = 0;
  uint64_t repeats = 0;
  Summary runtime;
  std::optional<Summary> baseline;
  uint64_t baseline_bytes = 0;
};

// Times `run` (which moves `bytes`) once to warm up, then `repeat` times; GB/s = 1e9 bytes/s.
absl::StatusOr<Summary> measure(uint64_t bytes, uint64_t repeat,
                                const std::function<absl::Status()>& run) {
  if (auto status = run(); !status.ok()) return status;  // first touch, page faults, clocks
  std::vector<double> gbps;
  for (uint64_t i = 0; i < repeat; ++i) {
    const absl::Time start = absl::Now();
    if (auto status = run(); !status.ok()) return status;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    gbps.push_back(static_cast<double>(bytes) / seconds / 1e9);
  }
  return summarize(std::move(gbps));
}

// Copies `bytes` from src to dst in `tensor_bytes` pieces on `stream` and waits for them.
absl::Status copy_all(Device& device, Stream& stream, std::byte* dst, const std::byte* src,
                      uint64_t bytes, uint64_t tensor_bytes, CopyKind kind) {
  for (uint64_t done = 0; done < bytes; done += tensor_bytes) {
    const uint64_t n = std::min(tensor_bytes, bytes - done);
    if (auto status = device.copy_async(dst + done, src + done, n, kind, stream); !status.ok()) {
      return status;
    }
  }
  return device.synchronize(stream);
}

class Bench {
 public:
  Bench(const Options& options, Device& device) : options_(options), device_(device) {}

  absl::StatusOr<std::vector<Row>> run() {
    auto gpu = MemoryTier::create_gpu_arena(device_, gpu_tier_bytes(options_.bytes));
    if (!gpu.ok()) return gpu.status();
    auto cpu = MemoryTier::create_pinned_cpu(device_, 2 * round_up(options_.bytes));
    if (!cpu.ok()) return cpu.status();
    auto stream = device_.create_stream();
    if (!stream.ok()) return stream.status();

    // One tensor-sized run of blocks in each tier, pinned for the whole run (as a trainer would
    // hold acquired tensors).
    auto gpu_block = (*gpu)->allocate(options_.bytes);
    auto source = (*cpu)->allocate(options_.bytes);
    auto landing = (*cpu)->allocate(options_.bytes);
    for (const auto* block : {&gpu_block, &source, &landing}) {
      if (!block->ok()) return block->status();
    }
    (void)(*gpu)->pin(*gpu_block);
    (void)(*cpu)->pin(*source);
    (void)(*cpu)->pin(*landing);
    auto* dev = static_cast<std::byte*>(*(*gpu)->address(*gpu_block));
    auto* src = static_cast<std::byte*>(*(*cpu)->address(*source));
    auto* dst = static_cast<std::byte*>(*(*cpu)->address(*landing));
    for (uint64_t i = 0; i < options_.bytes; ++i) src[i] = static_cast<std::byte>(i * 131 + 7);
    std::memset(dst, 0, options_.bytes);

    std::vector<Row> rows;
    auto h2d = measure(options_.bytes, options_.repeat, [&] {
      return copy_all(device_, **stream, dev, src, options_.bytes, options_.tensor_bytes,
                      CopyKind::kHostToDevice);
    });
    if (!h2d.ok()) return h2d.status();
    rows.push_back(row("cpu-gpu", *h2d));
    auto d2h = measure(options_.bytes, options_.repeat, [&] {
      return copy_all(device_, **stream, dst, dev, options_.bytes, options_.tensor_bytes,
                      CopyKind::kDeviceToHost);
    });
    if (!d2h.ok()) return d2h.status();
    rows.push_back(row("gpu-cpu", *d2h));
    // The round trip must have carried every byte: a bench that loses data measures nothing.
    if (std::memcmp(src, dst, options_.bytes) != 0) {
      return absl::DataLossError("cpu-gpu-cpu round trip changed the data; this is a bug");
    }

    if (options_.baseline) {
      if (auto status = add_baselines(rows); !status.ok()) return status;
    }
    return rows;
  }

 private:
  static uint64_t round_up(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }
  // The arena keeps 1/64 (at most 64 MiB) as its compaction bounce buffer.
  static uint64_t gpu_tier_bytes(uint64_t bytes) {
    return round_up(bytes + std::min<uint64_t>(bytes / 32, uint64_t{64} << 20) + (1 << 20));
  }

  Row row(std::string path, const Summary& runtime) const {
    Row r;
    r.path = std::move(path);
    r.tensor_bytes = std::min(options_.tensor_bytes, options_.bytes);
    r.total_bytes = options_.bytes;
    r.repeats = options_.repeat;
    r.runtime = runtime;
    return r;
  }

  absl::Status add_baselines(std::vector<Row>& rows) {
    const uint64_t bytes = options_.bytes;
    if (device_.backend() == Backend::kCuda) {
      // Raw cudaMemcpyAsync between a plain pinned buffer and a plain device allocation.
      auto memory = device_.allocate_device_memory(bytes);
      auto pinned = device_.allocate_pinned(bytes, "baseline buffer");
      auto stream = device_.create_stream();
      if (!memory.ok()) return memory.status();
      if (!pinned.ok()) return pinned.status();
      if (!stream.ok()) return stream.status();
      auto* dev = static_cast<std::byte*>((*memory)->data());
      auto* host = static_cast<std::byte*>((*pinned)->data());
      std::memset(host, 1, bytes);
      for (auto& row : rows) {
        const CopyKind kind =
            row.path == "cpu-gpu" ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost;
        auto result = measure(bytes, options_.repeat, [&] {
          return kind == CopyKind::kHostToDevice
                     ? copy_all(device_, **stream, dev, host, bytes, bytes, kind)
                     : copy_all(device_, **stream, host, dev, bytes, bytes, kind);
        });
        if (!result.ok()) return result.status();
        row.baseline = *result;
        row.baseline_bytes = bytes;
      }
      return absl::OkStatus();
    }
    // Host backend: memcpy between two page-aligned buffers on this thread.
    std::vector<std::byte> a(bytes + 4096), b(bytes + 4096);
    auto align = [](std::vector<std::byte>& v) {
      auto p = reinterpret_cast<uintptr_t>(v.data());
      return reinterpret_cast<std::byte*>((p + 4095) / 4096 * 4096);
    };
    std::byte* from = align(a);
    std::byte* to = align(b);
    std::memset(from, 1, bytes);
    for (auto& row : rows) {
      auto result = measure(bytes, options_.repeat, [&] {
        std::memcpy(to, from, bytes);
        return absl::OkStatus();
      });
      if (!result.ok()) return result.status();
      row.baseline = *result;
      row.baseline_bytes = bytes;
    }
    return absl::OkStatus();
  }

  const Options& options_;
  Device& device_;
};

std::string json_number(double v) { return absl::StrFormat("%.3f", v); }

std::string to_json(const std::vector<Row>& rows, const ResolvedConfig& config,
                    const Device& device) {
  std::vector<std::string> results;
  for (const Row& r : rows) {
    const bool has_baseline = r.baseline.has_value();
    results.push_back(absl::StrFormat(
        R"({"path": "%s", "tensor_bytes": %d, "total_bytes": %d, "repeats": %d, )"
        R"("gbps_median": %s, "gbps_min": %s, "gbps_max": %s, "baseline_gbps": %s, )"
        R"("baseline_bytes": %d, "ratio": %s})",
        r.path, r.tensor_bytes, r.total_bytes, r.repeats, json_number(r.runtime.median),
        json_number(r.runtime.min), json_number(r.runtime.max),
        has_baseline ? json_number(r.baseline->median) : "null", r.baseline_bytes,
        has_baseline ? json_number(r.runtime.median / r.baseline->median) : "null"));
  }
  return absl::StrFormat(
      R"({"version": "%s", "backend": "%s", "device": "%s", "config": {"gpu_bytes": %d, )"
      R"("cpu_bytes": %d, "io_engine": "%s", "io_block": %d, "io_depth": %d, "verify": %s}, )"
      R"("results": [%s]})",
      STRATA_VERSION, to_string(config.backend), device.description(), config.gpu_bytes,
      config.cpu_bytes, to_string(config.io_engine), config.io_block, config.io_depth,
      config.verify ? "true" : "false", absl::StrJoin(results, ", "));
}

void print_table(const std::vector<Row>& rows, const Device& device) {
  const bool simulated = device.backend() == Backend::kHost;
  std::cout << absl::StrFormat("\n%-9s %12s %12s %24s %14s %7s\n", "path", "tensor", "total",
                               "runtime GB/s med (min-max)", "baseline GB/s", "ratio");
  for (const Row& r : rows) {
    std::cout << absl::StrFormat(
        "%-9s %12s %12s %8.2f (%6.2f-%6.2f) %14s %7s%s\n", r.path, format_bytes(r.tensor_bytes),
        format_bytes(r.total_bytes), r.runtime.median, r.runtime.min, r.runtime.max,
        r.baseline ? absl::StrFormat("%.2f", r.baseline->median) : "-",
        r.baseline ? absl::StrFormat("%.2f", r.runtime.median / r.baseline->median) : "-",
        simulated ? "  (host-simulated GPU)" : "");
  }
  std::cout << "\nbaseline: "
            << (simulated ? "memcpy between page-aligned host buffers"
                          : "cudaMemcpyAsync between plain pinned and device "
                            "buffers")
            << ", same bytes, same run. GB/s = 1e9 bytes/s.\n";
}

int run(int argc, const char* const* argv) {
  Options options;
  cli::FlagSet flags("offload-bench",
                     "Measures strata's tier-to-tier bandwidth against a raw baseline measured "
                     "in the same run.\nThe tiers are configured from STRATA_* variables; their "
                     "sizes are set to fit --bytes.");
  flags.add_size("bytes", &options.bytes, "bytes moved per path and repetition");
  flags.add_size("tensor-bytes", &options.tensor_bytes, "bytes per copy (one tensor)");
  flags.add_uint64("repeat", &options.repeat, "timed repetitions (after one warm-up)");
  bool no_baseline = false;
  flags.add_bool("no-baseline", &no_baseline, "skip the raw baseline");
  flags.add_string("json", &options.json, "also write JSON results to FILE, or - for stdout");
  std::vector<std::string> positional;
  if (auto exit_code = flags.parse_or_exit(argc, argv, &positional)) return *exit_code;
  if (!positional.empty()) return flags.usage_error("unexpected argument '" + positional[0] + "'");
  if (options.repeat == 0) return flags.usage_error("--repeat: must be at least 1");
  if (options.tensor_bytes > options.bytes) options.tensor_bytes = options.bytes;
  options.baseline = !no_baseline;

  auto config = Config::from_environment();
  if (!config.ok()) {
    std::cerr << "offload-bench: " << config.status().message() << "\n";
    return 1;
  }
  // The bench sizes the tiers to what it moves, not to the trainer defaults.
  config->cpu_bytes = SizeSetting::of_bytes(2 * ((options.bytes + 4095) / 4096 * 4096) + 8192);
  config->gpu_bytes = SizeSetting::of_bytes(
      options.bytes + std::min<uint64_t>(options.bytes / 32, uint64_t{64} << 20) + (2 << 20));
  auto loaded = load_configuration(*config);
  if (!loaded.ok()) {
    std::cerr << "offload-bench: " << loaded.status().message() << "\n";
    return 1;
  }
  const ResolvedConfig& resolved = loaded->first;
  auto device = make_device(resolved.backend, resolved.device);
  if (!device.ok()) {
    std::cerr << "offload-bench: " << device.status().message() << "\n";
    return 1;
  }
  const bool json_to_stdout = options.json == "-";
  std::ostream& human = json_to_stdout ? std::cerr : std::cout;
  human << "offload-bench " << STRATA_VERSION << " on " << (*device)->description() << "\n"
        << render(resolved);

  Bench bench(options, **device);
  auto rows = bench.run();
  if (!rows.ok()) {
    std::cerr << "offload-bench: " << rows.status().message() << "\n";
    return 1;
  }
  if (!json_to_stdout) print_table(*rows, **device);
  if (!options.json.empty()) {
    const std::string json = to_json(*rows, resolved, **device) + "\n";
    if (json_to_stdout) {
      std::cout << json;
    } else {
      std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(options.json.c_str(), "w"),
                                                 &std::fclose);
      if (file == nullptr || std::fwrite(json.data(), 1, json.size(), file.get()) != json.size() ||
          std::fclose(file.release()) != 0) {
        std::cerr << "offload-bench: cannot write --json=" << options.json << ": "
                  << std::strerror(errno) << "\n";
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::run(argc, argv); }
