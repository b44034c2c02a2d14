// AccessMode::kOverwrite: an acquire that fetches nothing (the caller writes every byte before it
// reads any), from every tier the newest bytes may be in, left out of the scheduler's prefetches,
// and safe beside moves of the same tensor still in flight (held at a HostCopyGate). Counts and
// contents are asserted, never times.
#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "store_fixture.h"

namespace strata {
namespace {

using testing::byte_at;
using testing::Fixture;
using testing::kKiB;
using testing::StoreSetup;

constexpr TierKind kGpu = TierKind::kGpu;
constexpr TierKind kCpu = TierKind::kCpu;
constexpr TierKind kNvme = TierKind::kNvme;
constexpr size_t at(TierKind tier) { return static_cast<size_t>(tier); }

uint64_t all_moves(const StoreStats& s) {
  uint64_t n = 0;
  for (const auto& row : s.moves) {
    for (const MoveStats& m : row) n += m.moves;
  }
  return n;
}

TEST_CASE("An overwrite fetches nothing, from wherever the newest bytes are, and keeps its bytes",
          "[store][overwrite]") {
  struct Case {
    TierKind home, source, target;
  };
  // source: the only tier with the newest bytes before the overwrite.
  const std::vector<Case> cases = {{kCpu, kCpu, kGpu},
                                   {kCpu, kGpu, kCpu},
                                   {kNvme, kNvme, kGpu},
                                   {kNvme, kNvme, kCpu},
                                   {kNvme, kGpu, kCpu}};
  auto device = testing::host_device();
  Fixture f(*device, StoreSetup{});
  TensorStore& store = f.store();
  const uint64_t bytes = 300 * kKiB + 3;  // several staging chunks and I/O blocks, odd tail
  uint32_t seed = 1;
  for (const Case& c : cases) {
    INFO("home " << to_string(c.home) << ", newest in " << to_string(c.source)
                 << ", overwritten in " << to_string(c.target));
    auto t = store.create("t", bytes, c.home);
    REQUIRE(t.ok());
    const uint32_t old_seed = seed++;
    f.write(*t, bytes, old_seed, c.source == kNvme ? kCpu : c.source);
    for (TierKind tier : {kGpu, kCpu}) {
      if (tier != c.source && tier != c.home) REQUIRE(store.evict(*t, tier).ok());
    }
    const StoreStats before = store.stats();
    const uint32_t new_seed = seed++;
    f.write(*t, bytes, new_seed, c.target, AccessMode::kOverwrite);
    const StoreStats after = store.stats();
    CHECK(all_moves(after) == all_moves(before));  // no fetch, no write-back
    CHECK(after.overwrites == before.overwrites + 1);
    CHECK(after.misses == before.misses);
    CHECK(after.hits == before.hits + 1);
    // The new bytes are the newest everywhere: read in the other tier, then from home alone.
    CHECK(f.holds(*t, bytes, new_seed, c.target == kGpu ? kCpu : kGpu));
    REQUIRE(store.flush().ok());
    for (TierKind tier : {kGpu, kCpu}) {
      if (tier != c.home) REQUIRE(store.evict(*t, tier).ok());
    }
    CHECK(f.holds(*t, bytes, new_seed, c.target));
    // Where the tier holds a valid copy, an overwrite is a write: a hit, nothing moved.
    const StoreStats resident = store.stats();
    f.write(*t, bytes, seed, c.target, AccessMode::kOverwrite);
    CHECK(store.stats().overwrites == resident.overwrites);
    CHECK(all_moves(store.stats()) == all_moves(resident));
    CHECK(f.holds(*t, bytes, seed++, c.target == kGpu ? kCpu : kGpu));
    REQUIRE(store.destroy(*t).ok());
  }
  CHECK(store.stats().errors == 0);
}

TEST_CASE("A never-written tensor's overwrite makes its copy without a source",
          "[store][overwrite]") {
  auto device = testing::host_device();
  Fixture f(*device, StoreSetup{});
  auto t = f.store().create("fresh", 64 * kKiB, kNvme);
  REQUIRE(t.ok());
  f.write(*t, 64 * kKiB, 5, kGpu, AccessMode::kOverwrite);
  CHECK(all_moves(f.store().stats()) == 0);
  REQUIRE(f.store().evict(*t, kGpu).ok());  // the only newest copy: written back home
  CHECK(f.holds(*t, 64 * kKiB, 5, kCpu));
}

// Waits until the store has issued a prefetch since `before`; false (and the test fails) if none
// comes for a long while, rather than hanging.
bool prefetch_issued(TensorStore& store, const StoreStats& before) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (store.stats().prefetches_issued == before.prefetches_issued) {
    if (absl::Now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST_CASE("The scheduler never prefetches an overwrite", "[store][overwrite][scheduler]") {
  auto device = testing::host_device();
  StoreSetup setup;
  setup.nvme = false;
  setup.options.prefetch_threads = 1;  // one worker: the queue is issued in order
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  const uint64_t bytes = 64 * kKiB;
  auto grad = store.create("grad", bytes, kCpu);
  auto weight = store.create("weight", bytes, kCpu);
  REQUIRE(grad.ok());
  REQUIRE(weight.ok());
  f.write(*grad, bytes, 1, kCpu);
  f.write(*weight, bytes, 2, kCpu);
  const StoreStats before = store.stats();
  CHECK(before.tiers[at(kGpu)].resident == 0);
  // Both due at once (lead 2); the overwrite first, so a worker that took it would have issued
  // it before the weight's.
  REQUIRE(store
              .set_access_plan(
                  {{*grad, kGpu, AccessMode::kOverwrite}, {*weight, kGpu, AccessMode::kRead}})
              .ok());
  REQUIRE(prefetch_issued(store, before));
  CHECK(f.holds(*weight, bytes, 2));  // waits for its prefetch if it is still landing
  const StoreStats after = store.stats();
  CHECK(after.prefetches_issued == before.prefetches_issued + 1);
  CHECK(after.moves[at(kCpu)][at(kGpu)].moves == before.moves[at(kCpu)][at(kGpu)].moves + 1);
  CHECK(after.tiers[at(kGpu)].resident == 1);  // the weight only
  f.write(*grad, bytes, 3, kGpu, AccessMode::kOverwrite);
  CHECK(store.stats().overwrites == before.overwrites + 1);
  CHECK(f.holds(*grad, bytes, 3, kCpu));

  // A trace learned from the acquires themselves carries the mode too.
  REQUIRE(store.set_access_order({}).ok());
  for (TensorHandle t : {*grad, *weight}) {
    REQUIRE(store.evict(t, kGpu).ok());
    REQUIRE(store.wait_evicted(t, kGpu).ok());
  }
  store.step_begin();
  f.write(*grad, bytes, 4, kGpu, AccessMode::kOverwrite);
  CHECK(f.holds(*weight, bytes, 2));
  store.step_end();
  for (TensorHandle t : {*grad, *weight}) {
    REQUIRE(store.evict(t, kGpu).ok());
    REQUIRE(store.wait_evicted(t, kGpu).ok());  // gone, not still held by its device work
  }
  const StoreStats learned = store.stats();
  store.step_begin();  // plans the next step's first accesses: the overwrite and the weight
  INFO("learned trace: " << store.stats().schedule.trace_length << " entries");
  REQUIRE(prefetch_issued(store, learned));
  CHECK(f.holds(*weight, bytes, 2));
  CHECK(store.stats().prefetches_issued == learned.prefetches_issued + 1);
  CHECK(store.stats().moves[at(kCpu)][at(kGpu)].moves ==
        learned.moves[at(kCpu)][at(kGpu)].moves + 1);
  f.write(*grad, bytes, 5, kGpu, AccessMode::kOverwrite);
  store.step_end();
  CHECK(store.stats().overwrites == learned.overwrites + 1);  // not prefetched: made here
  CHECK(store.stats().moves[at(kCpu)][at(kGpu)].moves ==
        learned.moves[at(kCpu)][at(kGpu)].moves + 1);
  CHECK(f.holds(*grad, bytes, 5, kCpu));
  CHECK(store.stats().errors == 0);
}

TEST_CASE("LRU keeps a prefetched copy, not yet used, when an acquire needs room",
          "[store][overwrite][scheduler]") {
  // An overwrite makes its room when acquired (no prefetch made it): LRU must not evict the
  // copies just prefetched for the next accesses, whose last acquire may be old.
  auto device = testing::host_device();
  StoreSetup setup;
  setup.nvme = false;
  setup.options.belady = false;
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  const uint64_t bytes = 3 * testing::kMiB / 2;  // two fit in the 4 MiB GPU tier, not three
  std::vector<TensorHandle> t;
  for (int i = 0; i < 4; ++i) {
    auto h = store.create("t" + std::to_string(i), bytes, kCpu);
    REQUIRE(h.ok());
    f.write(*h, bytes, 10 + i, kCpu);  // the prefetched one (2) is last acquired here, early
    t.push_back(*h);
  }
  CHECK(f.holds(t[0], bytes, 10));
  CHECK(f.holds(t[1], bytes, 11));
  const StoreStats before = store.stats();
  REQUIRE(store.prefetch(t[2], kGpu).ok());  // room: t0 goes (least recently used)
  while (store.stats().moves[at(kCpu)][at(kGpu)].moves == before.moves[at(kCpu)][at(kGpu)].moves) {
    std::this_thread::yield();
  }
  CHECK(f.holds(t[1], bytes, 11));  // used after the prefetch: the prefetched t2 is older still
  f.write(t[3], bytes, 13, kGpu, AccessMode::kOverwrite);  // room: t1 goes, not the prefetched t2
  const StoreStats landed = store.stats();
  CHECK(f.holds(t[2], bytes, 12));
  CHECK(store.stats().moves[at(kCpu)][at(kGpu)].moves ==
        landed.moves[at(kCpu)][at(kGpu)].moves);  // a hit: still there
  CHECK(store.stats().prefetches_used == before.prefetches_used + 1);
}

// Runs an overwrite of `t` in `tier` (seed's pattern, every byte) on its own thread, while the
// test holds a move of the same tensor at the gate.
class Overwriter {
 public:
  Overwriter(Fixture& f, Device& device, TensorHandle t, uint64_t bytes, TierKind tier,
             uint32_t seed)
      : thread_([&f, &device, t, bytes, tier, seed, this] {
          auto stream = device.create_stream();
          auto host = device.allocate_pinned(bytes, "overwrite buffer");
          if (!stream.ok() || !host.ok()) {
            status_ = absl::InternalError("no stream or buffer");
            done_.Notify();
            return;
          }
          auto* p = static_cast<uint8_t*>((*host)->data());
          for (uint64_t i = 0; i < bytes; ++i) p[i] = byte_at(seed, i);
          auto address = f.store().acquire(t, tier, **stream, AccessMode::kOverwrite);
          if (address.ok()) {
            if (tier == kGpu) {
              status_ = device.copy_async(*address, p, bytes, CopyKind::kHostToDevice, **stream);
            } else {
              std::memcpy(*address, p, bytes);
            }
            if (auto r = f.store().release(t, **stream); status_.ok()) status_ = r;
            if (auto s = device.synchronize(**stream); status_.ok()) status_ = s;
          } else {
            status_ = address.status();
          }
          done_.Notify();
        }) {}
  ~Overwriter() { (void)join(); }
  // Gives a wrong store (one that does not wait for the held move) the time to finish first.
  bool finished_while_held() {
    return done_.WaitForNotificationWithTimeout(absl::Milliseconds(200));
  }
  absl::Status join() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  absl::Notification done_;
  absl::Status status_;
  std::thread thread_;
};

TEST_CASE("An overwrite waits for a move into its tier: the move's bytes never land over it",
          "[store][overwrite][async]") {
  auto gate = std::make_shared<HostCopyGate>();
  HostDeviceOptions options;
  options.gate = gate;
  auto device = testing::host_device(options);
  StoreSetup setup;
  setup.nvme = false;
  Fixture f(*device, setup);
  const uint64_t bytes = 200 * kKiB + 5;
  auto t = f.store().create("grad", bytes, kCpu);
  REQUIRE(t.ok());
  f.write(*t, bytes, 1);  // the GPU copy holds the only newest bytes
  gate->close(CopyKind::kDeviceToHost);
  REQUIRE(f.store().evict(*t, kGpu).ok());  // its write-back home is held at the gate
  gate->wait_held(CopyKind::kDeviceToHost, 1);
  Overwriter writer(f, *device, *t, bytes, kCpu, 2);  // into the home copy being filled
  const bool early = writer.finished_while_held();
  gate->open(CopyKind::kDeviceToHost);
  CHECK_FALSE(early);
  REQUIRE(writer.join().ok());
  CHECK(f.holds(*t, bytes, 2, kCpu));
  CHECK(f.holds(*t, bytes, 2, kGpu));
  CHECK(f.store().stats().errors == 0);
}

TEST_CASE("An overwrite of a copy whose write-back is in flight keeps its own bytes",
          "[store][overwrite][async]") {
  auto gate = std::make_shared<HostCopyGate>();
  HostDeviceOptions options;
  options.gate = gate;
  auto device = testing::host_device(options);
  StoreSetup setup;
  setup.nvme = false;
  Fixture f(*device, setup);
  const uint64_t bytes = 200 * kKiB + 5;
  auto t = f.store().create("grad", bytes, kCpu);
  REQUIRE(t.ok());
  f.write(*t, bytes, 1);
  gate->close(CopyKind::kDeviceToHost);
  REQUIRE(f.store().evict(*t, kGpu).ok());  // the evicted GPU copy is read by the held copy
  gate->wait_held(CopyKind::kDeviceToHost, 1);
  // Valid there still: kept (its eviction cancelled), and written after the held read.
  Overwriter writer(f, *device, *t, bytes, kGpu, 2);
  (void)writer.finished_while_held();
  gate->open(CopyKind::kDeviceToHost);
  REQUIRE(writer.join().ok());
  CHECK(f.holds(*t, bytes, 2, kGpu));
  CHECK(f.holds(*t, bytes, 2, kCpu));
  REQUIRE(f.store().evict(*t, kGpu).ok());
  CHECK(f.holds(*t, bytes, 2, kGpu));
  CHECK(f.store().stats().errors == 0);
}

TEST_CASE("An overwrite waits for a fetch that reads the home copy, so its write-back can go home",
          "[store][overwrite][async]") {
  auto device = testing::host_device();
  StoreSetup setup;
  setup.faults = std::make_shared<FaultInjector>();
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  const uint64_t bytes = 200 * kKiB + 5;
  auto t = store.create("grad", bytes, kNvme);
  REQUIRE(t.ok());
  f.write(*t, bytes, 1, kCpu);
  REQUIRE(store.evict(*t, kCpu).ok());  // only the NVMe home copy is left
  // The fetch into the CPU tier reads the home copy, its completion held back a while.
  FaultRule slow;
  slow.op = IoOp::kRead;
  slow.action = FaultRule::Action::kDelay;
  slow.delay = absl::Milliseconds(400);
  setup.faults->add(slow);
  REQUIRE(store.prefetch(*t, kCpu).ok());
  while (setup.faults->fired() == 0) std::this_thread::yield();
  Overwriter writer(f, *device, *t, bytes, kGpu, 2);  // another tier: no copy there yet
  const bool early = writer.finished_while_held();
  // Were it done this early, its only newest copy must still be able to go home.
  if (early) CHECK(store.evict(*t, kGpu).ok());
  CHECK_FALSE(early);
  REQUIRE(writer.join().ok());
  CHECK(f.holds(*t, bytes, 2, kCpu));  // the fetched old bytes were not taken as valid
  REQUIRE(store.flush().ok());
  REQUIRE(store.evict(*t, kCpu).ok());
  REQUIRE(store.evict(*t, kGpu).ok());
  CHECK(f.holds(*t, bytes, 2, kGpu));  // from home
  CHECK(store.stats().errors == 0);
}

}  // namespace
}  // namespace strata
