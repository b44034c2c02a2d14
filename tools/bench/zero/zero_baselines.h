// The ZeRO stage 3 workload's pieces besides the engine (bench/zero/zero_workload.h): the simulated
// compute, which does real arithmetic on the host, and the raw baselines of its overlap bound —
// one layer's all_gather and reduce_scatter through the Communicator called directly, and the
// read of a rank's shard from NVMe with io_uring (bench/raw_io.h). Every baseline runs on every
// rank at once; each sample is the slowest rank's (an all-reduce max), the figure the median.
#pragma once

#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/runtime/runtime.h"

namespace strata::bench {

// The compute kernel: y = a·x + y over two fp32 buffers of kComputeBufferBytes each, cycled
// (memory-bound on most machines; it vectorises without -ffast-math). Its rate is measured once
// (the median of several passes on this rank while every rank does the same); a layer's compute
// is then the number of elements that took --layer-compute at that rate, whatever it takes
// later (on a busy machine, longer: the step's measured compute is what the bound uses).
inline constexpr uint64_t kComputeBufferBytes = uint64_t{4} << 20;

struct ComputeCalibration {
  double ns_per_element = 0;        // the slowest rank's median
  uint64_t elements_per_layer = 0;  // at --layer-compute
  std::vector<double> samples_ns;   // per pass, ns per element, slowest rank
};

class HostCompute {
 public:
  HostCompute();
  HostCompute(const HostCompute&) = delete;
  HostCompute& operator=(const HostCompute&) = delete;

  // Measures the rate (every rank at once, barriers through `comm`) and sizes a layer's work.
  absl::StatusOr<ComputeCalibration> calibrate(Communicator& comm, absl::Duration layer_compute);
  // Runs `elements` element updates; returns the seconds they took.
  double run(uint64_t elements);
  // A value of the buffers, so that the work is observable.
  double checksum() const;

 private:
  std::vector<float> x_;
  std::vector<float> y_;
  uint64_t at_ = 0;     // where the next run continues in the buffers
  uint64_t calls_ = 0;  // alternates the sign of a, so y stays bounded
};

struct RawCollectiveTimes {
  uint64_t calls_per_sample = 0;
  double all_gather_seconds = 0;      // one layer (gathered bytes), the median
  double reduce_scatter_seconds = 0;  // one layer (its padded gradient bytes), the median
  std::vector<double> all_gather_samples;
  std::vector<double> reduce_scatter_samples;
};

// One layer's collectives as the engine issues them (in `tier`, in place, `shard` fp16 elements
// per rank), through `comm` directly: one warm-up sample and `samples` timed ones of
// `calls_per_sample` calls, each waited for on the host (synchronize()).
absl::StatusOr<RawCollectiveTimes> time_raw_collectives(Runtime& runtime, Communicator& comm,
                                                        TierKind tier, uint64_t shard,
                                                        uint64_t samples,
                                                        uint64_t calls_per_sample);

// Appends `more`'s samples to `into`'s and takes the medians of them all.
void merge(RawCollectiveTimes& into, const RawCollectiveTimes& more);

struct RawReadTimes {
  uint64_t bytes = 0;  // read per sample, per rank
  double seconds = 0;  // the median
  std::vector<double> samples;
  std::vector<std::string> buffered_dirs;  // O_DIRECT refused there (buffered reads)
  std::string describe;                    // for the notes
};

// This rank's shard of the model read from `dirs` with io_uring (written once first), every rank
// at once: one warm-up and `samples` timed reads. Unavailable when io_uring is refused here.
absl::StatusOr<RawReadTimes> time_raw_shard_read(Communicator& comm,
                                                 const std::vector<std::string>& dirs,
                                                 uint64_t bytes, uint64_t block, uint32_t depth,
                                                 uint64_t samples);

// The lower middle value (by value) of `values`, and its index.
size_t lower_median_index(const std::vector<double>& values);
double lower_median(const std::vector<double>& values);

}  // namespace strata::bench
