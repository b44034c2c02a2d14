// Device semantics on HostDevice: copies, streams, events and what CUDA would reject.
#include "strata/host_device.h"

#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <vector>

#include "device_fixtures.h"

namespace strata {
namespace {

using testing::host_device;

TEST_CASE("HostDevice rejects what cudaMemcpyAsync would reject", "[device]") {
  auto device = host_device();
  auto memory = device->allocate_device_memory(1 << 20);
  REQUIRE(memory.ok());
  auto stream = device->create_stream();
  REQUIRE(stream.ok());
  auto* base = static_cast<std::byte*>((*memory)->data());
  std::vector<std::byte> host(4096);

  SECTION("overlapping device-to-device copies") {
    auto status = device->copy_async(base + 100, base, 4096, CopyKind::kDeviceToDevice, **stream);
    CHECK(absl::IsInvalidArgument(status));
    CHECK_THAT(std::string(status.message()), Catch::Contains("overlapping"));
  }
  SECTION("device side outside every device allocation") {
    auto status =
        device->copy_async(host.data(), host.data() + 8, 8, CopyKind::kHostToDevice, **stream);
    CHECK(absl::IsInvalidArgument(status));
    CHECK_THAT(std::string(status.message()), Catch::Contains("not inside one device allocation"));
  }
  SECTION("device range running past its allocation") {
    auto status = device->copy_async(base + (1 << 20) - 8, host.data(), 64, CopyKind::kHostToDevice,
                                     **stream);
    CHECK(absl::IsInvalidArgument(status));
  }
  SECTION("host side that is device memory") {
    auto status = device->copy_async(base, base + 8192, 64, CopyKind::kDeviceToHost, **stream);
    CHECK(absl::IsInvalidArgument(status));
    CHECK_THAT(std::string(status.message()), Catch::Contains("is device memory"));
  }
  SECTION("null pointers") {
    CHECK(absl::IsInvalidArgument(
        device->copy_async(nullptr, host.data(), 8, CopyKind::kHostToDevice, **stream)));
  }
  SECTION("zero bytes is a no-op") {
    CHECK(device->copy_async(nullptr, nullptr, 0, CopyKind::kHostToDevice, **stream).ok());
  }
  SECTION("streams and events of another device") {
    auto other = host_device();
    auto other_stream = other->create_stream();
    auto other_event = other->create_event();
    REQUIRE(other_stream.ok());
    REQUIRE(other_event.ok());
    CHECK(absl::IsInvalidArgument(
        device->copy_async(base, host.data(), 8, CopyKind::kHostToDevice, **other_stream)));
    CHECK(absl::IsInvalidArgument(device->record(**other_event, **stream)));
    CHECK(absl::IsInvalidArgument(device->synchronize(**other_stream)));
  }
  SECTION("registering a range twice") {
    auto first = device->register_host(host.data(), host.size());
    REQUIRE(first.ok());
    CHECK(absl::IsAlreadyExists(device->register_host(host.data() + 8, 8).status()));
    first->reset();
    CHECK(device->register_host(host.data(), host.size()).ok());
  }
}

TEST_CASE("HostDevice memory is bounded like a GPU's", "[device]") {
  HostDeviceOptions options;
  options.memory_bytes = 8 << 20;
  auto device = host_device(options);
  auto a = device->allocate_device_memory(6 << 20);
  REQUIRE(a.ok());
  auto b = device->allocate_device_memory(4 << 20);
  REQUIRE(absl::IsResourceExhausted(b.status()));
  CHECK_THAT(std::string(b.status().message()), Catch::Contains("STRATA_GPU_BYTES"));
  a->reset();  // freeing returns the bytes
  CHECK(device->allocate_device_memory(8 << 20).ok());
  CHECK(absl::IsInvalidArgument(device->allocate_device_memory(0).status()));
}

TEST_CASE("HostDevice rejects bad options", "[device]") {
  HostDeviceOptions options;
  options.h2d_bytes_per_second = -1;
  CHECK(absl::IsInvalidArgument(make_host_device(options).status()));
  options = {};
  options.memory_bytes = 0;
  CHECK(absl::IsInvalidArgument(make_host_device(options).status()));
}

TEST_CASE("An event is pending until its stream reaches it", "[device]") {
  auto device = host_device();
  auto stream = device->create_stream();
  auto event = device->create_event();
  REQUIRE(stream.ok());
  REQUIRE(event.ok());
  CHECK(*device->query(**event));  // never recorded: complete, as in CUDA

  absl::Notification gate;
  REQUIRE(device->launch_host_callback(**stream, [&gate] { gate.WaitForNotification(); }).ok());
  REQUIRE(device->record(**event, **stream).ok());
  CHECK_FALSE(*device->query(**event));  // the stream is held at the gate
  gate.Notify();
  REQUIRE(device->synchronize(**event).ok());
  CHECK(*device->query(**event));
}

TEST_CASE("A stream waiting on an event does not block the host", "[device]") {
  auto device = host_device();
  auto producer = device->create_stream();
  auto consumer = device->create_stream();
  auto event = device->create_event();
  REQUIRE(producer.ok());
  REQUIRE(consumer.ok());
  REQUIRE(event.ok());

  absl::Notification gate;
  std::atomic<int> order{0};
  int produced_at = -1, consumed_at = -1;
  REQUIRE(device->launch_host_callback(**producer, [&] { gate.WaitForNotification(); }).ok());
  REQUIRE(device->launch_host_callback(**producer, [&] { produced_at = order++; }).ok());
  REQUIRE(device->record(**event, **producer).ok());
  REQUIRE(device->wait(**consumer, **event).ok());  // returns at once
  REQUIRE(device->launch_host_callback(**consumer, [&] { consumed_at = order++; }).ok());
  gate.Notify();
  REQUIRE(device->synchronize(**consumer).ok());
  CHECK(produced_at == 0);
  CHECK(consumed_at == 1);
}

TEST_CASE("Waiting snapshots the event's latest record, as cudaStreamWaitEvent", "[device]") {
  auto device = host_device();
  auto first = device->create_stream();
  auto second = device->create_stream();
  auto consumer = device->create_stream();
  auto event = device->create_event();
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  REQUIRE(consumer.ok());
  REQUIRE(event.ok());

  absl::Notification hold_first;
  REQUIRE(device->launch_host_callback(**first, [&] { hold_first.WaitForNotification(); }).ok());
  REQUIRE(device->record(**event, **first).ok());
  std::atomic<bool> consumer_ran{false};
  REQUIRE(device->wait(**consumer, **event).ok());  // waits for the record on `first`
  REQUIRE(device->launch_host_callback(**consumer, [&] { consumer_ran = true; }).ok());
  // A later record on an idle stream completes at once but must not release the earlier wait.
  REQUIRE(device->record(**event, **second).ok());
  REQUIRE(device->synchronize(**second).ok());
  REQUIRE(device->synchronize(**event).ok());  // the latest record (on `second`) is done
  CHECK_FALSE(consumer_ran.load());
  hold_first.Notify();
  REQUIRE(device->synchronize(**consumer).ok());
  CHECK(consumer_ran.load());
}

TEST_CASE("Throttled copies take at least bytes / bandwidth", "[device]") {
  // A lower bound only: the throttle sleeps until the link would be free, so a correct
  // implementation cannot finish sooner however fast or loaded the machine is.
  HostDeviceOptions options;
  options.h2d_bytes_per_second = 1e9;
  auto device = host_device(options);
  auto memory = device->allocate_device_memory(16 << 20);
  auto a = device->create_stream();
  auto b = device->create_stream();
  REQUIRE(memory.ok());
  std::vector<std::byte> host(8 << 20, std::byte{1});
  auto* base = static_cast<std::byte*>((*memory)->data());
  const absl::Time start = absl::Now();
  // Two streams share one H2D link: 16 MiB at 1 GB/s is at least 16.7 ms.
  REQUIRE(device->copy_async(base, host.data(), host.size(), CopyKind::kHostToDevice, **a).ok());
  REQUIRE(
      device->copy_async(base + host.size(), host.data(), host.size(), CopyKind::kHostToDevice, **b)
          .ok());
  REQUIRE(device->synchronize(**a).ok());
  REQUIRE(device->synchronize(**b).ok());
  CHECK(absl::Now() - start >= absl::Seconds(16.0 * (1 << 20) / 1e9));
}

TEST_CASE("Destroying a stream lets its queued work finish", "[device]") {
  auto device = host_device();
  auto memory = device->allocate_device_memory(1 << 20);
  REQUIRE(memory.ok());
  std::vector<std::byte> host(1 << 20);
  std::iota(reinterpret_cast<unsigned char*>(host.data()),
            reinterpret_cast<unsigned char*>(host.data() + host.size()), 0);
  {
    auto stream = device->create_stream();
    REQUIRE(stream.ok());
    REQUIRE(device
                ->copy_async((*memory)->data(), host.data(), host.size(), CopyKind::kHostToDevice,
                             **stream)
                .ok());
  }
  CHECK(std::memcmp((*memory)->data(), host.data(), host.size()) == 0);
}

}  // namespace
}  // namespace strata
