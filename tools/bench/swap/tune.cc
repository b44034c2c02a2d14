#include "bench/swap/tune.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <sstream>

#include "bench/swap/store_paths.h"
#include "strata/base/size.h"
#include "strata/nvme/io_engine.h"

namespace strata::bench {
namespace {

constexpr uint64_t kBlocks[] = {uint64_t{256} << 10, uint64_t{1} << 20, uint64_t{4} << 20};
constexpr uint32_t kDepths[] = {4, 16, 32, 64};
constexpr IoEngineKind kEngines[] = {IoEngineKind::kIoUring, IoEngineKind::kPsync};
// Settings this close to the best are as good within the noise of a short run; among them the
// least pinned memory wins.
constexpr double kWithin = 0.03;

// As STRATA_IO_BLOCK accepts it (format_bytes has a space and decimals).
std::string size_setting(uint64_t bytes) {
  return bytes % (1 << 20) == 0 ? absl::StrFormat("%dMiB", bytes >> 20)
                                : absl::StrFormat("%dKiB", bytes >> 10);
}

struct Trial {
  uint64_t block = 0;
  uint32_t depth = 0;
  std::string engine;  // as asked
  std::string ran;     // the engine that ran (io_uring may fall back to psync)
  double write_gbps = 0, read_gbps = 0;
  double mean() const { return (write_gbps + read_gbps) / 2; }
  uint64_t pinned() const { return block * depth; }
};

}  // namespace

absl::Status run_tune(const Options& options, const Config& config,
                      const std::vector<std::string>& nvme_dirs, std::ostream& out,
                      const std::function<void(size_t, size_t)>& progress) {
  Options o = options;
  o.paths = {std::string(kCpuNvme), std::string(kNvmeCpu)};
  o.baseline = false;
  std::vector<Trial> trials;
  const size_t total = std::size(kBlocks) * std::size(kDepths) * std::size(kEngines);
  for (const IoEngineKind engine : kEngines) {
    for (const uint64_t block : kBlocks) {
      for (const uint32_t depth : kDepths) {
        Config c = config;
        c.io_engine = engine;
        c.io_block = block;
        c.io_depth = depth;
        // The staging pool must hold a full queue of blocks.
        c.staging_bytes = std::max(c.staging_bytes, block * depth);
        std::ostringstream quiet;  // per-setting "nvme: ..." lines would drown the table
        auto result = run_store_paths(o, c, nvme_dirs, quiet);
        if (!result.ok()) {
          return absl::Status(
              result.status().code(),
              absl::StrFormat("--tune: block %s, depth %d, %s: %s", format_bytes(block), depth,
                              engine == IoEngineKind::kPsync ? "psync" : "io_uring",
                              result.status().message()));
        }
        Trial t{.block = block,
                .depth = depth,
                .engine = engine == IoEngineKind::kPsync ? "psync" : "io_uring",
                .ran = result->engine};
        for (const Row& r : result->rows) {
          (r.path == kCpuNvme ? t.write_gbps : t.read_gbps) = r.runtime.median;
        }
        trials.push_back(t);
        if (progress) progress(trials.size(), total);
      }
    }
  }
  const auto best =
      std::max_element(trials.begin(), trials.end(),
                       [](const Trial& a, const Trial& b) { return a.mean() < b.mean(); });
  const double floor = best->mean() * (1 - kWithin);
  const Trial* chosen = nullptr;
  for (const Trial& t : trials) {
    if (t.mean() < floor) continue;
    if (chosen == nullptr || t.pinned() < chosen->pinned() ||
        (t.pinned() == chosen->pinned() && t.mean() > chosen->mean())) {
      chosen = &t;
    }
  }
  out << absl::StrFormat(
      "\n--tune: cpu-nvme and nvme-cpu through the store, %s in %s tensors, "
      "median of %d\n",
      format_bytes(o.bytes), format_bytes(o.tensor_bytes), o.repeat);
  out << absl::StrFormat("%-9s %-9s %10s %6s %10s %10s %10s %10s\n", "engine", "(ran)", "block",
                         "depth", "cpu-nvme", "nvme-cpu", "mean GB/s", "pinned");
  for (const Trial& t : trials) {
    out << absl::StrFormat("%-9s %-9s %10s %6d %10.2f %10.2f %10.2f %10s%s\n", t.engine, t.ran,
                           format_bytes(t.block), t.depth, t.write_gbps, t.read_gbps, t.mean(),
                           format_bytes(t.pinned()),
                           &t == chosen ? "  <- chosen" : (&t == &*best ? "  (best)" : ""));
  }
  out << absl::StrFormat(
      "\nBest mean %.2f GB/s; chosen: the least pinned memory (block x depth) within %.0f%% of "
      "it.\n",
      best->mean(), kWithin * 100);
  out << absl::StrFormat("export STRATA_IO_BLOCK=%s STRATA_IO_DEPTH=%d STRATA_IO_ENGINE=%s\n",
                         size_setting(chosen->block), chosen->depth, chosen->engine);
  return absl::OkStatus();
}

}  // namespace strata::bench
