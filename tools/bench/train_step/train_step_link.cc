#include "bench/train_step/train_step_link.h"

#include <absl/time/clock.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "bench/common.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

constexpr int kProbeRepeats = 5;

uint64_t cpu_footprint(uint64_t bytes) { return round_up(bytes, kPage); }

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Seconds per call of `pass`: one untimed warm-up (first touches), then the median of
// kProbeRepeats.
absl::StatusOr<double> time_median(const std::function<absl::Status()>& pass) {
  if (absl::Status status = pass(); !status.ok()) return status;
  std::vector<double> seconds;
  for (int i = 0; i < kProbeRepeats; ++i) {
    const absl::Time start = absl::Now();
    if (absl::Status status = pass(); !status.ok()) return status;
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return median(seconds);
}

}  // namespace

absl::StatusOr<double> probe_h2d(Device& device, uint64_t bytes) {
  auto memory = device.allocate_device_memory(bytes);
  if (!memory.ok()) return memory.status();
  auto pinned = device.allocate_pinned(bytes, "train-step link probe");
  if (!pinned.ok()) return pinned.status();
  auto stream = device.create_stream();
  if (!stream.ok()) return stream.status();
  fill_pattern(static_cast<std::byte*>((*pinned)->data()), bytes, /*seed=*/7);
  auto seconds = time_median([&]() -> absl::Status {
    for (uint64_t i = 0; i < kProbeLayers; ++i) {
      if (auto status = device.copy_async((*memory)->data(), (*pinned)->data(), bytes,
                                          CopyKind::kHostToDevice, **stream);
          !status.ok()) {
        return status;
      }
    }
    return device.synchronize(**stream);
  });
  if (!seconds.ok()) return seconds.status();
  return static_cast<double>(kProbeLayers * bytes) / *seconds;
}

// The raw NVMe read: one extent of kProbeLayers layers in the runtime's own swap space, read in
// one request (STRATA_IO_DEPTH units in flight) into the pinned CPU tier (registered with
// io_uring, as the staging chunks are), checksums included.
absl::StatusOr<double> probe_nvme_read(MemoryTier& cpu, SwapSpace& swap, uint64_t layer_bytes) {
  const uint64_t bytes = kProbeLayers * layer_bytes;
  auto block = cpu.allocate(cpu_footprint(bytes));
  if (!block.ok()) return block.status();
  absl::Status pinned = cpu.pin(*block);
  auto address = cpu.address(*block);
  auto extent = swap.allocate(bytes, "train-step link probe");
  absl::StatusOr<double> result = absl::InternalError("not measured");
  if (!pinned.ok()) {
    result = pinned;
  } else if (!address.ok()) {
    result = address.status();
  } else if (!extent.ok()) {
    result = extent.status();
  } else {
    auto* buffer = static_cast<std::byte*>(*address);
    fill_pattern(buffer, bytes, /*seed=*/11);
    absl::Status written = swap.write_sync(*extent, buffer, bytes);
    auto seconds = written.ok()
                       ? time_median([&] { return swap.read_sync(*extent, buffer, bytes); })
                       : absl::StatusOr<double>(written);
    result = seconds.ok() ? absl::StatusOr<double>(static_cast<double>(bytes) / *seconds)
                          : seconds.status();
  }
  if (extent.ok()) (void)swap.free(*extent);
  if (pinned.ok()) (void)cpu.unpin(*block);
  (void)cpu.free(*block);
  return result;
}

}  // namespace strata::bench
