// What every offload-bench path shares: the options, a result row, and timing.
#pragma once

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::bench {

// The paths offload-bench knows, in the order it runs and prints them.
inline constexpr std::string_view kCpuGpu = "cpu-gpu";
inline constexpr std::string_view kGpuCpu = "gpu-cpu";
inline constexpr std::string_view kCpuNvme = "cpu-nvme";
inline constexpr std::string_view kNvmeCpu = "nvme-cpu";
inline constexpr std::string_view kGpuNvme = "gpu-nvme";
inline constexpr std::string_view kNvmeGpu = "nvme-gpu";
inline constexpr std::string_view kAllPaths[] = {kCpuGpu,  kGpuCpu,  kCpuNvme,
                                                 kNvmeCpu, kGpuNvme, kNvmeGpu};

bool is_gpu_path(std::string_view path);   // touches the GPU tier
bool is_nvme_path(std::string_view path);  // touches the NVMe tier

struct Options {
  uint64_t bytes = uint64_t{256} << 20;
  uint64_t tensor_bytes = uint64_t{64} << 20;  // the size being measured
  std::vector<uint64_t> tensor_sizes;          // --tensor-bytes: the sweep, in the given order
  uint64_t repeat = 5;
  bool baseline = true;
  std::string json;
  std::string csv;
  std::string svg;
  std::vector<std::string> paths;  // a subset of kAllPaths, in kAllPaths order

  bool wants(std::string_view path) const;
  uint64_t tensors() const { return (bytes + tensor_bytes - 1) / tensor_bytes; }
};

inline constexpr uint64_t kPage = 4096;
inline uint64_t round_up(uint64_t bytes, uint64_t to = kPage) { return (bytes + to - 1) / to * to; }

struct Summary {
  double median = 0, min = 0, max = 0;  // GB/s (1e9 bytes/s)
  double cpu_seconds_per_gb = 0;        // median process CPU time (all threads) per GB moved
};

// The NVMe paths' use of the store over a row's timed passes: the staging pool (the pinned
// bounce buffers of NVMe <-> GPU moves, STRATA_STAGING_BYTES) and the reads in flight.
struct NvmeUse {
  uint64_t bytes = 0;        // the pool: STRATA_STAGING_BYTES in whole chunks
  uint64_t chunk_bytes = 0;  // the largest lease
  uint64_t peak_leases = 0;  // the most held at once in any timed pass
  uint64_t peak_bytes = 0;   // the most bytes held at once
  uint64_t waits = 0;        // leases that could not be taken at once, over the timed passes
  double wait_seconds = 0;
  uint64_t fetches_in_flight_peak = 0;  // StoreStats: tensors' NVMe reads in flight at once
};

struct Row {
  std::string path;
  uint64_t tensor_bytes = 0;
  uint64_t total_bytes = 0;
  uint64_t repeats = 0;
  Summary runtime;
  std::optional<Summary> baseline;
  uint64_t baseline_bytes = 0;
  // The link check (bench/link_check.h): the fastest pass of the row's baseline, counting the
  // extra passes the check ran (link_rechecks) before believing a figure above the link, and the
  // least noise it allows for: more for an NVMe baseline, which a disk the host caches can beat.
  double link_gbps = 0;
  uint64_t link_rechecks = 0;
  bool nvme_link = false;
  std::optional<NvmeUse> nvme_use;  // the NVMe paths' rows
};

// A row for `path` with the options' sizes filled in.
Row make_row(const Options& options, std::string_view path, const Summary& runtime);

using Pass = std::function<absl::Status()>;

// Runs `pass` (which moves `bytes`) once to warm up, then `repeat` timed times. `prepare`, when
// given, runs untimed before each pass. `settled`, when given, runs untimed after `prepare` and
// after each pass and fails the measurement when work is still in flight: a pass's time must
// include all of its work, and no other pass may run beside it.
absl::StatusOr<Summary> measure(uint64_t bytes, uint64_t repeat, const Pass& pass,
                                const Pass& prepare = nullptr, const Pass& settled = nullptr);

// One timed run of `pass`, which moves `bytes`: GB/s.
absl::StatusOr<double> time_pass(uint64_t bytes, const Pass& pass);

// The runtime and its baseline, alternated repetition by repetition in ABBA order (one warm-up
// each first), so that drift on a shared machine (other tenants, host caches, thermal) hits both
// alike. `prepare` runs untimed at the start of each repetition; `settled` as for measure(),
// after `prepare` and after each runtime pass, so no baseline pass overlaps the runtime's work.
struct PairedSummary {
  Summary runtime;
  Summary baseline;
};
absl::StatusOr<PairedSummary> measure_paired(uint64_t bytes, uint64_t repeat, const Pass& runtime,
                                             const Pass& baseline, const Pass& prepare = nullptr,
                                             const Pass& settled = nullptr);

// Fills `bytes` with data in which every 8-byte word differs from its neighbours, so that a unit
// written to or read from the wrong place is caught by the comparison, not only lost bytes.
void fill_pattern(std::byte* data, uint64_t bytes, uint64_t seed);

}  // namespace strata::bench
