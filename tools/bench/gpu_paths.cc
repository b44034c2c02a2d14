#include "bench/gpu_paths.h"

#include <absl/status/status.h>

#include <algorithm>
#include <cstring>

#include "strata/backend.h"
#include "strata/tier.h"

namespace strata::bench {
namespace {

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

absl::Status add_baselines(const Options& options, Device& device, std::vector<Row>& rows) {
  const uint64_t bytes = options.bytes;
  if (device.backend() == Backend::kCuda) {
    // Raw cudaMemcpyAsync between a plain pinned buffer and a plain device allocation.
    auto memory = device.allocate_device_memory(bytes);
    auto pinned = device.allocate_pinned(bytes, "baseline buffer");
    auto stream = device.create_stream();
    if (!memory.ok()) return memory.status();
    if (!pinned.ok()) return pinned.status();
    if (!stream.ok()) return stream.status();
    auto* dev = static_cast<std::byte*>((*memory)->data());
    auto* host = static_cast<std::byte*>((*pinned)->data());
    std::memset(host, 1, bytes);
    for (auto& row : rows) {
      const CopyKind kind = row.path == kCpuGpu ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost;
      auto result = measure(bytes, options.repeat, [&] {
        return kind == CopyKind::kHostToDevice
                   ? copy_all(device, **stream, dev, host, bytes, bytes, kind)
                   : copy_all(device, **stream, host, dev, bytes, bytes, kind);
      });
      if (!result.ok()) return result.status();
      row.baseline = *result;
      row.baseline_bytes = bytes;
    }
    return absl::OkStatus();
  }
  // Host backend: memcpy between two page-aligned buffers on this thread.
  std::vector<std::byte> a(bytes + kPage), b(bytes + kPage);
  auto align = [](std::vector<std::byte>& v) {
    auto p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<std::byte*>(round_up(p));
  };
  std::byte* from = align(a);
  std::byte* to = align(b);
  std::memset(from, 1, bytes);
  for (auto& row : rows) {
    auto result = measure(bytes, options.repeat, [&] {
      std::memcpy(to, from, bytes);
      return absl::OkStatus();
    });
    if (!result.ok()) return result.status();
    row.baseline = *result;
    row.baseline_bytes = bytes;
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t gpu_tier_bytes(uint64_t bytes) {
  return round_up(bytes + std::min<uint64_t>(bytes / 32, uint64_t{64} << 20) + (1 << 20));
}

absl::StatusOr<std::vector<Row>> run_gpu_paths(const Options& options, Device& device,
                                               std::byte* source, std::byte* landing) {
  auto gpu = MemoryTier::create_gpu_arena(device, gpu_tier_bytes(options.bytes));
  if (!gpu.ok()) return gpu.status();
  auto stream = device.create_stream();
  if (!stream.ok()) return stream.status();
  // One tensor-sized run of blocks, pinned for the whole run (as a trainer would hold acquired
  // tensors).
  auto gpu_block = (*gpu)->allocate(options.bytes);
  if (!gpu_block.ok()) return gpu_block.status();
  if (absl::Status status = (*gpu)->pin(*gpu_block); !status.ok()) return status;
  auto* dev = static_cast<std::byte*>(*(*gpu)->address(*gpu_block));
  std::memset(landing, 0, options.bytes);

  std::vector<Row> rows;
  // gpu-cpu needs the data on the GPU even when cpu-gpu is not measured.
  auto h2d = [&] {
    return copy_all(device, **stream, dev, source, options.bytes, options.tensor_bytes,
                    CopyKind::kHostToDevice);
  };
  if (options.wants(kCpuGpu)) {
    auto result = measure(options.bytes, options.repeat, h2d);
    if (!result.ok()) return result.status();
    rows.push_back(make_row(options, kCpuGpu, *result));
  } else if (absl::Status status = h2d(); !status.ok()) {
    return status;
  }
  auto d2h = [&] {
    return copy_all(device, **stream, landing, dev, options.bytes, options.tensor_bytes,
                    CopyKind::kDeviceToHost);
  };
  if (options.wants(kGpuCpu)) {
    auto result = measure(options.bytes, options.repeat, d2h);
    if (!result.ok()) return result.status();
    rows.push_back(make_row(options, kGpuCpu, *result));
  } else if (absl::Status status = d2h(); !status.ok()) {
    return status;
  }
  // The round trip must have carried every byte: a bench that loses data measures nothing.
  if (std::memcmp(source, landing, options.bytes) != 0) {
    return absl::DataLossError("cpu-gpu-cpu round trip changed the data; this is a bug");
  }
  if (options.baseline) {
    if (absl::Status status = add_baselines(options, device, rows); !status.ok()) return status;
  }
  return rows;
}

const char* gpu_baseline_description(const Device& device) {
  return device.backend() == Backend::kHost
             ? "memcpy between page-aligned host buffers"
             : "cudaMemcpyAsync between plain pinned and device buffers";
}

}  // namespace strata::bench
