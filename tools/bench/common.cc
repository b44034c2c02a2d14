#include "bench/common.h"

#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cstring>
#include <ctime>

namespace strata::bench {
namespace {

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double cpu_seconds() {
  // CLOCK_PROCESS_CPUTIME_ID counts every thread of the process, io_uring's io-wq workers and
  // the engine's threads included: the CPU a path costs, not only the main thread's.
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Accumulates timed repetitions of one pass.
class Samples {
 public:
  explicit Samples(uint64_t bytes) : bytes_(bytes) {}

  absl::Status time(const Pass& pass) {
    const double cpu_start = cpu_seconds();
    const absl::Time start = absl::Now();
    if (absl::Status status = pass(); !status.ok()) return status;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const double gb = static_cast<double>(bytes_) / 1e9;
    gbps_.push_back(gb / seconds);
    cpu_per_gb_.push_back((cpu_seconds() - cpu_start) / gb);
    return absl::OkStatus();
  }

  Summary summary() const {
    Summary s;
    s.min = *std::min_element(gbps_.begin(), gbps_.end());
    s.max = *std::max_element(gbps_.begin(), gbps_.end());
    s.median = median_of(gbps_);
    s.cpu_seconds_per_gb = median_of(cpu_per_gb_);
    return s;
  }

 private:
  uint64_t bytes_;
  std::vector<double> gbps_;
  std::vector<double> cpu_per_gb_;
};

absl::Status run_if(const Pass& pass) { return pass ? pass() : absl::OkStatus(); }

absl::Status run_untimed(const Pass& prepare, const Pass& pass, const Pass& settled) {
  if (absl::Status status = run_if(prepare); !status.ok()) return status;
  if (absl::Status status = run_if(settled); !status.ok()) return status;
  if (absl::Status status = pass(); !status.ok()) return status;
  return run_if(settled);
}

}  // namespace

bool Options::wants(std::string_view path) const {
  return std::find(paths.begin(), paths.end(), path) != paths.end();
}

Row make_row(const Options& options, std::string_view path, const Summary& runtime) {
  Row r;
  r.path = std::string(path);
  r.tensor_bytes = std::min(options.tensor_bytes, options.bytes);
  r.total_bytes = options.bytes;
  r.repeats = options.repeat;
  r.runtime = runtime;
  return r;
}

absl::StatusOr<double> time_pass(uint64_t bytes, const Pass& pass) {
  Samples samples(bytes);
  if (absl::Status status = samples.time(pass); !status.ok()) return status;
  return samples.summary().median;
}

absl::StatusOr<Summary> measure(uint64_t bytes, uint64_t repeat, const Pass& pass,
                                const Pass& prepare, const Pass& settled) {
  // The warm-up takes first touches, page faults, clock ramp-up and, on NVMe, the conversion of
  // preallocated (unwritten) extents out of the timed passes.
  if (absl::Status status = run_untimed(prepare, pass, settled); !status.ok()) return status;
  Samples samples(bytes);
  for (uint64_t i = 0; i < repeat; ++i) {
    if (absl::Status status = run_if(prepare); !status.ok()) return status;
    if (absl::Status status = run_if(settled); !status.ok()) return status;
    if (absl::Status status = samples.time(pass); !status.ok()) return status;
    if (absl::Status status = run_if(settled); !status.ok()) return status;
  }
  return samples.summary();
}

absl::StatusOr<PairedSummary> measure_paired(uint64_t bytes, uint64_t repeat, const Pass& runtime,
                                             const Pass& baseline, const Pass& prepare,
                                             const Pass& settled) {
  if (absl::Status status = run_untimed(prepare, runtime, settled); !status.ok()) return status;
  if (absl::Status status = baseline(); !status.ok()) return status;
  Samples runtime_samples(bytes), baseline_samples(bytes);
  for (uint64_t i = 0; i < repeat; ++i) {
    if (absl::Status status = run_if(prepare); !status.ok()) return status;
    if (absl::Status status = run_if(settled); !status.ok()) return status;
    // ABBA order: whichever pass runs first after the untimed gap (prepare) or right after the
    // other's burst of I/O is the runtime in even repetitions and the baseline in odd ones, so
    // devices with write-back caches or rate-limit buckets do not favour one side.
    const bool runtime_first = i % 2 == 0;
    Samples& first = runtime_first ? runtime_samples : baseline_samples;
    Samples& second = runtime_first ? baseline_samples : runtime_samples;
    if (absl::Status status = first.time(runtime_first ? runtime : baseline); !status.ok()) {
      return status;
    }
    if (runtime_first) {
      if (absl::Status status = run_if(settled); !status.ok()) return status;
    }
    if (absl::Status status = second.time(runtime_first ? baseline : runtime); !status.ok()) {
      return status;
    }
    if (!runtime_first) {
      if (absl::Status status = run_if(settled); !status.ok()) return status;
    }
  }
  return PairedSummary{runtime_samples.summary(), baseline_samples.summary()};
}

void fill_pattern(std::byte* data, uint64_t bytes, uint64_t seed) {
  // splitmix64 of the word index: cheap, and no two 4 KiB blocks are alike.
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t z = seed + (i / 8 + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(data + i, &z, 8);
  }
  for (; i < bytes; ++i) data[i] = static_cast<std::byte>(i * 131 + seed);
}

bool is_gpu_path(std::string_view path) {
  return path == kCpuGpu || path == kGpuCpu || path == kGpuNvme || path == kNvmeGpu;
}

bool is_nvme_path(std::string_view path) {
  return path == kCpuNvme || path == kNvmeCpu || path == kGpuNvme || path == kNvmeGpu;
}

}  // namespace strata::bench
