#include "bench/nvme_paths.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "bench/raw_io.h"
#include "strata/io_engine.h"
#include "strata/size.h"
#include "strata/swap_config.h"

namespace strata::bench {

uint64_t tensor_stride(const Options& options) {
  return round_up(std::min(options.tensor_bytes, options.bytes));
}

uint64_t nvme_cpu_block_bytes(const Options& options) {
  return options.tensors() * tensor_stride(options);
}

uint64_t nvme_bytes_per_path(const Options& options, uint64_t stripe, uint64_t paths) {
  // A tensor of u units puts at most ceil(u / paths) of them on one path.
  const uint64_t units = (std::min(options.tensor_bytes, options.bytes) + stripe - 1) / stripe;
  const uint64_t per_tensor = (units + paths - 1) / paths * stripe;
  return options.tensors() * per_tensor + 2 * stripe;
}

namespace {

class NvmeBench {
 public:
  NvmeBench(const Options& options, SwapSpace& space, std::byte* source, std::byte* landing)
      : options_(options), space_(space), source_(source), landing_(landing) {}

  absl::Status allocate_extents() {
    for (uint64_t i = 0; i < options_.tensors(); ++i) {
      auto extent = space_.allocate(tensor_size(i), absl::StrFormat("bench tensor %d", i));
      if (!extent.ok()) return extent.status();
      extents_.push_back(*extent);
    }
    return absl::OkStatus();
  }

  // Every tensor at once: the engine's depth, not the bench, bounds what is in flight, as with a
  // trainer's evictions and prefetches.
  absl::Status write_all() {
    IoWaiter waiter;
    for (uint64_t i = 0; i < extents_.size(); ++i) {
      if (absl::Status status =
              space_.write(extents_[i], 0, source_ + offset(i), tensor_size(i), waiter.track());
          !status.ok()) {
        return status;
      }
    }
    return waiter.wait();
  }

  absl::Status read_all() {
    IoWaiter waiter;
    for (uint64_t i = 0; i < extents_.size(); ++i) {
      if (absl::Status status =
              space_.read(extents_[i], 0, landing_ + offset(i), tensor_size(i), waiter.track());
          !status.ok()) {
        return status;
      }
    }
    return waiter.wait();
  }

  // Before each read pass: a read that silently did nothing must not pass verification on the
  // bytes an earlier pass left.
  absl::Status poison_landing() {
    std::memset(landing_, 0xA5, nvme_cpu_block_bytes(options_));
    return absl::OkStatus();
  }

  absl::Status verify() const {
    for (uint64_t i = 0; i < extents_.size(); ++i) {
      const std::byte* a = source_ + offset(i);
      const std::byte* b = landing_ + offset(i);
      if (std::memcmp(a, b, tensor_size(i)) == 0) continue;
      uint64_t at = 0;
      while (a[at] == b[at]) ++at;
      return absl::DataLossError(absl::StrFormat(
          "cpu-nvme-cpu round trip changed the data: tensor %d (%d bytes) differs from byte %d "
          "on (stripe unit %d); the swap space returned success, so this is a bug",
          i, tensor_size(i), at, at / space_.stripe_bytes()));
    }
    return absl::OkStatus();
  }

 private:
  uint64_t offset(uint64_t i) const { return i * tensor_stride(options_); }
  uint64_t tensor_size(uint64_t i) const {
    return std::min(options_.tensor_bytes, options_.bytes - i * options_.tensor_bytes);
  }

