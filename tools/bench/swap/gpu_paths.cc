#include "bench/swap/gpu_paths.h"

#include <absl/status/status.h>

#include <algorithm>
#include <cstring>

#include "strata/device/backend.h"

namespace strata::bench {

// A device allocation, a pinned buffer and a stream of the device.
struct GpuBaseline::Buffers {
  std::unique_ptr<DeviceMemory> device_memory;
  std::unique_ptr<PinnedHostMemory> pinned;
  std::unique_ptr<Stream> stream;
  std::byte* from = nullptr;
  std::byte* to = nullptr;
};

GpuBaseline::GpuBaseline(Device& device, uint64_t bytes, uint64_t piece_bytes,
                         std::unique_ptr<Buffers> buffers)
    : device_(device), bytes_(bytes), piece_bytes_(piece_bytes), buffers_(std::move(buffers)) {}

GpuBaseline::~GpuBaseline() = default;

absl::StatusOr<std::unique_ptr<GpuBaseline>> GpuBaseline::create(Device& device, uint64_t bytes,
                                                                 uint64_t piece_bytes) {
  // The same kinds of memory and the same copy the store's moves use (device memory, pinned
  // host memory, copy_async on a stream of the device), on every backend: on the host backend
  // that is a memcpy on the device's worker thread, as the runtime's host-simulated copies are.
  auto buffers = std::make_unique<Buffers>();
  auto memory = device.allocate_device_memory(bytes);
  if (!memory.ok()) return memory.status();
  auto pinned = device.allocate_pinned(bytes, "baseline buffer");
  if (!pinned.ok()) return pinned.status();
  auto stream = device.create_stream();
  if (!stream.ok()) return stream.status();
  buffers->device_memory = *std::move(memory);
  buffers->pinned = *std::move(pinned);
  buffers->stream = *std::move(stream);
  buffers->to = static_cast<std::byte*>(buffers->device_memory->data());
  buffers->from = static_cast<std::byte*>(buffers->pinned->data());
  std::memset(buffers->from, 1, bytes);
  const uint64_t piece =
      device.backend() == Backend::kHost ? std::clamp<uint64_t>(piece_bytes, 1, bytes) : bytes;
  return std::make_unique<GpuBaseline>(device, bytes, piece, std::move(buffers));
}

absl::Status GpuBaseline::host_to_device() { return copy(true); }
absl::Status GpuBaseline::device_to_host() { return copy(false); }

absl::Status GpuBaseline::copy(bool to_device) {
  Buffers& b = *buffers_;
  const CopyKind kind = to_device ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost;
  for (uint64_t offset = 0; offset < bytes_; offset += piece_bytes_) {
    const uint64_t n = std::min(piece_bytes_, bytes_ - offset);
    std::byte* device_side = b.to + offset;
    std::byte* host_side = b.from + offset;
    if (auto status = device_.copy_async(to_device ? device_side : host_side,
                                         to_device ? host_side : device_side, n, kind, *b.stream);
        !status.ok()) {
      return status;
    }
  }
  return device_.synchronize(*b.stream);
}

uint64_t gpu_tier_bytes(uint64_t bytes) {
  return round_up(bytes + std::min<uint64_t>(bytes / 32, uint64_t{64} << 20) + (1 << 20));
}

const char* gpu_baseline_description(const Device& device) {
  return device.backend() == Backend::kHost
             ? "copy_async between the host device's memory and pinned memory, in pieces of the "
               "row's tensor size (memcpys on the device's worker thread, as the runtime's "
               "copies are)"
             : "cudaMemcpyAsync between plain pinned and device buffers";
}

}  // namespace strata::bench
