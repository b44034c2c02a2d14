// TensorStore: the data-safety rules, on HostDevice (and the basic paths on a GPU under
// [cuda]). Device memory is read and written through copies, so the same helpers serve both.
#include "strata/store/tensor_store.h"

#include <absl/strings/str_format.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "store_fixture.h"

namespace strata {
namespace {

using testing::byte_at;
using testing::Fixture;
using testing::kKiB;
using testing::kMiB;
using testing::StoreSetup;

STRATA_BOTH_BACKENDS("Tensors keep their bytes through every tier", "[store]") {
  Fixture f(device, StoreSetup{});
  TensorStore& store = f.store();
  const uint64_t bytes = 300 * kKiB + 7;  // several staging chunks and stripe units, odd tail
  for (TierKind home : {TierKind::kCpu, TierKind::kNvme}) {
    auto t = store.create(absl::StrFormat("w.%s", to_string(home)), bytes, home);
    REQUIRE(t.ok());
    f.write(*t, bytes, 1);
    CHECK(f.holds(*t, bytes, 1));
    CHECK(f.holds(*t, bytes, 1, TierKind::kCpu));
    REQUIRE(store.flush().ok());
    REQUIRE(store.evict(*t, TierKind::kGpu).ok());
    if (home == TierKind::kNvme) REQUIRE(store.evict(*t, TierKind::kCpu).ok());
    CHECK(f.holds(*t, bytes, 1));           // fetched again from home
    f.write(*t, bytes, 2, TierKind::kCpu);  // newest on the CPU: the GPU copy is stale now
    CHECK(f.holds(*t, bytes, 2));
  }
  const StoreStats stats = store.stats();
  CHECK(stats.moves[0][2].bytes > 0);  // gpu -> nvme (flush)
  CHECK(stats.moves[2][0].bytes > 0);  // nvme -> gpu (through staging)
  CHECK(stats.errors == 0);
}

STRATA_BOTH_BACKENDS("A full GPU arena writes back what only it holds", "[store]") {
  StoreSetup setup;
  setup.gpu_bytes = 2 * kMiB;  // room for about three of the tensors below
  Fixture f(device, setup);
  TensorStore& store = f.store();
  std::vector<TensorHandle> tensors;
  for (uint32_t i = 0; i < 8; ++i) {
    auto t = store.create(absl::StrFormat("layer%d", i), 512 * kKiB,
                          i % 2 == 0 ? TierKind::kCpu : TierKind::kNvme);
    REQUIRE(t.ok());
    tensors.push_back(*t);
    f.write(*t, 512 * kKiB, 100 + i);
  }
  for (uint32_t i = 0; i < 8; ++i) CHECK(f.holds(tensors[i], 512 * kKiB, 100 + i));
  const StoreStats stats = store.stats();
  CHECK(stats.evictions_writeback >= 5);
  CHECK(stats.misses > 0);
}

TEST_CASE("destroy frees every copy, the only valid one included", "[store]") {
  auto device = testing::host_device();
  Fixture f(*device, StoreSetup{});
  TensorStore& store = f.store();
  for (TierKind home : {TierKind::kCpu, TierKind::kNvme}) {
    for (TierKind written : {TierKind::kGpu, TierKind::kCpu}) {
      INFO("home " << to_string(home) << ", written in " << to_string(written));
      const StoreStats before = store.stats();
      auto t = store.create("x", 256 * kKiB, home);
      REQUIRE(t.ok());
      f.write(*t, 256 * kKiB, 9, written);  // the written copy is the only valid one
      REQUIRE(store.destroy(*t).ok());
      const StoreStats after = store.stats();
      for (TierKind tier : {TierKind::kGpu, TierKind::kCpu, TierKind::kNvme}) {
        CHECK(after.tiers[static_cast<size_t>(tier)].used ==
              before.tiers[static_cast<size_t>(tier)].used);
      }
    }
  }
}

TEST_CASE("A clean GPU copy is dropped without any write-back I/O", "[store]") {
  auto device = testing::host_device();
  Fixture f(*device, StoreSetup{});
  TensorStore& store = f.store();
  auto t = store.create("embedding", 256 * kKiB, TierKind::kNvme);
  REQUIRE(t.ok());
  f.write(*t, 256 * kKiB, 7);
  REQUIRE(store.flush().ok());        // NVMe now holds the newest bytes too
  CHECK(f.holds(*t, 256 * kKiB, 7));  // a read: the GPU copy stays clean
  const StoreStats before = store.stats();
  const uint64_t written_before = f.swap()->stats().io.bytes_written;
  REQUIRE(store.evict(*t, TierKind::kGpu).ok());
  const StoreStats after = store.stats();
  CHECK(after.evictions_clean == before.evictions_clean + 1);
  CHECK(after.evictions_writeback == before.evictions_writeback);
  CHECK(after.moves[0][2].bytes == before.moves[0][2].bytes);
  CHECK(f.swap()->stats().io.bytes_written == written_before);
}

TEST_CASE("NVMe faults during write-back and fetch lose nothing", "[store][faults]") {
  auto device = testing::host_device();
  StoreSetup setup;
  setup.faults = std::make_shared<FaultInjector>();
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  auto t = store.create("exp_avg_sq", 384 * kKiB, TierKind::kNvme);
  REQUIRE(t.ok());
  f.write(*t, 384 * kKiB, 11);

  SECTION("write-back") {
    FaultRule rule;
    rule.op = IoOp::kWrite;
    rule.skip = 1;
    rule.error_number = EIO;
    setup.faults->add(rule);
    auto status = store.evict(*t, TierKind::kGpu);  // the only newest copy: must write back
    REQUIRE_FALSE(status.ok());
    CHECK_THAT(std::string(status.message()), Catch::Contains("exp_avg_sq"));
    CHECK(store.stats().errors == 1);
    CHECK(f.holds(*t, 384 * kKiB, 11));  // the GPU copy, untouched
    setup.faults->clear();
    REQUIRE(store.evict(*t, TierKind::kGpu).ok());
    CHECK(f.holds(*t, 384 * kKiB, 11));  // from NVMe now
  }
  SECTION("flush") {
    auto other = store.create("exp_avg", 384 * kKiB, TierKind::kNvme);
    REQUIRE(other.ok());
    f.write(*other, 384 * kKiB, 12);
    FaultRule rule;
    rule.op = IoOp::kWrite;
    rule.error_number = EIO;
    rule.times = 1;
    setup.faults->add(rule);
    auto status = store.flush();  // two write-backs at once; one of them fails
    REQUIRE_FALSE(status.ok());
    CHECK_THAT(std::string(status.message()), Catch::Contains("exp_avg"));
    setup.faults->clear();
    REQUIRE(store.flush().ok());  // the failed one again; the other is already home
    REQUIRE(store.evict(*t, TierKind::kGpu).ok());
    REQUIRE(store.evict(*other, TierKind::kGpu).ok());
    CHECK(f.holds(*t, 384 * kKiB, 11));
    CHECK(f.holds(*other, 384 * kKiB, 12));
  }
  SECTION("fetch") {
    REQUIRE(store.flush().ok());
    REQUIRE(store.evict(*t, TierKind::kGpu).ok());
    FaultRule rule;
    rule.op = IoOp::kRead;
    rule.error_number = EIO;
    setup.faults->add(rule);
    auto address = store.acquire(*t, TierKind::kGpu, f.stream(), AccessMode::kRead);
    REQUIRE_FALSE(address.ok());
    CHECK_THAT(std::string(address.status().message()), Catch::Contains("exp_avg_sq"));
    setup.faults->clear();
    CHECK(f.holds(*t, 384 * kKiB, 11));  // the NVMe copy was never harmed
  }
}

TEST_CASE("Bad calls are errors, never crashes", "[store]") {
  auto device = testing::host_device();
  StoreSetup setup;
  setup.nvme = false;
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  auto t = store.create("w", 4096, TierKind::kCpu);
  REQUIRE(t.ok());
  CHECK(absl::IsAlreadyExists(store.create("w", 4096, TierKind::kCpu).status()));
  CHECK(absl::IsInvalidArgument(store.create("z", 0, TierKind::kCpu).status()));
  auto nvme = store.create("n", 4096, TierKind::kNvme);
  REQUIRE(absl::IsFailedPrecondition(nvme.status()));
  CHECK_THAT(std::string(nvme.status().message()), Catch::Contains("STRATA_NVME_PATHS"));
  CHECK(absl::IsFailedPrecondition(store.release(*t, f.stream())));
  CHECK(absl::IsInvalidArgument(
      store.acquire(*t, TierKind::kNvme, f.stream(), AccessMode::kRead).status()));
  CHECK(absl::IsInvalidArgument(store.evict(*t, TierKind::kCpu)));  // its home
  REQUIRE(store.acquire(*t, TierKind::kGpu, f.stream(), AccessMode::kRead).ok());
  CHECK(absl::IsFailedPrecondition(store.destroy(*t)));
  CHECK(absl::IsFailedPrecondition(store.evict(*t, TierKind::kGpu)));
  REQUIRE(store.release(*t, f.stream()).ok());
  REQUIRE(store.destroy(*t).ok());
  CHECK(absl::IsNotFound(store.destroy(*t)));
  CHECK(
      absl::IsNotFound(store.acquire(*t, TierKind::kGpu, f.stream(), AccessMode::kRead).status()));
  CHECK(absl::IsInvalidArgument(store.destroy(TensorHandle{})));
  CHECK(absl::IsNotFound(store.find("w").status()));
  auto big = store.create("too.big", 64 * kMiB, TierKind::kCpu);
  REQUIRE(absl::IsResourceExhausted(big.status()));
  CHECK_THAT(std::string(big.status().message()), Catch::Contains("STRATA_CPU_BYTES"));
}

TEST_CASE("The scheduler prefetches in access order ahead of need", "[store][scheduler]") {
  auto device = testing::host_device();
  StoreSetup setup;
  setup.gpu_bytes = 3 * kMiB;
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  std::vector<TensorHandle> layers;
  std::vector<std::pair<TensorHandle, TierKind>> order;
  for (uint32_t i = 0; i < 10; ++i) {
    auto t = store.create(absl::StrFormat("layer%d", i), 400 * kKiB, TierKind::kNvme);
    REQUIRE(t.ok());
    layers.push_back(*t);
    f.write(*t, 400 * kKiB, 50 + i, TierKind::kCpu);
    order.emplace_back(*t, TierKind::kGpu);
  }
  REQUIRE(store.flush().ok());
  REQUIRE(store.set_access_order(order).ok());
  for (int step = 0; step < 3; ++step) {
    store.step_begin();
    for (uint32_t i = 0; i < 10; ++i) CHECK(f.holds(layers[i], 400 * kKiB, 50 + i));
    store.step_end();
  }
  const StoreStats stats = store.stats();
  CHECK(stats.prefetches_issued > 0);
  CHECK(stats.prefetches_used > 0);
  CHECK(stats.schedule.given_order);
  CHECK(stats.schedule.matched >= 30);
}

STRATA_BOTH_BACKENDS("Randomized concurrent use keeps every tensor's newest bytes",
                     "[store][stress]") {
  // Seeded and reproducible: four threads, each owning a tenth of 60 tensors of random sizes,
  // in tiers far too small to hold them, doing random reads (checked), writes (new pattern),
  // evictions and prefetches. Every tensor is checked at the end, through both tiers.
  StoreSetup setup;
  setup.gpu_bytes = 3 * kMiB;
  setup.cpu_bytes = 10 * kMiB;
  setup.nvme_bytes = 64 * kMiB;
  Fixture f(device, setup);
  TensorStore& store = f.store();
  constexpr int kThreads = 4;
  constexpr int kTensors = 60;
  struct Item {
    TensorHandle handle;
    uint64_t bytes;
    uint32_t seed;
  };
  std::vector<Item> items;
  std::mt19937 setup_rng(2026);
  for (int i = 0; i < kTensors; ++i) {
    const uint64_t bytes = 4096 + setup_rng() % (160 * kKiB);
    const TierKind home = i % 3 == 0 ? TierKind::kCpu : TierKind::kNvme;
    auto t = store.create(absl::StrFormat("t%d", i), bytes, home);
    REQUIRE(t.ok());
    items.push_back({*t, bytes, static_cast<uint32_t>(1000 + i)});
  }
  std::atomic<int> wrong{0}, errors{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      auto stream = device.create_stream();
      auto buffer = device.allocate_pinned(160 * kKiB + 4096, "stress buffer");
      if (!stream.ok() || !buffer.ok()) {
        ++errors;
        return;
      }
      auto* host = static_cast<uint8_t*>((*buffer)->data());
      std::mt19937 rng(static_cast<uint32_t>(th + 1));
      std::vector<bool> written(kTensors, false);
      for (int op = 0; op < 400; ++op) {
        const int i = th + kThreads * static_cast<int>(rng() % (kTensors / kThreads));
        Item& item = items[i];
        const TierKind tier = rng() % 3 == 0 ? TierKind::kCpu : TierKind::kGpu;
        const int what = static_cast<int>(rng() % 10);
        if (what < 4 || !written[i]) {  // write a new pattern
          const uint32_t seed = item.seed + 7919;
          auto address = store.acquire(item.handle, tier, **stream, AccessMode::kWrite);
          if (!address.ok()) {
            ++errors;
            continue;
          }
          for (uint64_t b = 0; b < item.bytes; ++b) host[b] = byte_at(seed, b);
          if (tier == TierKind::kGpu) {
            (void)device.copy_async(*address, host, item.bytes, CopyKind::kHostToDevice, **stream);
          } else {
            std::memcpy(*address, host, item.bytes);
          }
          if (!store.release(item.handle, **stream).ok()) ++errors;
          (void)device.synchronize(**stream);
          item.seed = seed;
          written[i] = true;
        } else if (what < 8) {  // read and check
          auto address = store.acquire(item.handle, tier, **stream, AccessMode::kRead);
          if (!address.ok()) {
            ++errors;
            continue;
          }
          if (tier == TierKind::kGpu) {
            (void)device.copy_async(host, *address, item.bytes, CopyKind::kDeviceToHost, **stream);
            (void)device.synchronize(**stream);
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
        } else if (what == 8) {
          (void)store.evict(item.handle, rng() % 2 == 0 ? TierKind::kGpu : TierKind::kCpu);
        } else {
          if (!store.prefetch(item.handle, tier).ok()) ++errors;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(wrong == 0);
  CHECK(errors == 0);
  REQUIRE(store.flush().ok());
  for (const Item& item : items) {
    if (item.seed >= 1000 + kTensors) {  // written at least once
      CHECK(f.holds(item.handle, item.bytes, item.seed, TierKind::kCpu));
      CHECK(f.holds(item.handle, item.bytes, item.seed, TierKind::kGpu));
    }
  }
  const StoreStats stats = store.stats();
  CHECK(stats.errors == 0);
  CHECK(stats.evictions_writeback > 0);  // the tiers really were too small
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST_CASE("High-placed tensors keep to the GPU arena's top, a reserve is entered last",
          "[store][placement]") {
  auto device = testing::host_device();
  StoreSetup setup;
  setup.gpu_bytes = 1 * kMiB;  // an arena of 1008 KiB (1/64 is compaction's bounce buffer)
  setup.nvme = false;
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  auto acquire = [&](TensorHandle t) {
    auto p = store.acquire(t, TierKind::kGpu, f.stream(), AccessMode::kWrite);
    INFO(p.status().ToString());
    REQUIRE(p.ok());
    return static_cast<std::byte*>(*p);
  };
  auto make = [&](const char* name, uint64_t bytes, Placement placement) {
    auto t = store.create(name, bytes, TierKind::kCpu, CreateOptions{.placement = placement});
    REQUIRE(t.ok());
    return *t;
  };
  // 512 KiB at the top for high-placed tensors: the low tensors below, evicting each other
  // rather than entering it while anything is evictable.
  REQUIRE(store.reserve_high(TierKind::kGpu, 512 * kKiB).ok());
  CHECK(absl::IsInvalidArgument(store.reserve_high(TierKind::kNvme, kKiB)));
  TensorHandle high = make("activation", 256 * kKiB, Placement::kHigh);
  std::byte* high_at = acquire(high);
  TensorHandle low_a = make("states.a", 320 * kKiB, Placement::kLow);
  std::byte* a_at = acquire(low_a);
  CHECK(a_at + 320 * kKiB <= high_at);
  REQUIRE(store.release(low_a, f.stream()).ok());  // evictable now
  const uint64_t evictions = store.stats().evictions_writeback;
  TensorHandle low_b = make("states.b", 320 * kKiB, Placement::kLow);
  std::byte* b_at = acquire(low_b);  // 176 KiB left below the reserve: a is evicted
  CHECK(store.stats().evictions_writeback == evictions + 1);
  CHECK(b_at + 320 * kKiB <= high_at);
  // Nothing evictable below (b is held), so c goes into the reserve rather than failing.
  TensorHandle low_c = make("states.c", 320 * kKiB, Placement::kLow);
  std::byte* c_at = acquire(low_c);
  CHECK(c_at + 320 * kKiB <= high_at);
  for (TensorHandle t : {high, low_b, low_c}) REQUIRE(store.release(t, f.stream()).ok());
  store.unreserve_high(TierKind::kGpu, 512 * kKiB);
}

}  // namespace
}  // namespace strata
