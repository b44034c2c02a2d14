// TensorStore without host waits: bounded busy lists over many acquire/release pairs, eviction
// and write-back that return while their device copy is still held (HostCopyGate, or stream work
// held by a host callback), the bytes right once it runs, and a randomized content-checking
// stress over the asynchronous paths. Counts and contents are asserted, never times.
#include <absl/strings/str_format.h>
#include <absl/synchronization/notification.h>

#include <atomic>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "store_fixture.h"
#include "strata/base/log.h"

namespace strata {
namespace {

using testing::byte_at;
using testing::Fixture;
using testing::kKiB;
using testing::kMiB;
using testing::StoreSetup;

constexpr size_t kGpu = static_cast<size_t>(TierKind::kGpu);
constexpr size_t kCpu = static_cast<size_t>(TierKind::kCpu);

// Opens `gate` for `kind` if the test has not finished its part after a long while, so a call
// that wrongly waits for the held copy fails the test instead of hanging it.
class Watchdog {
 public:
  Watchdog(std::shared_ptr<HostCopyGate> gate, CopyKind kind)
      : thread_([this, gate, kind] {
          if (!done_.WaitForNotificationWithTimeout(absl::Seconds(60))) {
            fired_ = true;
            gate->open(kind);
          }
        }) {}
  ~Watchdog() {
    if (!done_.HasBeenNotified()) done_.Notify();
    thread_.join();
  }
  // Call right after the call under test returned: true when it returned by itself.
  bool returned_while_held() {
    const bool fired = fired_;
    return !fired;
  }