  const Options& options_;
  SwapSpace& space_;
  std::byte* source_;
  std::byte* landing_;
  std::vector<ExtentHandle> extents_;
};

std::string stats_line(const SwapStats& stats, const ResolvedConfig& config) {
  const IoStats& io = stats.io;
  return absl::StrFormat(
      "nvme: %d writes, %d reads (%d with registered buffers), max %d in flight (depth %d x %d "
      "paths), %d retries, %d short transfers, %d errors, %d checksum failures\n",
      io.writes, io.reads, io.fixed_requests, io.max_in_flight, config.io_depth,
      config.nvme_paths.size(), io.retries, io.short_transfers, io.errors, stats.checksum_failures);
}

}  // namespace

absl::StatusOr<NvmeResult> run_nvme_paths(const Options& options, const ResolvedConfig& config,
                                          const std::string& dirs_description, MemoryTier& cpu_tier,
                                          std::byte* source, std::byte* landing,
                                          std::ostream& human) {
  NvmeResult result;
  human << "nvme: directories " << dirs_description << "\n";
  auto space = SwapSpace::create(swap_space_options(config, &cpu_tier));
  if (!space.ok()) return space.status();
  result.stats = (*space)->stats();
  human << "nvme: engine " << result.stats.engine << " (" << result.stats.engine_reason << ")\n";
  for (const SwapPathStats& path : result.stats.paths) {
    human << absl::StrFormat("nvme: swap file in %s on %s, %s, alignment %d\n", path.path,
                             path.filesystem.empty() ? "?" : path.filesystem,
                             path.direct_io ? "O_DIRECT" : "buffered (O_DIRECT refused)",
                             path.alignment);
  }
  for (const std::string& warning : result.stats.warnings)
    human << "nvme: warning: " << warning << "\n";
  human.flush();
  if (kPage % (*space)->alignment() != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the swap space needs %d-byte aligned buffers; offload-bench lays tensors out on 4 KiB "
        "pages",
        (*space)->alignment()));
  }

  NvmeBench bench(options, **space, source, landing);
  if (absl::Status status = bench.allocate_extents(); !status.ok()) return status;

  std::unique_ptr<RawIo> raw;
  if (options.baseline) {
    auto created = RawIo::create({.dirs = config.nvme_paths,
                                  .bytes = options.bytes,
                                  .block = config.io_block,
                                  .depth = config.io_depth});
    if (created.ok()) {
      raw = *std::move(created);
      result.notes.push_back(absl::StrFormat(
          "nvme baseline: fio-equivalent io_uring, O_DIRECT, bs=%s, iodepth=%d, one job per "
          "directory (%d), plain READ/WRITE on an O_TMPFILE file in the same directory",
          format_bytes(config.io_block), config.io_depth, config.nvme_paths.size()));
      if (auto buffered = raw->buffered_dirs(); !buffered.empty()) {
        result.notes.push_back("nvme baseline: O_DIRECT refused in " +
                               absl::StrJoin(buffered, ",") + ": buffered I/O there");
      }
    } else if (absl::IsUnavailable(created.status())) {
      result.notes.push_back("nvme baseline: none: " + std::string(created.status().message()));
    } else {
      return created.status();
    }
  }

  const auto write_all = [&] { return bench.write_all(); };
  const auto read_all = [&] { return bench.read_all(); };
  const auto poison = [&] { return bench.poison_landing(); };
  const auto run_path = [&](std::string_view path, const Pass& runtime, const Pass& baseline,
                            const Pass& prepare) -> absl::Status {
    if (raw == nullptr) {
      auto summary = measure(options.bytes, options.repeat, runtime, prepare);
      if (!summary.ok()) return summary.status();
      result.rows.push_back(make_row(options, path, *summary));
      return absl::OkStatus();
    }
    auto paired = measure_paired(options.bytes, options.repeat, runtime, baseline, prepare);
    if (!paired.ok()) return paired.status();
    Row row = make_row(options, path, paired->runtime);
    row.baseline = paired->baseline;
    row.baseline_bytes = raw->bytes();
    result.rows.push_back(std::move(row));
    return absl::OkStatus();
  };

  if (options.wants(kCpuNvme)) {
    auto status = run_path(
        kCpuNvme, write_all, [&] { return raw->write_pass(); }, nullptr);
    if (!status.ok()) return status;
  } else if (absl::Status status = write_all(); !status.ok()) {
    return status;  // nvme-cpu alone still needs the tensors on NVMe
  }
  if (options.wants(kNvmeCpu)) {
    auto status = run_path(
        kNvmeCpu, read_all, [&] { return raw->read_pass(); }, poison);
    if (!status.ok()) return status;
  } else {
    // cpu-nvme alone still proves its bytes arrived.
    if (absl::Status status = poison(); !status.ok()) return status;
    if (absl::Status status = read_all(); !status.ok()) return status;
  }
  if (absl::Status status = bench.verify(); !status.ok()) return status;
  result.stats = (*space)->stats();
  human << stats_line(result.stats, config);
  return result;
}

}  // namespace strata::bench
