#include "bench/swap/store_paths.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "bench/fresh_pieces.h"
#include "bench/link_check.h"
#include "bench/raw_io.h"
#include "bench/swap/gpu_paths.h"
#include "strata/base/size.h"
#include "strata/runtime/runtime.h"

namespace strata::bench {
namespace {

uint64_t tensor_count(const Options& o) { return o.tensors(); }
// Every tensor rounded to a page: the CPU tier and the swap space hand out page-aligned blocks.
uint64_t footprint(const Options& o) { return tensor_count(o) * round_up(o.tensor_bytes); }

// The environment's configuration with the tiers sized to one group of paths: room for every
// tensor of a pass in each tier the group touches (the store never has to evict to make room,
// so a pass measures the moves alone), plus slack for alignment and the arena's bounce buffer.
Config sized_config(const Options& o, const Config& base, const std::vector<std::string>& nvme,
                    bool gpu) {
  Config c = base;
  const uint64_t all = footprint(o);
  const uint64_t slack = tensor_count(o) * kPage + (uint64_t{2} << 20);
  c.gpu_bytes = SizeSetting::of_bytes(gpu ? gpu_tier_bytes(all + slack) : uint64_t{4} << 20);
  c.nvme_paths = nvme;
  if (nvme.empty()) {
    c.cpu_bytes = SizeSetting::of_bytes(all + slack);
  } else {
    // A tensor of u stripe units puts at most ceil(u / paths) of them on one path.
    const uint64_t units = (o.tensor_bytes + c.io_block - 1) / c.io_block;
    const uint64_t per_path = (units + nvme.size() - 1) / nvme.size() * c.io_block;
    c.nvme_bytes = SizeSetting::of_bytes(tensor_count(o) * per_path + 4 * c.io_block);
    // The staging pool lives in the CPU tier, next to every tensor's CPU copy.
    c.cpu_bytes = SizeSetting::of_bytes(c.staging_bytes + all + slack);
  }
  return c;
}

// The tensors of one group, and the untimed steps that put them into a path's starting state.
class StoreBench {
 public:
  StoreBench(Runtime& runtime, Stream& stream, const Options& options)
      : rt_(runtime), store_(runtime.store()), stream_(stream), options_(options) {
    expected_.resize(options.tensor_bytes);
    landed_.resize(options.tensor_bytes);
  }

  absl::Status create(TierKind home) {
    for (uint64_t i = 0; i < tensor_count(options_); ++i) {
      auto handle = store_.create(absl::StrFormat("bench.%d", i), size(i), home);
      if (!handle.ok()) return handle.status();
      tensors_.push_back(*handle);
    }
    return absl::OkStatus();
  }