 private:
  absl::Notification done_;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

STRATA_BOTH_BACKENDS("Acquire/release pairs keep a resident tensor's busy list bounded",
                     "[store][busy]") {
  // Issue 12: every release used to append an event to the copy's busy list.
  StoreSetup setup;
  setup.nvme = false;
  Fixture f(device, setup);
  TensorStore& store = f.store();
  auto t = store.create("resident", 64 * kKiB, TierKind::kCpu);
  REQUIRE(t.ok());
  f.write(*t, 64 * kKiB, 3);  // GPU-resident and the newest copy from here on
  auto other = device.create_stream();
  REQUIRE(other.ok());
  constexpr int kPairs = 100000;
  uint64_t largest = 0;
  for (int i = 0; i < kPairs; ++i) {
    // Mostly one stream, sometimes a second: at most one entry per stream.
    Stream& stream = i % 1000 == 999 ? **other : f.stream();
    auto address = store.acquire(*t, TierKind::kGpu, stream, AccessMode::kRead);
    REQUIRE(address.ok());
    REQUIRE(store.release(*t, stream).ok());
    if (i % 1000 == 0) {
      largest = std::max(largest, store.stats().busy_events);
      REQUIRE(largest <= 3);  // fails early (rather than slowing down for ever) if it grows
    }
  }
  const StoreStats stats = store.stats();
  largest = std::max(largest, stats.busy_events);
  CHECK(stats.acquires >= kPairs);
  CHECK(stats.busy_peak <= 3);       // the two streams, and one mover stream at most
  CHECK(largest <= 3);               // held now, across every copy
  CHECK(stats.events_created <= 8);  // pooled and re-recorded, not one per release
  REQUIRE(device.synchronize(f.stream()).ok());
  REQUIRE(device.synchronize(**other).ok());
  CHECK(f.holds(*t, 64 * kKiB, 3));
  CHECK(f.holds(*t, 64 * kKiB, 3, TierKind::kCpu));
}

TEST_CASE("evict returns while its write-back to the CPU tier is still held", "[store][async]") {
  auto gate = std::make_shared<HostCopyGate>();
  HostDeviceOptions options;
  options.gate = gate;
  auto device = testing::host_device(options);
  StoreSetup setup;
  setup.nvme = false;
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  const uint64_t bytes = 200 * kKiB + 5;
  auto t = store.create("activations", bytes, TierKind::kCpu);
  REQUIRE(t.ok());
  f.write(*t, bytes, 41);  // the GPU copy holds the only newest bytes
  {
    gate->close(CopyKind::kDeviceToHost);
    Watchdog watchdog(gate, CopyKind::kDeviceToHost);
    REQUIRE(store.evict(*t, TierKind::kGpu).ok());
    CHECK(watchdog.returned_while_held());
    gate->wait_held(CopyKind::kDeviceToHost, 1);  // the write-back's D2H sits at the gate
    const StoreStats held = store.stats();
    CHECK(held.evictions_writeback == 1);
    CHECK(held.moves_in_flight == 1);
    CHECK(held.tiers[kGpu].resident == 1);  // rule 1: kept until the write-back is seen done
    CHECK(held.tiers[kCpu].resident == 0);  // the home copy is not valid yet
    CHECK(held.moves[kGpu][kCpu].moves == 0);
    gate->open(CopyKind::kDeviceToHost);
  }
  CHECK(f.holds(*t, bytes, 41, TierKind::kCpu));  // waits for the copy, then reads it
  const StoreStats after = store.stats();
  CHECK(after.moves[kGpu][kCpu].moves == 1);
  CHECK(after.moves_in_flight == 0);
  CHECK(after.tiers[kGpu].resident == 0);  // dropped once the write-back completed
  CHECK(after.tiers[kGpu].used == 0);
  CHECK(after.errors == 0);
  CHECK(f.holds(*t, bytes, 41));  // and fetched back to the GPU intact
}

TEST_CASE("flush waits for write-backs that eviction left in flight", "[store][async]") {
  auto gate = std::make_shared<HostCopyGate>();
  HostDeviceOptions options;
  options.gate = gate;
  auto device = testing::host_device(options);
  StoreSetup setup;
  setup.nvme = false;
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  std::vector<TensorHandle> tensors;
  for (uint32_t i = 0; i < 4; ++i) {
    auto t = store.create(absl::StrFormat("w%d", i), 96 * kKiB, TierKind::kCpu);
    REQUIRE(t.ok());
    f.write(*t, 96 * kKiB, 70 + i);
    tensors.push_back(*t);
  }
  {
    gate->close(CopyKind::kDeviceToHost);
    Watchdog watchdog(gate, CopyKind::kDeviceToHost);
    for (TensorHandle t : tensors) REQUIRE(store.evict(t, TierKind::kGpu).ok());
    CHECK(watchdog.returned_while_held());
    gate->wait_held(CopyKind::kDeviceToHost, 1);
    CHECK(store.stats().moves_in_flight == 4);
    gate->open(CopyKind::kDeviceToHost);
  }
  REQUIRE(store.flush().ok());
  const StoreStats stats = store.stats();
  CHECK(stats.moves_in_flight == 0);
  CHECK(stats.tiers[kCpu].resident == 4);
  CHECK(stats.tiers[kGpu].resident == 0);
  for (uint32_t i = 0; i < 4; ++i) CHECK(f.holds(tensors[i], 96 * kKiB, 70 + i, TierKind::kCpu));
}

TEST_CASE("A clean copy still used by held stream work is evicted without waiting for it",
          "[store][async]") {
  auto device = testing::host_device();
  StoreSetup setup;
  setup.nvme = false;
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  auto t = store.create("weight", 128 * kKiB, TierKind::kCpu);
  REQUIRE(t.ok());
  f.write(*t, 128 * kKiB, 5);
  REQUIRE(store.flush().ok());  // home is valid: the GPU copy is clean
  const StoreStats before = store.stats();
  auto stream = device->create_stream();
  REQUIRE(stream.ok());
  absl::Notification work_may_end;
  std::atomic<bool> work_ended{false};
  REQUIRE(store.acquire(*t, TierKind::kGpu, **stream, AccessMode::kRead).ok());
  // The trainer's kernel reading the copy, held until the test says so.
  REQUIRE(device
              ->launch_host_callback(**stream,
                                     [&] {
                                       work_may_end.WaitForNotificationWithTimeout(
                                           absl::Seconds(60));
                                       work_ended = true;
                                     })
              .ok());
  REQUIRE(store.release(*t, **stream).ok());  // records the end of that work; returns at once
  REQUIRE(store.evict(*t, TierKind::kGpu).ok());
  CHECK_FALSE(work_ended.load());  // evict did not wait for the work on the copy
  StoreStats held = store.stats();
  CHECK(held.evictions_clean == before.evictions_clean + 1);
  CHECK(held.drops_pending == 1);
  CHECK(held.tiers[kGpu].used > 0);  // the memory is still the work's
  work_may_end.Notify();
  REQUIRE(device->synchronize(**stream).ok());
  // The completion worker drops the copy once it sees the work done.
  StoreStats after = store.stats();
  for (int i = 0; i < 60000 && after.drops_pending != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    after = store.stats();
  }
  CHECK(after.drops_pending == 0);
  CHECK(after.tiers[kGpu].used == 0);
  CHECK(after.moves[kGpu][kCpu].moves == before.moves[kGpu][kCpu].moves);  // clean: none
  CHECK(f.holds(*t, 128 * kKiB, 5));
}

TEST_CASE("A write-back to NVMe is waited for by evict and reports its failure", "[store][async]") {
  // Documented exception: NVMe writes are waited for so that evict() can return their error.
  auto device = testing::host_device();
  Fixture f(*device, StoreSetup{});
  TensorStore& store = f.store();
  auto t = store.create("optimizer.state", 300 * kKiB, TierKind::kNvme);
  REQUIRE(t.ok());
  f.write(*t, 300 * kKiB, 8);
  REQUIRE(store.evict(*t, TierKind::kGpu).ok());
  const StoreStats stats = store.stats();
  CHECK(stats.moves_in_flight == 0);
  CHECK(stats.moves[kGpu][static_cast<size_t>(TierKind::kNvme)].bytes == 300 * kKiB);
  CHECK(f.holds(*t, 300 * kKiB, 8, TierKind::kCpu));
}

// Log lines captured by the test sink.
std::mutex log_mu;
std::vector<std::string>* log_lines = nullptr;
void capture(LogLevel, std::string_view line) {
  std::lock_guard<std::mutex> lock(log_mu);
  if (log_lines != nullptr) log_lines->emplace_back(line);
}

TEST_CASE("Debug logging traces tier moves and evictions", "[store][log]") {
  std::vector<std::string> lines;
  {
    std::lock_guard<std::mutex> lock(log_mu);
    log_lines = &lines;
  }
  const LogLevel before = log::threshold();
  log::set_sink_for_testing(&capture);
  log::set_threshold(LogLevel::kDebug);
  {
    auto device = testing::host_device();
    StoreSetup setup;
    setup.nvme = false;
    Fixture f(*device, setup);
    auto t = f.store().create("layer3.weight", 64 * kKiB, TierKind::kCpu);
    REQUIRE(t.ok());
    f.write(*t, 64 * kKiB, 1, TierKind::kCpu);
    CHECK(f.holds(*t, 64 * kKiB, 1));  // cpu -> gpu
    REQUIRE(f.store().evict(*t, TierKind::kGpu).ok());
    f.write(*t, 64 * kKiB, 2);
    REQUIRE(f.store().evict(*t, TierKind::kGpu).ok());
    REQUIRE(f.store().flush().ok());
  }
  log::set_threshold(before);
  log::set_sink_for_testing(nullptr);
  std::lock_guard<std::mutex> lock(log_mu);
  log_lines = nullptr;
  const auto has = [&](std::string_view text) {
    for (const auto& line : lines) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  };
  CHECK(has("move 'layer3.weight' cpu -> gpu, 65536 bytes"));
  CHECK(has("evict 'layer3.weight' from gpu: clean"));
  CHECK(has("evict 'layer3.weight' from gpu: write-back to cpu"));
  CHECK(has("move 'layer3.weight' gpu -> cpu, 65536 bytes"));
}

STRATA_BOTH_BACKENDS("Randomized eviction, write-back and fetch in flight keep every byte",
                     "[store][stress][async]") {
  // Seeded: three threads over their own tensors in tiers far too small, evicting often so that
  // write-backs and drops are in flight while other threads acquire, write and read (checked);
  // a fourth thread flushes now and then. On the host backend the copies are throttled, so
  // completions lag well behind the calls that started them.
  std::unique_ptr<Device> throttled;
  Device* use = &device;
  if (device.backend() == Backend::kHost) {
    HostDeviceOptions slow;
    slow.h2d_bytes_per_second = 400e6;
    slow.d2h_bytes_per_second = 200e6;
    throttled = testing::host_device(slow);
    use = throttled.get();
  }
  StoreSetup setup;
  setup.gpu_bytes = 2 * kMiB;
  setup.cpu_bytes = 12 * kMiB;
  setup.nvme_bytes = 48 * kMiB;
  Fixture f(*use, setup);
  TensorStore& store = f.store();
  constexpr int kThreads = 3;
  constexpr int kTensors = 36;
  struct Item {
    TensorHandle handle;
    uint64_t bytes;
    uint32_t seed;
  };
  std::vector<Item> items;
  std::mt19937 setup_rng(77);
  for (int i = 0; i < kTensors; ++i) {
    const uint64_t bytes = 4096 + setup_rng() % (128 * kKiB);
    const TierKind home = i % 2 == 0 ? TierKind::kCpu : TierKind::kNvme;
    auto t = store.create(absl::StrFormat("s%d", i), bytes, home);
    REQUIRE(t.ok());
    items.push_back({*t, bytes, static_cast<uint32_t>(5000 + i)});
  }
  std::atomic<int> wrong{0}, errors{0};
  std::atomic<bool> stop_flushing{false};
  std::thread flusher([&] {
    while (!stop_flushing) {
      if (!store.flush().ok()) ++errors;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      Device& d = *use;
      auto stream = d.create_stream();
      auto buffer = d.allocate_pinned(128 * kKiB + 4096, "stress buffer");
      if (!stream.ok() || !buffer.ok()) {
        ++errors;
        return;
      }
      auto* host = static_cast<uint8_t*>((*buffer)->data());
      std::mt19937 rng(static_cast<uint32_t>(th + 11));
      std::vector<bool> written(kTensors, false);
      for (int op = 0; op < 300; ++op) {
        const int i = th + kThreads * static_cast<int>(rng() % (kTensors / kThreads));
        Item& item = items[i];
        const TierKind tier = rng() % 3 == 0 ? TierKind::kCpu : TierKind::kGpu;
        const int what = static_cast<int>(rng() % 10);
        if (what < 3 || !written[i]) {  // write a new pattern, without waiting for the copy
          const uint32_t seed = item.seed + 104729;
          // Every byte is written: half the writes say so, and fetch nothing first.
          const AccessMode mode = rng() % 2 == 0 ? AccessMode::kOverwrite : AccessMode::kWrite;
          auto address = store.acquire(item.handle, tier, **stream, mode);
          if (!address.ok()) {
            ++errors;
            continue;
          }
          (void)d.synchronize(**stream);  // the host buffer is reused below
          for (uint64_t b = 0; b < item.bytes; ++b) host[b] = byte_at(seed, b);
          if (tier == TierKind::kGpu) {
            (void)d.copy_async(*address, host, item.bytes, CopyKind::kHostToDevice, **stream);
          } else {
            std::memcpy(*address, host, item.bytes);
          }
          if (!store.release(item.handle, **stream).ok()) ++errors;
          item.seed = seed;
          written[i] = true;
        } else if (what < 6) {  // read and check
          auto address = store.acquire(item.handle, tier, **stream, AccessMode::kRead);
          if (!address.ok()) {
            ++errors;
            continue;
          }
          // Also ends the last write's H2D, which reads the host buffer.
          (void)d.synchronize(**stream);
          if (tier == TierKind::kGpu) {
            (void)d.copy_async(host, *address, item.bytes, CopyKind::kDeviceToHost, **stream);
            (void)d.synchronize(**stream);
          } else {
            std::memcpy(host, *address, item.bytes);
          }
          if (!store.release(item.handle, **stream).ok()) ++errors;
          for (uint64_t b = 0; b < item.bytes; ++b) {
            if (host[b] != byte_at(item.seed, b)) {
              ++wrong;
              break;
            }
          }
        } else if (what < 9) {  // evict, often right after a write still in flight
          (void)store.evict(item.handle, rng() % 3 == 0 ? TierKind::kCpu : TierKind::kGpu);
        } else {
          if (!store.prefetch(item.handle, tier).ok()) ++errors;
        }
      }
      (void)d.synchronize(**stream);
    });
  }
  for (auto& thread : threads) thread.join();
  stop_flushing = true;
  flusher.join();
  CHECK(wrong == 0);
  CHECK(errors == 0);
  REQUIRE(store.flush().ok());
  for (const Item& item : items) {
    if (item.seed >= 5000 + kTensors) {  // written at least once
      CHECK(f.holds(item.handle, item.bytes, item.seed, TierKind::kCpu));
      CHECK(f.holds(item.handle, item.bytes, item.seed, TierKind::kGpu));
    }
  }
  const StoreStats stats = store.stats();
  CHECK(stats.errors == 0);
  CHECK(stats.evictions_writeback > 0);
  CHECK(stats.moves[kGpu][kCpu].moves > 0);  // write-backs to the CPU tier ran asynchronously
  CHECK(stats.moves_in_flight == 0);
  CHECK(stats.overwrites > 0);  // some overwrites found their bytes elsewhere and fetched none
}

TEST_CASE("destroy of a copy an allocation is evicting for room lets the allocation go on",
          "[store][async]") {
  // Found by the activation stash: thread A's acquire picked tensor Y's GPU copy as its victim
  // and waited for the copy to go, holding Y; thread B destroyed Y, which waits until nothing
  // holds it; the write-back's completion no longer drops a dead tensor's copy, so both waited
  // for ever.
  auto gate = std::make_shared<HostCopyGate>();
  HostDeviceOptions options;
  options.gate = gate;
  auto device = testing::host_device(options);
  StoreSetup setup;
  setup.nvme = false;
  setup.gpu_bytes = 1 * kMiB;  // room for one of the two tensors
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  const uint64_t bytes = 640 * kKiB;
  auto victim = store.create("victim", bytes, TierKind::kCpu);
  auto wanted = store.create("wanted", bytes, TierKind::kCpu);
  REQUIRE(victim.ok());
  REQUIRE(wanted.ok());
  f.write(*wanted, bytes, 7, TierKind::kCpu);
  f.write(*victim, bytes, 8);  // the only newest bytes, in the GPU tier
  gate->close(CopyKind::kDeviceToHost);
  Watchdog watchdog(gate, CopyKind::kDeviceToHost);
  auto other = device->create_stream();
  REQUIRE(other.ok());
  std::atomic<bool> acquired{false};
  std::thread a([&] {  // needs the victim's room: its write-back waits at the gate
    auto data = store.acquire(*wanted, TierKind::kGpu, **other, AccessMode::kRead);
    acquired = data.ok() && store.release(*wanted, **other).ok();
  });
  gate->wait_held(CopyKind::kDeviceToHost, 1);
  std::thread b([&] { CHECK(store.destroy(*victim).ok()); });
  while (store.info(*victim).ok()) std::this_thread::yield();  // B has begun destroying it
  gate->open(CopyKind::kDeviceToHost);
  a.join();
  b.join();
  CHECK(watchdog.returned_while_held());  // nothing needed the watchdog to open the gate
  CHECK(acquired);
  CHECK(f.holds(*wanted, bytes, 7));
  CHECK(store.stats().tensors == 1);
}

}  // namespace
}  // namespace strata
