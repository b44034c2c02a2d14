// Device semantics on HostDevice: copies, streams, events and what CUDA would reject.
#include "strata/device/host_device.h"

#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>
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

// The pinned CPU tier is registered piece by piece, so one tensor may span several registrations;
// CUDA copies within one registration (or none) only, so both devices cut copies at their edges.
TEST_CASE("A copy spanning several registrations goes one piece at a time, every byte right",
          "[device]") {
  HostDeviceOptions options;
  options.gate = std::make_shared<HostCopyGate>();
  auto device = host_device(options);
  constexpr uint64_t kPiece = 4096;
  auto memory = device->allocate_device_memory(8 * kPiece);
  REQUIRE(memory.ok());
  auto stream = device->create_stream();
  REQUIRE(stream.ok());
  auto* gpu = static_cast<std::byte*>((*memory)->data());
  std::vector<std::byte> host(8 * kPiece);
  // Registered: pieces 1, 2 and 4; pieces 0, 3 and 5.. are not.
  std::vector<std::unique_ptr<HostRegistration>> registrations;
  for (const uint64_t piece : {1, 2, 4}) {
    auto registration = device->register_host(host.data() + piece * kPiece, kPiece);
    REQUIRE(registration.ok());
    registrations.push_back(*std::move(registration));
  }
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::byte>(i * 7 + i / 4096);
  // [100, 5 pieces + 100): gap, piece 1, piece 2, gap, piece 4, gap: six copies.
  const uint64_t from = 100, bytes = 5 * kPiece;
  REQUIRE(
      device->copy_async(gpu, host.data() + from, bytes, CopyKind::kHostToDevice, **stream).ok());
  std::vector<std::byte> back(bytes);
  REQUIRE(device->copy_async(back.data(), gpu, bytes, CopyKind::kDeviceToHost, **stream).ok());
  REQUIRE(device->synchronize(**stream).ok());
  CHECK(options.gate->passed(CopyKind::kHostToDevice) == 6);
  CHECK(options.gate->passed(CopyKind::kDeviceToHost) == 1);  // `back` is not registered
  CHECK(std::memcmp(back.data(), host.data() + from, bytes) == 0);
  // Inside one registration, or touching none: one copy.
  REQUIRE(device->copy_async(gpu, host.data() + kPiece, kPiece, CopyKind::kHostToDevice, **stream)
              .ok());
  REQUIRE(
      device->copy_async(gpu, host.data() + 6 * kPiece, kPiece, CopyKind::kHostToDevice, **stream)
          .ok());
  REQUIRE(device->synchronize(**stream).ok());
  CHECK(options.gate->passed(CopyKind::kHostToDevice) == 8);
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

TEST_CASE("HostDevice tells what memory a pointer is, and has no GPU to make current", "[device]") {
  auto device = host_device();
  CHECK(device->ordinal() == -1);
  CHECK(device->make_current().ok());
  auto memory = device->allocate_device_memory(1 << 20);
  REQUIRE(memory.ok());
  auto* data = static_cast<char*>((*memory)->data());
  CHECK(*device->memory_kind(data) == MemoryKind::kDevice);
  CHECK(*device->memory_kind(data + (1 << 20) - 1) == MemoryKind::kDevice);
  std::vector<char> host(8192);
  CHECK(*device->memory_kind(host.data()) == MemoryKind::kHost);
  {
    auto registration = device->register_host(host.data(), host.size());
    REQUIRE(registration.ok());
    CHECK(*device->memory_kind(host.data() + 100) == MemoryKind::kRegisteredHost);
  }
  CHECK(*device->memory_kind(host.data()) == MemoryKind::kHost);  // unregistered again
  memory->reset();
  CHECK(*device->memory_kind(data) == MemoryKind::kHost);  // freed
  CHECK(to_string(MemoryKind::kRegisteredHost) == "registered host");
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

TEST_CASE("An event recorded on an idle stream is complete at once", "[device]") {
  // The fast path of record(): no trip through the stream's worker when nothing is queued (a
  // DLPack consumer on the host then reads at once; a legal CUDA outcome too, nothing being
  // before the event). It must not apply while anything could still run before the event:
  // queued work, a closed stream gate, a closed device gate.
  auto device = host_device();
  auto stream = device->create_stream();
  auto event = device->create_event();
  REQUIRE(stream.ok());
  REQUIRE(event.ok());
  REQUIRE(device->record(**event, **stream).ok());
  CHECK(*device->query(**event));  // without the fast path: pending until the worker's turn

  // Work queued: pending until it has run, then the stream is idle again.
  absl::Notification hold;
  REQUIRE(device->launch_host_callback(**stream, [&] { hold.WaitForNotification(); }).ok());
  REQUIRE(device->record(**event, **stream).ok());
  CHECK_FALSE(*device->query(**event));
  hold.Notify();
  REQUIRE(device->synchronize(**stream).ok());
  REQUIRE(device->record(**event, **stream).ok());
  CHECK(*device->query(**event));

  // A closed gate on an idle stream holds the marker as it holds any work issued after it.
  {
    auto gate = hold_stream(*device, **stream);
    REQUIRE(gate.ok());
    REQUIRE(device->record(**event, **stream).ok());
    CHECK_FALSE(*device->query(**event));  // held, whether or not it reached the gate yet
    // Leaving the block destroys the gate, which opens it.
  }
  REQUIRE(device->synchronize(**event).ok());
  CHECK(*device->query(**event));
  {
    auto gate = hold_device(*device, {});
    REQUIRE(gate.ok());
    REQUIRE(device->record(**event, **stream).ok());
    CHECK_FALSE(*device->query(**event));
  }
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

TEST_CASE("A stream waits for a host flag, the host does not", "[device]") {
  auto device = host_device();
  auto stream = device->create_stream();
  auto other = device->create_stream();
  auto event = device->create_event();
  auto flag = device->create_host_flag();
  REQUIRE(stream.ok());
  REQUIRE(other.ok());
  REQUIRE(event.ok());
  REQUIRE(flag.ok());

  std::atomic<bool> ran{false};
  REQUIRE(device->wait_host_flag(**stream, **flag).ok());  // returns at once
  REQUIRE(device->launch_host_callback(**stream, [&] { ran = true; }).ok());
  REQUIRE(device->record(**event, **stream).ok());
  // Other streams run on; this one holds its later work behind the flag.
  std::atomic<bool> other_ran{false};
  REQUIRE(device->launch_host_callback(**other, [&] { other_ran = true; }).ok());
  REQUIRE(device->synchronize(**other).ok());
  CHECK(other_ran.load());
  CHECK_FALSE(*device->query(**event));
  CHECK_FALSE(ran.load());
  absl::Status raised;  // checked here: Catch2's assertions are not for other threads
  std::thread raiser([&] { raised = device->raise_host_flag(**flag); });
  REQUIRE(device->synchronize(**stream).ok());
  raiser.join();
  CHECK(raised.ok());
  CHECK(ran.load());
  // A raised flag stays raised: a later wait passes; raising it again does nothing.
  REQUIRE(device->raise_host_flag(**flag).ok());
  REQUIRE(device->wait_host_flag(**stream, **flag).ok());
  REQUIRE(device->synchronize(**stream).ok());
  // Destroying a flag raises it: the stream waiting for it runs on.
  auto dropped = device->create_host_flag();
  REQUIRE(dropped.ok());
  REQUIRE(device->wait_host_flag(**stream, **dropped).ok());
  dropped->reset();
  REQUIRE(device->synchronize(**stream).ok());
  // A flag of another device is refused, naming it.
  auto stranger = host_device();
  auto foreign = stranger->create_host_flag();
  REQUIRE(foreign.ok());
  CHECK(absl::IsInvalidArgument(device->wait_host_flag(**stream, **foreign)));
  CHECK(absl::IsInvalidArgument(device->raise_host_flag(**foreign)));
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

TEST_CASE("A stream gate holds work issued after it closed, in order, until it opens", "[device]") {
  auto device = host_device();
  auto memory = device->allocate_device_memory(1 << 20);
  auto stream = device->create_stream();
  auto other = device->create_stream();
  auto event = device->create_event();
  REQUIRE(memory.ok());
  REQUIRE(stream.ok());
  REQUIRE(other.ok());
  REQUIRE(event.ok());
  auto* base = static_cast<unsigned char*>((*memory)->data());
  std::vector<unsigned char> first(4096, 1), second(4096, 2), out(4096, 0);

  // Issued before the gate: not held.
  REQUIRE(device->copy_async(base, first.data(), 4096, CopyKind::kHostToDevice, **stream).ok());
  auto gate = hold_stream(*device, **stream);
  REQUIRE(gate.ok());
  REQUIRE(device->copy_async(base, second.data(), 4096, CopyKind::kHostToDevice, **stream).ok());
  REQUIRE(device->copy_async(out.data(), base, 4096, CopyKind::kDeviceToHost, **stream).ok());
  REQUIRE(device->record(**event, **stream).ok());
  (*gate)->wait_until_held(1);  // the second copy reached the gate
  CHECK((*gate)->held() == 1);  // the rest queue behind it, in order
  CHECK_FALSE(*device->query(**event));
  CHECK(base[0] == 1);  // the first copy ran
  CHECK(out[0] == 0);

  // Another stream is not held.
  REQUIRE(
      device->copy_async(base + 8192, first.data(), 4096, CopyKind::kHostToDevice, **other).ok());
  REQUIRE(device->synchronize(**other).ok());
  CHECK(base[8192] == 1);

  (*gate)->open();
  REQUIRE(device->synchronize(**stream).ok());
  CHECK(*device->query(**event));
  CHECK(out == second);  // the second copy, then the read-back
  CHECK((*gate)->held() == 0);
  // Work issued after the gate opened is not held.
  REQUIRE(device->copy_async(base, first.data(), 4096, CopyKind::kHostToDevice, **stream).ok());
  REQUIRE(device->synchronize(**stream).ok());
  CHECK(base[0] == 1);
}

TEST_CASE("A device gate holds every stream but the exempt ones, new streams included",
          "[device]") {
  auto device = host_device();
  auto memory = device->allocate_device_memory(1 << 20);
  auto exempt = device->create_stream();
  REQUIRE(memory.ok());
  REQUIRE(exempt.ok());
  auto* base = static_cast<unsigned char*>((*memory)->data());
  std::vector<unsigned char> ones(4096, 1);
  std::memset(base, 0, 8192);  // the host device's memory is host memory

  auto gate = hold_device(*device, {exempt->get()});
  REQUIRE(gate.ok());
  auto later = device->create_stream();  // created while the gate is closed: held too
  REQUIRE(later.ok());
  REQUIRE(device->copy_async(base, ones.data(), 4096, CopyKind::kHostToDevice, **later).ok());
  REQUIRE(
      device->copy_async(base + 4096, ones.data(), 4096, CopyKind::kHostToDevice, **exempt).ok());
  REQUIRE(device->synchronize(**exempt).ok());  // the exempt stream runs
  CHECK(base[4096] == 1);
  (*gate)->wait_until_held(1);
  CHECK(base[0] == 0);
  gate->reset();  // destroying the gate opens it
  REQUIRE(device->synchronize(**later).ok());
  CHECK(base[0] == 1);
}

TEST_CASE("Host streams are named by their native handle only while they live", "[device]") {
  auto device = host_device();
  auto memory = device->allocate_device_memory(1 << 20);
  REQUIRE(memory.ok());
  auto* base = static_cast<unsigned char*>((*memory)->data());
  std::vector<unsigned char> ones(4096, 1), out(4096, 0);
  uintptr_t native = 0;
  {
    auto stream = device->create_stream();
    REQUIRE(stream.ok());
    native = *device->native_handle(**stream);
    CHECK(native > 2);  // never DLPack's special values -1, 0, 1, 2
    auto wrapped = device->wrap_external_stream(native);
    REQUIRE(wrapped.ok());
    // One queue: work on the stream and on its wrapper runs in issue order.
    auto gate = hold_stream(*device, **stream);
    REQUIRE(gate.ok());
    REQUIRE(device->copy_async(base, ones.data(), 4096, CopyKind::kHostToDevice, **stream).ok());
    REQUIRE(device->copy_async(out.data(), base, 4096, CopyKind::kDeviceToHost, **wrapped).ok());
    (*gate)->wait_until_held(1);
    CHECK(out[0] == 0);  // the read-back on the wrapper is held too: it is the same queue
    (*gate)->open();
    REQUIRE(device->synchronize(**wrapped).ok());
    CHECK(out == ones);
    // A second stream gets another handle.
    auto other = device->create_stream();
    REQUIRE(other.ok());
    CHECK(*device->native_handle(**other) != native);
    CHECK(
        absl::IsInvalidArgument(device->native_handle(**host_device()->create_stream()).status()));
  }
  // Stream and wrapper gone: the handle names nothing.
  CHECK(absl::IsInvalidArgument(device->wrap_external_stream(native).status()));
  CHECK(absl::IsInvalidArgument(device->wrap_external_stream(1).status()));
}

TEST_CASE("The consumer's stream waits on strata's event, the host does not (DLPack protocol)",
          "[device]") {
  // What the Python binding does at __dlpack__(stream=...): record strata's event after the
  // copy, make the consumer's stream wait on it, return. A gate holds the copy, so the call
  // demonstrably returns before the bytes arrive and the consumer reads them after.
  auto device = host_device();
  auto memory = device->allocate_device_memory(1 << 20);
  auto strata_stream = device->create_stream();
  auto consumer_stream = device->create_stream();
  auto ready = device->create_event();
  REQUIRE(memory.ok());
  REQUIRE(strata_stream.ok());
  REQUIRE(consumer_stream.ok());
  REQUIRE(ready.ok());
  auto* base = static_cast<unsigned char*>((*memory)->data());
  std::memset(base, 0, 4096);
  std::vector<unsigned char> bytes(4096), out(4096, 0);
  std::iota(bytes.begin(), bytes.end(), 0);

  auto gate = hold_device(*device, {consumer_stream->get()});
  REQUIRE(gate.ok());
  REQUIRE(
      device->copy_async(base, bytes.data(), 4096, CopyKind::kHostToDevice, **strata_stream).ok());
  REQUIRE(device->record(**ready, **strata_stream).ok());
  auto consumer = device->wrap_external_stream(*device->native_handle(**consumer_stream));
  REQUIRE(consumer.ok());
  REQUIRE(device->wait(**consumer, **ready).ok());
  REQUIRE(device->copy_async(out.data(), base, 4096, CopyKind::kDeviceToHost, **consumer).ok());
  auto consumed = device->create_event();
  REQUIRE(consumed.ok());
  REQUIRE(device->record(**consumed, **consumer).ok());
  (*gate)->wait_until_held(1);  // the copy is issued and held
  CHECK_FALSE(*device->query(**consumed));
  CHECK(out[1] == 0);
  CHECK(base[1] == 0);
  (*gate)->open();
  REQUIRE(device->synchronize(**consumed).ok());
  CHECK(out == bytes);
}

TEST_CASE("Stream gates are a host-device hook and check their stream", "[device]") {
  auto device = host_device();
  auto other = host_device();
  auto foreign = other->create_stream();
  REQUIRE(foreign.ok());
  CHECK(absl::IsInvalidArgument(hold_stream(*device, **foreign).status()));
  CHECK(absl::IsInvalidArgument(hold_device(*device, {foreign->get()}).status()));
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
