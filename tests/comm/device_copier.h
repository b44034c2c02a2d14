// Moves bytes between host vectors and a device's memory for the comm tests, through one pinned
// staging buffer and one stream, each copy waited for. A test body then runs its collectives on
// device memory whatever the device: the host backend's (Gloo) or a GPU's (NCCL).
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "strata/device/device.h"

namespace strata::testing {

class DeviceCopier {
 public:
  explicit DeviceCopier(Device& device) : device_(device) {
    auto stream = device.create_stream();
    REQUIRE(stream.ok());
    stream_ = *std::move(stream);
  }

  Device& device() const { return device_; }

  // Device memory of `bytes` (at least one: CUDA allocates nothing for zero).
  std::unique_ptr<DeviceMemory> allocate(uint64_t bytes) {
    auto memory = device_.allocate_device_memory(bytes == 0 ? 1 : bytes);
    REQUIRE(memory.ok());
    return *std::move(memory);
  }
  // Device memory holding `host`.
  std::unique_ptr<DeviceMemory> copy_of(const std::vector<uint8_t>& host) {
    std::unique_ptr<DeviceMemory> memory = allocate(host.size());
    upload(memory->data(), host.data(), host.size());
    return memory;
  }

  void upload(void* device_dst, const void* host_src, uint64_t bytes) {
    if (bytes == 0) return;
    std::memcpy(staging(bytes), host_src, bytes);
    REQUIRE(
        device_.copy_async(device_dst, staging_->data(), bytes, CopyKind::kHostToDevice, *stream_)
            .ok());
    REQUIRE(device_.synchronize(*stream_).ok());
  }
  std::vector<uint8_t> download(const void* device_src, uint64_t bytes) {
    std::vector<uint8_t> host(bytes);
    if (bytes == 0) return host;
    REQUIRE(device_.copy_async(staging(bytes), device_src, bytes, CopyKind::kDeviceToHost, *stream_)
                .ok());
    REQUIRE(device_.synchronize(*stream_).ok());
    std::memcpy(host.data(), staging_->data(), bytes);
    return host;
  }

 private:
  void* staging(uint64_t bytes) {
    if (staging_ == nullptr || staging_->size() < bytes) {
      auto pinned = device_.allocate_pinned(bytes, "test staging");
      REQUIRE(pinned.ok());
      staging_ = *std::move(pinned);
    }
    return staging_->data();
  }

  Device& device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<PinnedHostMemory> staging_;
};

}  // namespace strata::testing
