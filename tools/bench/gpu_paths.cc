#include "bench/gpu_paths.h"

#include <absl/status/status.h>

#include <algorithm>
#include <cstring>

#include "strata/device/backend.h"

namespace strata::bench {

// CUDA: a device allocation, a pinned buffer and a stream; host: two page-aligned vectors.
struct GpuBaseline::Buffers {
  std::unique_ptr<DeviceMemory> device_memory;
  std::unique_ptr<PinnedHostMemory> pinned;
  std::unique_ptr<Stream> stream;
  std::vector<std::byte> a, b;
  std::byte* from = nullptr;
  std::byte* to = nullptr;
};

GpuBaseline::GpuBaseline(Device& device, uint64_t bytes, std::unique_ptr<Buffers> buffers)
    : device_(device), bytes_(bytes), buffers_(std::move(buffers)) {}

GpuBaseline::~GpuBaseline() = default;

absl::StatusOr<std::unique_ptr<GpuBaseline>> GpuBaseline::create(Device& device, uint64_t bytes) {
  auto buffers = std::make_unique<Buffers>();
  if (device.backend() == Backend::kCuda) {
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
  } else {
    buffers->a.resize(bytes + kPage);
    buffers->b.resize(bytes + kPage);
    auto align = [](std::vector<std::byte>& v) {
      return reinterpret_cast<std::byte*>(round_up(reinterpret_cast<uintptr_t>(v.data())));
    };
    buffers->from = align(buffers->a);
    buffers->to = align(buffers->b);
  }
  std::memset(buffers->from, 1, bytes);
  return std::make_unique<GpuBaseline>(device, bytes, std::move(buffers));
}

absl::Status GpuBaseline::host_to_device() { return copy(true); }
absl::Status GpuBaseline::device_to_host() { return copy(false); }

absl::Status GpuBaseline::copy(bool to_device) {
  Buffers& b = *buffers_;
  if (b.stream == nullptr) {
    // Host backend: one memcpy on this thread, what a host-simulated copy costs at best.
    if (to_device) {
      std::memcpy(b.to, b.from, bytes_);
    } else {
      std::memcpy(b.from, b.to, bytes_);
    }
    return absl::OkStatus();
  }
  const CopyKind kind = to_device ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost;
  if (auto status = device_.copy_async(to_device ? b.to : b.from, to_device ? b.from : b.to, bytes_,
                                       kind, *b.stream);
      !status.ok()) {
    return status;
  }
  return device_.synchronize(*b.stream);
}

uint64_t gpu_tier_bytes(uint64_t bytes) {
  return round_up(bytes + std::min<uint64_t>(bytes / 32, uint64_t{64} << 20) + (1 << 20));
}

const char* gpu_baseline_description(const Device& device) {
  return device.backend() == Backend::kHost
             ? "memcpy between page-aligned host buffers"
             : "cudaMemcpyAsync between plain pinned and device buffers";
}

}  // namespace strata::bench