  // New contents for every tensor, written in `tier` (cpu: in place; gpu: copied in from host
  // memory), so that the copy there is the only newest one.
  absl::Status write(TierKind tier) {
    ++seed_;
    for (uint64_t i = 0; i < tensors_.size(); ++i) {
      auto address = store_.acquire(tensors_[i], tier, stream_, AccessMode::kWrite);
      if (!address.ok()) return address.status();
      auto* data = static_cast<std::byte*>(*address);
      absl::Status status;
      if (tier == TierKind::kCpu) {
        fill_pattern(data, size(i), pattern_seed(i));
      } else {
        fill_pattern(expected_.data(), size(i), pattern_seed(i));
        status = rt_.device().copy_async(data, expected_.data(), size(i), CopyKind::kHostToDevice,
                                         stream_);
        // expected_ is reused for the next tensor.
        if (status.ok()) status = rt_.device().synchronize(stream_);
      }
      if (absl::Status released = store_.release(tensors_[i], stream_); status.ok()) {
        status = released;
      }
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // The timed passes.
  // One acquire + release per tensor, then the stream's work. With `in_order`, the pass first
  // tells the store its order (set_access_order), as a trainer with a recorded trace does: the
  // store's read-ahead then keeps the next tensors' NVMe reads in flight while one is acquired.
  // The order is withdrawn at the end, so that nothing is prefetched outside the pass.
  absl::Status acquire_all(TierKind tier, bool in_order = false) {
    if (in_order) {
      std::vector<std::pair<TensorHandle, TierKind>> order;
      for (const TensorHandle& t : tensors_) order.emplace_back(t, tier);
      if (absl::Status status = store_.set_access_order(order); !status.ok()) return status;
    }
    absl::Status status;
    for (const TensorHandle& t : tensors_) {
      if (auto address = store_.acquire(t, tier, stream_, AccessMode::kRead); !address.ok()) {
        status = address.status();
        break;
      }
      if (status = store_.release(t, stream_); !status.ok()) break;
    }
    if (in_order) {
      if (absl::Status withdrawn = store_.set_access_order({}); status.ok()) status = withdrawn;
    }
    if (!status.ok()) return status;
    return rt_.device().synchronize(stream_);
  }
  // evict() returns once each write-back is under way (to the CPU tier it does not wait for the
  // device copy); the pass ends when every copy is gone, i.e. when its bytes are home.
  absl::Status evict_all(TierKind tier) {
    for (const TensorHandle& t : tensors_) {
      if (absl::Status status = store_.evict(t, tier); !status.ok()) return status;
    }
    for (const TensorHandle& t : tensors_) {
      if (absl::Status status = store_.wait_evicted(t, tier); !status.ok()) return status;
    }
    return rt_.device().synchronize(stream_);
  }
  absl::Status flush() { return store_.flush(); }

  // Run after every pass: nothing it started may still be moving. A pass that returns early
  // would be timed without its work, and that work would share the links with the next pass (a
  // baseline, perhaps). Also run before every timed pass (after its preparation): the CPU
  // tier's io_uring registration of the pieces used so far is waited for, so it never runs
  // beside a timed pass. And where the NVMe use of the timed passes and the pieces they pinned
  // are counted (untimed): what happened since the last check, when a runtime pass ran in
  // between (timed(), below).
  absl::Status settled(std::string_view path) {
    const StoreStats stats = store_.stats();
    if (stats.moves_in_flight != 0 || stats.drops_pending != 0) {
      return absl::InternalError(absl::StrFormat(
          "%s: a pass returned with %d move(s) in flight and %d evicted copies not yet dropped; "
          "its time would leave that work out. This is a bench bug; please report it",
          path, stats.moves_in_flight, stats.drops_pending));
    }
    rt_.wait_for_registration();
    const PinCounters pins = pin_counters(rt_);
    // The first runtime pass of a row is its warm-up: it may take the first touches.
    if (timed_ran_ && runtime_passes_ > 1) fresh_.add(pins_, pins);
    pins_ = pins;
    StagingPool* staging = rt_.staging();
    if (staging == nullptr) return absl::OkStatus();
    const StagingStats pool = staging->stats();
    if (timed_ran_) {
      NvmeUse& use = use_.emplace();  // keeps what earlier passes counted
      use = use_counted_;
      use.bytes = pool.bytes;
      use.chunk_bytes = pool.chunk_bytes;
      use.peak_leases = std::max(use.peak_leases, pool.peak_in_use);
      use.peak_bytes = std::max(use.peak_bytes, pool.peak_in_use_bytes);
      use.waits += pool.waits - waits_before_;
      use.wait_seconds += static_cast<double>(pool.wait_ns - wait_ns_before_) * 1e-9;
      use.fetches_in_flight_peak =
          std::max(use.fetches_in_flight_peak, stats.fetches_in_flight_peak);
      use_counted_ = use;
      timed_ran_ = false;
    }
    store_.reset_peak_usage();
    staging->reset_peak();
    waits_before_ = pool.waits;
    wait_ns_before_ = pool.wait_ns;
    return absl::OkStatus();
  }
  // `pass` as timed: marks that a runtime pass ran, so that settled() counts its NVMe use and
  // the pieces it pinned.
  Pass timed(const Pass& pass) {
    return [this, pass] {
      timed_ran_ = true;
      ++runtime_passes_;
      return pass();
    };
  }
  // The NVMe use counted since the last call (nullopt without an NVMe tier).
  std::optional<NvmeUse> take_use() {
    std::optional<NvmeUse> use = std::exchange(use_, std::nullopt);
    use_counted_ = NvmeUse();
    return use;
  }
  // The pieces timed passes pinned since the last call; the next runtime pass is a warm-up.
  FreshPieces take_fresh() {
    runtime_passes_ = 0;
    return std::exchange(fresh_, FreshPieces());
  }

  // Every tensor's copy in `tier` holds the last write()'s pattern.
  absl::Status verify(TierKind tier, std::string_view path) {
    for (uint64_t i = 0; i < tensors_.size(); ++i) {
      auto address = store_.acquire(tensors_[i], tier, stream_, AccessMode::kRead);
      if (!address.ok()) return address.status();
      const std::byte* got = static_cast<const std::byte*>(*address);
      absl::Status status;
      if (tier == TierKind::kGpu) {
        status =
            rt_.device().copy_async(landed_.data(), got, size(i), CopyKind::kDeviceToHost, stream_);
        if (status.ok()) status = rt_.device().synchronize(stream_);
        got = landed_.data();
      }
      fill_pattern(expected_.data(), size(i), pattern_seed(i));
      if (status.ok() && std::memcmp(got, expected_.data(), size(i)) != 0) {
        uint64_t at = 0;
        while (got[at] == expected_[at]) ++at;
        status = absl::DataLossError(absl::StrFormat(
            "%s: tensor %d (%d bytes) differs from byte %d on after its round trip through the "
            "store; every call returned success, so this is a bug",
            path, i, size(i), at));
      }
      if (absl::Status released = store_.release(tensors_[i], stream_); status.ok()) {
        status = released;
      }
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

 private:
  uint64_t size(uint64_t i) const {
    return std::min(options_.tensor_bytes, options_.bytes - i * options_.tensor_bytes);
  }
  uint64_t pattern_seed(uint64_t i) const { return seed_ * 1'000'003 + i; }

  Runtime& rt_;
  TensorStore& store_;
  Stream& stream_;
  const Options& options_;
  std::vector<TensorHandle> tensors_;
  uint64_t seed_ = 0;
  std::vector<std::byte> expected_, landed_;
  bool timed_ran_ = false;
  std::optional<NvmeUse> use_;
  NvmeUse use_counted_;
  uint64_t waits_before_ = 0;
  uint64_t wait_ns_before_ = 0;
  uint64_t runtime_passes_ = 0;  // since take_fresh()
  PinCounters pins_;             // at the last settled()
  FreshPieces fresh_;
};

// A path's runtime pass, its untimed preparation, and up to two baselines (the lower wins).
struct PathPlan {
  std::string_view path;
  Pass setup = nullptr;    // once, untimed
  Pass prepare = nullptr;  // before every pass, untimed
  Pass runtime = nullptr;
  Pass verify = nullptr;
  Pass baseline = nullptr;  // alternated with the runtime (ABBA); may be null
  uint64_t baseline_bytes = 0;
  bool nvme_baseline = false;      // `baseline` is the drive's (else the GPU link's)
  Pass second_baseline = nullptr;  // the other link of a two-link path (the GPU's); may be null
  uint64_t second_baseline_bytes = 0;
};

absl::Status run_plan(const Options& o, const PathPlan& plan, StoreBench& bench,
                      std::vector<Row>& rows, std::vector<std::string>& notes) {
  if (plan.setup) {
    if (absl::Status status = plan.setup(); !status.ok()) return status;
  }
  const Pass settled = [&] { return bench.settled(plan.path); };
  if (absl::Status status = settled(); !status.ok()) return status;
  (void)bench.take_use();  // from the setup: not this row's
  (void)bench.take_fresh();
  const Pass runtime = bench.timed(plan.runtime);
  Row row;
  if (plan.baseline) {
    auto paired = measure_paired(o.bytes, o.repeat, runtime, plan.baseline, plan.prepare, settled);
    if (!paired.ok()) return paired.status();
    row = make_row(o, plan.path, paired->runtime);
    row.baseline = paired->baseline;
    row.baseline_bytes = plan.baseline_bytes;
    row.nvme_link = plan.nvme_baseline;
  } else {
    auto summary = measure(o.bytes, o.repeat, runtime, plan.prepare, settled);
    if (!summary.ok()) return summary.status();
    row = make_row(o, plan.path, *summary);
  }
  // The warm-up pass counts too (the first of the repetitions the row reports).
  row.nvme_use = bench.take_use();
  const std::string fresh = bench.take_fresh().note(
      absl::StrFormat("%s with %s tensors", plan.path, format_bytes(o.tensor_bytes)), "timed pass");
  if (!fresh.empty()) notes.push_back(fresh);
  if (absl::Status status = plan.verify(); !status.ok()) return status;
  const Pass* link = &plan.baseline;
  if (plan.second_baseline) {
    auto other = measure(o.bytes, o.repeat, plan.second_baseline);
    if (!other.ok()) return other.status();
    if (!row.baseline.has_value() || other->median < row.baseline->median) {
      row.baseline = *other;
      row.baseline_bytes = plan.second_baseline_bytes;
      row.nvme_link = false;
      link = &plan.second_baseline;
    }
  }
  // A figure above its link's limit measured nothing: the run fails rather than print it. The
  // link is measured again first, a few passes, in case every pass so far met a busy moment.
  if (row.baseline.has_value()) {
    row.link_gbps = row.baseline->max;
    while (!check_link(row).ok() && row.link_rechecks < kLinkRechecks) {
      auto gbps = time_pass(o.bytes, *link);
      if (!gbps.ok()) return gbps.status();
      row.link_gbps = std::max(row.link_gbps, *gbps);
      ++row.link_rechecks;
    }
  }
  if (absl::Status status = check_link(row); !status.ok()) return status;
  rows.push_back(std::move(row));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Runtime>> make_runtime(const Config& config) {
  // The store's defaults, prefetching included: it prefetches only with an order, which only the
  // passes that read from NVMe give it (and withdraw), so every other pass moves what it asks
  // for, when it asks.
  return Runtime::create(config, RuntimeOptions());
}

// cpu-gpu and gpu-cpu: CPU-homed tensors, no NVMe tier.
absl::Status run_gpu_group(const Options& o, const Config& base, PathsResult& result) {
  auto runtime = make_runtime(sized_config(o, base, {}, /*gpu=*/true));
  if (!runtime.ok()) return runtime.status();
  Runtime& rt = **runtime;
  auto stream = rt.device().create_stream();
  if (!stream.ok()) return stream.status();
  StoreBench bench(rt, **stream, o);
  if (absl::Status status = bench.create(TierKind::kCpu); !status.ok()) return status;
  std::unique_ptr<GpuBaseline> link;
  if (o.baseline) {
    auto created = GpuBaseline::create(rt.device(), o.bytes, o.tensor_bytes);
    if (!created.ok()) return created.status();
    link = *std::move(created);
  }
  const auto h2d = link ? Pass([&] { return link->host_to_device(); }) : Pass();
  const auto d2h = link ? Pass([&] { return link->device_to_host(); }) : Pass();
  if (o.wants(kCpuGpu)) {
    PathPlan plan{.path = kCpuGpu,
                  .setup = [&] { return bench.write(TierKind::kCpu); },
                  .prepare = [&] { return bench.evict_all(TierKind::kGpu); },
                  .runtime = [&] { return bench.acquire_all(TierKind::kGpu); },
                  .verify = [&] { return bench.verify(TierKind::kGpu, kCpuGpu); },
                  .baseline = h2d,
                  .baseline_bytes = o.bytes};
    if (absl::Status status = run_plan(o, plan, bench, result.rows, result.notes); !status.ok()) {
      return status;
    }
  }
  if (o.wants(kGpuCpu)) {
    PathPlan plan{.path = kGpuCpu,
                  .prepare = [&] { return bench.write(TierKind::kGpu); },
                  .runtime = [&] { return bench.evict_all(TierKind::kGpu); },
                  .verify = [&] { return bench.verify(TierKind::kCpu, kGpuCpu); },
                  .baseline = d2h,
                  .baseline_bytes = o.bytes};
    if (absl::Status status = run_plan(o, plan, bench, result.rows, result.notes); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

void describe_swap(Runtime& rt, PathsResult& result, std::ostream& human) {
  const SwapStats stats = rt.nvme()->stats();
  result.engine = stats.engine;
  result.engine_reason = stats.engine_reason;
  human << "nvme: engine " << stats.engine << " (" << stats.engine_reason << "), block "
        << format_bytes(rt.config().io_block) << ", depth " << rt.config().io_depth << "\n";
  for (const SwapPathStats& path : stats.paths) {
    human << absl::StrFormat("nvme: swap file in %s on %s, %s, alignment %d\n", path.path,
                             path.filesystem.empty() ? "?" : path.filesystem,
                             path.direct_io ? "O_DIRECT" : "buffered (O_DIRECT refused)",
                             path.alignment);
  }
  for (const std::string& warning : stats.warnings) human << "nvme: warning: " << warning << "\n";
  human.flush();
}

// cpu-nvme, nvme-cpu, gpu-nvme, nvme-gpu: NVMe-homed tensors.
absl::Status run_nvme_group(const Options& o, const Config& base,
                            const std::vector<std::string>& dirs, PathsResult& result,
                            std::ostream& human) {
  const bool gpu = o.wants(kGpuNvme) || o.wants(kNvmeGpu);
  auto runtime = make_runtime(sized_config(o, base, dirs, gpu));
  if (!runtime.ok()) return runtime.status();
  Runtime& rt = **runtime;
  if (rt.nvme() == nullptr) return absl::InternalError("the runtime has no NVMe tier");
  describe_swap(rt, result, human);
  auto stream = rt.device().create_stream();
  if (!stream.ok()) return stream.status();
  StoreBench bench(rt, **stream, o);
  if (absl::Status status = bench.create(TierKind::kNvme); !status.ok()) return status;

  std::unique_ptr<RawIo> raw;
  std::unique_ptr<GpuBaseline> link;
  if (o.baseline) {
    const ResolvedConfig& c = rt.config();
    auto created = RawIo::create(
        {.dirs = c.nvme_paths, .bytes = o.bytes, .block = c.io_block, .depth = c.io_depth});
    if (created.ok()) {
      raw = *std::move(created);
      result.notes.push_back(absl::StrFormat(
          "nvme baseline: fio-equivalent io_uring, O_DIRECT, bs=%s, iodepth=%d, one job per "
          "directory (%d), plain READ/WRITE on an O_TMPFILE file in the same directory",
          format_bytes(c.io_block), c.io_depth, c.nvme_paths.size()));
      if (auto buffered = raw->buffered_dirs(); !buffered.empty()) {
        result.notes.push_back("nvme baseline: O_DIRECT refused in " +
                               absl::StrJoin(buffered, ",") + ": buffered I/O there");
      }
    } else if (absl::IsUnavailable(created.status())) {
      result.notes.push_back("nvme baseline: none: " + std::string(created.status().message()));
    } else {
      return created.status();
    }
    if (gpu) {
      auto made = GpuBaseline::create(rt.device(), o.bytes, o.tensor_bytes);
      if (!made.ok()) return made.status();
      link = *std::move(made);
      result.notes.push_back(
          "gpu-nvme, nvme-gpu baseline: the lower of the nvme and gpu baselines, both measured "
          "for the row");
    }
  }
  const uint64_t raw_bytes = raw ? raw->bytes() : 0;
  const auto raw_write = raw ? Pass([&] { return raw->write_pass(); }) : Pass();
  const auto raw_read = raw ? Pass([&] { return raw->read_pass(); }) : Pass();
  const auto h2d = link ? Pass([&] { return link->host_to_device(); }) : Pass();
  const auto d2h = link ? Pass([&] { return link->device_to_host(); }) : Pass();
  // The read paths start from bytes on NVMe only (no CPU copy to fetch from instead).
  const auto on_nvme_only = [&]() -> absl::Status {
    if (absl::Status status = bench.write(TierKind::kCpu); !status.ok()) return status;
    if (absl::Status status = bench.flush(); !status.ok()) return status;
    return bench.evict_all(TierKind::kCpu);
  };
  const auto cold = [&]() -> absl::Status {
    if (absl::Status status = bench.evict_all(TierKind::kGpu); !status.ok()) return status;
    return bench.evict_all(TierKind::kCpu);
  };
  // After a write path, read back from NVMe itself.
  const auto verify_nvme = [&](std::string_view path) {
    return [&, path]() -> absl::Status {
      if (absl::Status status = cold(); !status.ok()) return status;
      return bench.verify(TierKind::kCpu, path);
    };
  };
  std::vector<PathPlan> plans;
  if (o.wants(kCpuNvme)) {
    plans.push_back({.path = kCpuNvme,
                     .prepare = [&] { return bench.write(TierKind::kCpu); },
                     .runtime = [&] { return bench.flush(); },
                     .verify = verify_nvme(kCpuNvme),
                     .baseline = raw_write,
                     .baseline_bytes = raw_bytes,
                     .nvme_baseline = true});
  }
  if (o.wants(kNvmeCpu)) {
    plans.push_back({.path = kNvmeCpu,
                     .setup = on_nvme_only,
                     .prepare = [&] { return bench.evict_all(TierKind::kCpu); },
                     .runtime = [&] { return bench.acquire_all(TierKind::kCpu, true); },
                     .verify = [&] { return bench.verify(TierKind::kCpu, kNvmeCpu); },
                     .baseline = raw_read,
                     .baseline_bytes = raw_bytes,
                     .nvme_baseline = true});
  }
  if (o.wants(kGpuNvme)) {
    plans.push_back({.path = kGpuNvme,
                     .prepare = [&]() -> absl::Status {
                       if (absl::Status status = cold(); !status.ok()) return status;
                       return bench.write(TierKind::kGpu);
                     },
                     // Several write-backs at once (flush), as cpu-nvme: one evict() waits for
                     // its tensor's write, so a loop of them drains the drives at every
                     // tensor. The evictions after it are clean: no I/O.
                     .runtime = [&]() -> absl::Status {
                       if (absl::Status status = bench.flush(); !status.ok()) return status;
                       return bench.evict_all(TierKind::kGpu);
                     },
                     .verify = verify_nvme(kGpuNvme),
                     .baseline = raw_write,
                     .baseline_bytes = raw_bytes,
                     .nvme_baseline = true,
                     .second_baseline = d2h,
                     .second_baseline_bytes = o.bytes});
  }
  if (o.wants(kNvmeGpu)) {
    plans.push_back({.path = kNvmeGpu,
                     .setup = on_nvme_only,
                     .prepare = cold,
                     .runtime = [&] { return bench.acquire_all(TierKind::kGpu, true); },
                     .verify = [&] { return bench.verify(TierKind::kGpu, kNvmeGpu); },
                     .baseline = raw_read,
                     .baseline_bytes = raw_bytes,
                     .nvme_baseline = true,
                     .second_baseline = h2d,
                     .second_baseline_bytes = o.bytes});
  }
  for (const PathPlan& plan : plans) {
    if (absl::Status status = run_plan(o, plan, bench, result.rows, result.notes); !status.ok()) {
      return status;
    }
  }
  const IoStats io = rt.nvme()->stats().io;
  human << absl::StrFormat(
      "nvme: %d writes, %d reads, max %d in flight, %d retries, %d errors, %d checksum "
      "failures\n",
      io.writes, io.reads, io.max_in_flight, io.retries, io.errors,
      rt.nvme()->stats().checksum_failures);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PathsResult> run_store_paths(const Options& options, const Config& config,
                                            const std::vector<std::string>& nvme_dirs,
                                            std::ostream& human) {
  PathsResult result;
  if (options.wants(kCpuGpu) || options.wants(kGpuCpu)) {
    if (absl::Status status = run_gpu_group(options, config, result); !status.ok()) return status;
  }
  bool nvme = false;
  for (const std::string& path : options.paths) nvme |= is_nvme_path(path);
  if (nvme) {
    if (absl::Status status = run_nvme_group(options, config, nvme_dirs, result, human);
        !status.ok()) {
      return status;
    }
  }
  // kAllPaths order, whichever group ran a path.
  std::stable_sort(result.rows.begin(), result.rows.end(), [](const Row& a, const Row& b) {
    const auto rank = [](const std::string& p) {
      return std::find(std::begin(kAllPaths), std::end(kAllPaths), p) - std::begin(kAllPaths);
    };
    return rank(a.path) < rank(b.path);
  });
  return result;
}

}  // namespace strata::bench
