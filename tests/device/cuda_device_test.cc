// Device behaviour that must hold on every backend: each test runs on HostDevice and, tagged
// [cuda], on a real GPU when one is visible. Device memory is only touched through copies.
#include <absl/synchronization/notification.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "device_fixtures.h"

namespace strata {
namespace {

std::vector<std::byte> pattern(size_t bytes, uint32_t seed) {
  std::vector<std::byte> out(bytes);
  std::mt19937 rng(seed);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

STRATA_BOTH_BACKENDS("Round trip host -> device -> device -> host", "[device]") {
  constexpr uint64_t kBytes = (4 << 20) + 123;  // not a multiple of anything
  auto memory = device.allocate_device_memory(2 * kBytes);
  auto pinned = device.allocate_pinned(2 * kBytes, "test buffer");
  auto stream = device.create_stream();
  REQUIRE(memory.ok());
  REQUIRE(pinned.ok());
  REQUIRE(stream.ok());
  CHECK(reinterpret_cast<uintptr_t>((*pinned)->data()) % PinnedHostMemory::kAlignment == 0);
  auto* dev = static_cast<std::byte*>((*memory)->data());
  auto* host = static_cast<std::byte*>((*pinned)->data());
  const auto source = pattern(kBytes, 7);
  std::memcpy(host, source.data(), kBytes);

  REQUIRE(device.copy_async(dev, host, kBytes, CopyKind::kHostToDevice, **stream).ok());
  REQUIRE(device.copy_async(dev + kBytes, dev, kBytes, CopyKind::kDeviceToDevice, **stream).ok());
  REQUIRE(device.copy_async(host + kBytes, dev + kBytes, kBytes, CopyKind::kDeviceToHost, **stream)
              .ok());
  REQUIRE(device.synchronize(**stream).ok());
  CHECK(std::memcmp(host + kBytes, source.data(), kBytes) == 0);
}

STRATA_BOTH_BACKENDS("Work on one stream runs in issue order", "[device]") {
  constexpr uint64_t kBytes = 1 << 20;
  constexpr int kRounds = 32;
  auto memory = device.allocate_device_memory(kBytes);
  auto pinned = device.allocate_pinned(uint64_t{kRounds + 1} * kBytes, "test buffer");
  auto stream = device.create_stream();
  REQUIRE(memory.ok());
  REQUIRE(pinned.ok());
  REQUIRE(stream.ok());
  auto* host = static_cast<std::byte*>((*pinned)->data());
  for (int i = 0; i < kRounds; ++i) std::memset(host + uint64_t(i) * kBytes, i + 1, kBytes);
  // Each round overwrites the same device range and reads it back: any reordering shows.
  for (int i = 0; i < kRounds; ++i) {
    REQUIRE(device
                .copy_async((*memory)->data(), host + uint64_t(i) * kBytes, kBytes,
                            CopyKind::kHostToDevice, **stream)
                .ok());
    REQUIRE(device
                .copy_async(host + uint64_t(kRounds) * kBytes, (*memory)->data(), kBytes,
                            CopyKind::kDeviceToHost, **stream)
                .ok());
    REQUIRE(device.synchronize(**stream).ok());
    CHECK(host[uint64_t(kRounds) * kBytes] == std::byte(i + 1));
    CHECK(host[uint64_t(kRounds + 1) * kBytes - 1] == std::byte(i + 1));
  }
}

STRATA_BOTH_BACKENDS("An event orders work across streams", "[device]") {
  constexpr uint64_t kBytes = 8 << 20;
  auto memory = device.allocate_device_memory(kBytes);
  auto pinned = device.allocate_pinned(2 * kBytes, "test buffer");
  auto upload = device.create_stream();
  auto download = device.create_stream();
  auto landed = device.create_event();
  REQUIRE(memory.ok());
  REQUIRE(pinned.ok());
  REQUIRE(upload.ok());
  REQUIRE(download.ok());
  REQUIRE(landed.ok());
  auto* host = static_cast<std::byte*>((*pinned)->data());
  const auto source = pattern(kBytes, 11);
  std::memcpy(host, source.data(), kBytes);

  absl::Notification gate;  // holds the upload so the download would overtake it if unordered
  REQUIRE(device.launch_host_callback(**upload, [&gate] { gate.WaitForNotification(); }).ok());
  REQUIRE(
      device.copy_async((*memory)->data(), host, kBytes, CopyKind::kHostToDevice, **upload).ok());
  REQUIRE(device.record(**landed, **upload).ok());
  REQUIRE(device.wait(**download, **landed).ok());
  REQUIRE(
      device
          .copy_async(host + kBytes, (*memory)->data(), kBytes, CopyKind::kDeviceToHost, **download)
          .ok());
  CHECK_FALSE(*device.query(**landed));
  gate.Notify();
  REQUIRE(device.synchronize(**download).ok());
  CHECK(*device.query(**landed));
  CHECK(std::memcmp(host + kBytes, source.data(), kBytes) == 0);
}

STRATA_BOTH_BACKENDS("A host callback runs after earlier work on its stream", "[device]") {
  constexpr uint64_t kBytes = 1 << 20;
  auto memory = device.allocate_device_memory(kBytes);
  auto pinned = device.allocate_pinned(2 * kBytes, "test buffer");
  auto stream = device.create_stream();
  REQUIRE(memory.ok());
  REQUIRE(pinned.ok());
  REQUIRE(stream.ok());
  auto* host = static_cast<std::byte*>((*pinned)->data());
  std::memset(host, 0x5a, kBytes);
  std::memset(host + kBytes, 0, kBytes);
  bool saw_data = false;
  REQUIRE(
      device.copy_async((*memory)->data(), host, kBytes, CopyKind::kHostToDevice, **stream).ok());
  REQUIRE(
      device.copy_async(host + kBytes, (*memory)->data(), kBytes, CopyKind::kDeviceToHost, **stream)
          .ok());
  REQUIRE(device
              .launch_host_callback(**stream,
                                    [&] { saw_data = host[2 * kBytes - 1] == std::byte{0x5a}; })
              .ok());
  REQUIRE(device.synchronize(**stream).ok());
  CHECK(saw_data);
}

STRATA_BOTH_BACKENDS("A wrapped external stream waits on strata's event without owning the queue",
                     "[device]") {
  // The DLPack stream protocol: the consumer's stream (made outside strata, known by its native
  // handle) waits for strata's event; the host does not block.
  constexpr uint64_t kBytes = 4 << 20;
  auto memory = device.allocate_device_memory(kBytes);
  auto pinned = device.allocate_pinned(2 * kBytes, "test buffer");
  auto producer = device.create_stream();
  auto consumer_owner = device.create_stream();  // stands for the framework's stream
  auto ready = device.create_event();
  REQUIRE(memory.ok());
  REQUIRE(pinned.ok());
  REQUIRE(producer.ok());
  REQUIRE(consumer_owner.ok());
  REQUIRE(ready.ok());
  auto native = device.native_handle(**consumer_owner);
  REQUIRE(native.ok());
  auto consumer = device.wrap_external_stream(*native);
  REQUIRE(consumer.ok());
  auto wrapped_native = device.native_handle(**consumer);
  REQUIRE(wrapped_native.ok());
  CHECK(*wrapped_native == *native);
  auto* host = static_cast<std::byte*>((*pinned)->data());
  const auto source = pattern(kBytes, 13);
  std::memcpy(host, source.data(), kBytes);
  std::memset(host + kBytes, 0, kBytes);

  absl::Notification gate;
  REQUIRE(device.launch_host_callback(**producer, [&gate] { gate.WaitForNotification(); }).ok());
  REQUIRE(
      device.copy_async((*memory)->data(), host, kBytes, CopyKind::kHostToDevice, **producer).ok());
  REQUIRE(device.record(**ready, **producer).ok());
  REQUIRE(device.wait(**consumer, **ready).ok());  // returns with the producer held
  REQUIRE(
      device
          .copy_async(host + kBytes, (*memory)->data(), kBytes, CopyKind::kDeviceToHost, **consumer)
          .ok());
  consumer->reset();  // the wrapper goes; the queue and its work stay
  CHECK_FALSE(*device.query(**ready));
  gate.Notify();
  REQUIRE(device.synchronize(**consumer_owner).ok());
  CHECK(std::memcmp(host + kBytes, source.data(), kBytes) == 0);
}

STRATA_BOTH_BACKENDS("Copies wait for a host flag, the host does not", "[device]") {
  constexpr uint64_t kBytes = (1 << 20) + 17;
  auto memory = device.allocate_device_memory(kBytes);
  auto pinned = device.allocate_pinned(2 * kBytes, "test buffer");
  auto stream = device.create_stream();
  auto copied = device.create_event();
  auto flag = device.create_host_flag();
  REQUIRE(memory.ok());
  REQUIRE(pinned.ok());
  REQUIRE(stream.ok());
  REQUIRE(copied.ok());
  REQUIRE(flag.ok());
  auto* host = static_cast<std::byte*>((*pinned)->data());
  const auto source = pattern(kBytes, 17);
  std::memcpy(host, source.data(), kBytes);
  std::memset(host + kBytes, 0, kBytes);
  // The flag is raised once the host has looked (a watchdog raises it in any case, so that a
  // host that did block ends the test with a failure rather than a hang).
  absl::Notification looked;
  absl::Status raised;  // checked after the join: Catch2's assertions are not for other threads
  std::thread raiser([&] {
    looked.WaitForNotificationWithTimeout(absl::Seconds(60));
    raised = device.raise_host_flag(**flag);
  });
  REQUIRE(device.wait_host_flag(**stream, **flag).ok());  // returns with the flag down
  REQUIRE(
      device.copy_async((*memory)->data(), host, kBytes, CopyKind::kHostToDevice, **stream).ok());
  REQUIRE(
      device.copy_async(host + kBytes, (*memory)->data(), kBytes, CopyKind::kDeviceToHost, **stream)
          .ok());
  REQUIRE(device.record(**copied, **stream).ok());
  const bool held = !*device.query(**copied);
  looked.Notify();
  raiser.join();
  CHECK(raised.ok());
  CHECK(held);
  REQUIRE(device.synchronize(**stream).ok());
  CHECK(std::memcmp(host + kBytes, source.data(), kBytes) == 0);
}

TEST_CASE("CUDA wraps its default streams by their special handles", "[cuda]") {
  auto device = testing::cuda_device_or_skip();
  if (device == nullptr) return;
  auto memory = device->allocate_device_memory(1 << 20);
  auto pinned = device->allocate_pinned(2 << 20, "test buffer");
  REQUIRE(memory.ok());
  REQUIRE(pinned.ok());
  auto* host = static_cast<std::byte*>((*pinned)->data());
  std::memset(host, 0x3c, 1 << 20);
  // 0: the default stream; 1: cudaStreamLegacy; 2: cudaStreamPerThread (DLPack's stream=1 / 2).
  for (uintptr_t native : {uintptr_t{0}, uintptr_t{1}, uintptr_t{2}}) {
    auto stream = device->wrap_external_stream(native);
    REQUIRE(stream.ok());
    CHECK(*device->native_handle(**stream) == native);
    std::memset(host + (1 << 20), 0, 1 << 20);
    REQUIRE(device->copy_async((*memory)->data(), host, 1 << 20, CopyKind::kHostToDevice, **stream)
                .ok());
    REQUIRE(device
                ->copy_async(host + (1 << 20), (*memory)->data(), 1 << 20, CopyKind::kDeviceToHost,
                             **stream)
                .ok());
    REQUIRE(device->synchronize(**stream).ok());
    CHECK(host[(2 << 20) - 1] == std::byte{0x3c});
  }
}

STRATA_BOTH_BACKENDS("Overlapping device-to-device copies are refused", "[device]") {
  auto memory = device.allocate_device_memory(1 << 20);
  auto stream = device.create_stream();
  REQUIRE(memory.ok());
  REQUIRE(stream.ok());
  auto* base = static_cast<std::byte*>((*memory)->data());
  CHECK(absl::IsInvalidArgument(
      device.copy_async(base, base + 256, 4096, CopyKind::kDeviceToDevice, **stream)));
}

}  // namespace
}  // namespace strata
