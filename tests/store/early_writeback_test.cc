// Early write-back (TensorStoreOptions::early_writeback_bytes): the written copies that the room
// for the upcoming accesses will evict are written home ahead of need and stay resident, clean;
// a copy written again afterwards is written back again when it goes. Counts and contents are
// asserted, never times (the bounded waits below only wait for a write-back to land).
#include <absl/time/clock.h>

#include <random>
#include <string>
#include <vector>

#include "store_fixture.h"

namespace strata {
namespace {

using testing::Fixture;
using testing::kKiB;
using testing::kMiB;
using testing::StoreSetup;

constexpr TierKind kGpu = TierKind::kGpu;
constexpr TierKind kCpu = TierKind::kCpu;
constexpr TierKind kNvme = TierKind::kNvme;
constexpr size_t at(TierKind tier) { return static_cast<size_t>(tier); }

// Waits (bounded) until `done` holds for the store's stats; false if it never did.
template <typename Predicate>
bool eventually(TensorStore& store, Predicate done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    if (done(store.stats())) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

uint64_t writebacks(const StoreStats& s, TierKind home) {
  return s.moves[at(kGpu)][at(home)].moves;
}

// Six 1 MiB tensors; the GPU tier holds three. The order: W0 and W1 overwritten on the GPU, then
// W2..W5 read there. After W1's acquire the next four accesses need 4 MiB of room and the tier
// has one tensor's free: W0 (idle, written, needed furthest) is the copy their room will evict.
struct Scenario {
  explicit Scenario(TierKind home_tier, std::optional<uint64_t> early_bytes = 4 * kMiB,
                    std::shared_ptr<FaultInjector> faults = nullptr)
      : device(testing::host_device()), f(*device, setup(early_bytes, faults)), home(home_tier) {
    for (int i = 0; i < 6; ++i) {
      auto t = f.store().create("w" + std::to_string(i), kBytes, home);
      REQUIRE(t.ok());
      w.push_back(*t);
    }
    for (int i = 2; i < 6; ++i) f.write(w[i], kBytes, 100 + i, kCpu);
    for (int i = 2; i < 6; ++i) {
      if (home != kCpu) REQUIRE(f.store().evict(w[i], kCpu).ok());
    }
    std::vector<OrderedAccess> order = {{w[0], kGpu, AccessMode::kOverwrite},
                                        {w[1], kGpu, AccessMode::kOverwrite}};
    for (int i = 2; i < 6; ++i) order.push_back({w[i], kGpu, AccessMode::kRead});
    REQUIRE(f.store().set_access_plan(order).ok());
  }
  // W0 and W1 overwritten on the GPU (seeds 1, 2); then W0's early write-back lands.
  void overwrite_w0_w1() {
    f.write(w[0], kBytes, 1, kGpu, AccessMode::kOverwrite);
    REQUIRE(f.store().stats().early_writebacks == 0);  // the room it needs was free
    f.write(w[1], kBytes, 2, kGpu, AccessMode::kOverwrite);
    REQUIRE(eventually(f.store(), [](const StoreStats& st) {
      return st.early_writebacks == 1 && st.moves_in_flight == 0;
    }));
  }
  static StoreSetup setup(std::optional<uint64_t> early_bytes,
                          std::shared_ptr<FaultInjector> faults = nullptr) {
    StoreSetup s;
    s.faults = std::move(faults);
    s.gpu_bytes = 3 * kMiB + 64 * kKiB;  // three tensors and the arena's compaction reserve
    s.options.prefetch = false;          // nothing else moves: the counts are exact
    s.options.early_writeback_bytes = early_bytes;
    return s;
  }
  static constexpr uint64_t kBytes = kMiB;
  std::unique_ptr<Device> device;
  Fixture f;
  TierKind home;
  std::vector<TensorHandle> w;
};

TEST_CASE("A written copy the coming room will evict is written home early, then leaves clean",
          "[store][early_writeback]") {
  for (TierKind home : {kCpu, kNvme}) {
    INFO("home " << to_string(home));
    Scenario s(home);
    TensorStore& store = s.f.store();
    s.overwrite_w0_w1();  // W0 written home early, and landed
    StoreStats st = store.stats();
    CHECK(st.early_writeback_bytes == Scenario::kBytes);
    CHECK(writebacks(st, home) == 1);
    CHECK(st.tiers[at(kGpu)].resident >= 2);  // W0 is still on the GPU: nothing was evicted
    // Its eviction writes nothing: the home copy is already as new.
    const uint64_t evictions_writeback = st.evictions_writeback;  // NVMe home: the CPU copies'
    REQUIRE(store.evict(s.w[0], kGpu).ok());
    REQUIRE(store.wait_evicted(s.w[0], kGpu).ok());
    st = store.stats();
    CHECK(st.early_writebacks_used == 1);
    CHECK(st.evictions_writeback == evictions_writeback);
    CHECK(writebacks(st, home) == 1);
    CHECK(s.f.holds(s.w[0], Scenario::kBytes, 1, kCpu));
    for (int i = 2; i < 6; ++i) CHECK(s.f.holds(s.w[i], Scenario::kBytes, 100 + i, kGpu));
    CHECK(s.f.holds(s.w[1], Scenario::kBytes, 2, kCpu));
    CHECK(store.stats().errors == 0);
  }
}

TEST_CASE("A copy written again after its early write-back is written back again when it goes",
          "[store][early_writeback]") {
  for (TierKind home : {kCpu, kNvme}) {
    INFO("home " << to_string(home));
    Scenario s(home);
    TensorStore& store = s.f.store();
    s.overwrite_w0_w1();
    // New bytes in the GPU copy: the home copy is stale again, and the early write-back wasted.
    s.f.write(s.w[0], Scenario::kBytes, 3, kGpu, AccessMode::kWrite);
    CHECK(store.stats().early_writebacks_wasted == 1);
    const uint64_t before = writebacks(store.stats(), home);
    REQUIRE(store.evict(s.w[0], kGpu).ok());
    REQUIRE(store.wait_evicted(s.w[0], kGpu).ok());
    const StoreStats st = store.stats();
    CHECK(writebacks(st, home) == before + 1);
    CHECK(st.early_writebacks_used == 0);
    CHECK(s.f.holds(s.w[0], Scenario::kBytes, 3, kCpu));  // the new bytes, from home
  }
}

TEST_CASE("A failed early write-back loses nothing: the copy stays the newest and goes home later",
          "[store][early_writeback]") {
  auto faults = std::make_shared<FaultInjector>();
  Scenario s(kNvme, 4 * kMiB, faults);
  TensorStore& store = s.f.store();
  FaultRule fail;  // the next write to the swap files fails (EIO): W0's early write-back
  fail.op = IoOp::kWrite;
  fail.times = 1;
  faults->add(fail);
  s.f.write(s.w[0], Scenario::kBytes, 1, kGpu, AccessMode::kOverwrite);
  s.f.write(s.w[1], Scenario::kBytes, 2, kGpu, AccessMode::kOverwrite);
  REQUIRE(eventually(store, [](const StoreStats& st) {
    return st.early_writebacks == 1 && st.errors == 1 && st.moves_in_flight == 0;
  }));
  CHECK(faults->fired() == 1);
  CHECK(store.stats().early_writebacks_used == 0);
  // Its eviction writes it home (the copy was still the only newest one), and the bytes are there.
  REQUIRE(store.evict(s.w[0], kGpu).ok());
  REQUIRE(store.wait_evicted(s.w[0], kGpu).ok());
  CHECK(store.stats().early_writebacks_used == 0);
  CHECK(s.f.holds(s.w[0], Scenario::kBytes, 1, kCpu));
  CHECK(store.stats().errors == 1);
}

TEST_CASE("Early write-back is off with early_writeback_bytes 0, and waits for a trace",
          "[store][early_writeback]") {
  Scenario off(kCpu, 0);
  off.f.write(off.w[0], Scenario::kBytes, 1, kGpu, AccessMode::kOverwrite);
  off.f.write(off.w[1], Scenario::kBytes, 2, kGpu, AccessMode::kOverwrite);
  for (int i = 2; i < 6; ++i) CHECK(off.f.holds(off.w[i], Scenario::kBytes, 100 + i, kGpu));
  CHECK(off.f.store().stats().early_writebacks == 0);
  const uint64_t before = writebacks(off.f.store().stats(), kCpu);
  REQUIRE(off.f.store().evict(off.w[0], kGpu).ok());  // W0's bytes were never written home
  REQUIRE(off.f.store().wait_evicted(off.w[0], kGpu).ok());
  CHECK(writebacks(off.f.store().stats(), kCpu) == before + 1);
  // No trace: nothing says which copy the room will take.
  auto device = testing::host_device();
  Fixture f(*device, Scenario::setup(4 * kMiB));
  std::vector<TensorHandle> w;
  for (int i = 0; i < 6; ++i) {
    auto t = f.store().create("u" + std::to_string(i), Scenario::kBytes, kCpu);
    REQUIRE(t.ok());
    w.push_back(*t);
    f.write(*t, Scenario::kBytes, 10 + i, kGpu, AccessMode::kOverwrite);
  }
  for (int i = 0; i < 6; ++i) CHECK(f.holds(w[i], Scenario::kBytes, 10 + i, kCpu));
  CHECK(f.store().stats().early_writebacks == 0);
}

// A step of random reads, writes and overwrites over tensors of random sizes (homes on the CPU
// tier and NVMe), repeated with prefetching on and a GPU tier that holds about half of them:
// every read sees the newest bytes while early write-backs, prefetches and evictions run beside
// the trainer (and discards of bytes read for the last time), and the early write-backs happen
// and are used.
TEST_CASE("Random steps keep every tensor's bytes with early write-backs and discards",
          "[store][early_writeback]") {
  uint64_t issued = 0, used = 0;
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const auto below = [&](uint64_t n) {
      return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
    };
    StoreSetup setup;
    setup.gpu_bytes = 3 * kMiB;
    setup.options.early_writeback_bytes = 1 * kMiB + below(2) * kMiB;
    auto device = testing::host_device();
    Fixture f(*device, setup);
    TensorStore& store = f.store();
    struct Model {
      TensorHandle handle;
      uint64_t bytes;
      uint32_t pattern;
    };
    std::vector<Model> tensors;
    uint32_t next_pattern = 1;
    for (int i = 0; i < 10; ++i) {
      const uint64_t bytes = (128 + below(640)) * kKiB + below(2) * 3;  // some with an odd tail
      auto t = store.create("t" + std::to_string(i), bytes, below(2) == 0 ? kCpu : kNvme);
      REQUIRE(t.ok());
      tensors.push_back({*t, bytes, next_pattern});
      f.write(*t, bytes, next_pattern++, kCpu);
    }
    struct Step {
      size_t tensor;
      AccessMode mode;
      TierKind tier;
    };
    std::vector<Step> step;
    for (int i = 0; i < 24; ++i) {
      const uint64_t r = below(6);
      step.push_back({below(tensors.size()),
                      r < 3   ? AccessMode::kRead
                      : r < 5 ? AccessMode::kWrite
                              : AccessMode::kOverwrite,
                      below(5) == 0 ? kCpu : kGpu});
    }
    for (int s = 0; s < 5; ++s) {
      store.step_begin();
      for (const Step& a : step) {
        Model& m = tensors[a.tensor];
        INFO("step " << s << ": " << to_string(a.mode) << " of tensor " << a.tensor << " in "
                     << to_string(a.tier));
        if (a.mode == AccessMode::kRead) {
          if (m.pattern != 0) REQUIRE(f.holds(m.handle, m.bytes, m.pattern, a.tier));
          // Some reads are the last before a write: the bytes are dead, discarded.
          if (below(4) == 0) {
            REQUIRE(store.discard(m.handle).ok());
            m.pattern = 0;  // undefined until written
          }
        } else {
          m.pattern = next_pattern++;
          f.write(m.handle, m.bytes, m.pattern, a.tier, a.mode);
        }
      }
      store.step_end();
    }
    REQUIRE(store.flush().ok());
    for (Model& m : tensors) {
      if (m.pattern == 0) {  // discarded: written once more, so that every tensor is checked
        m.pattern = next_pattern++;
        f.write(m.handle, m.bytes, m.pattern, kGpu, AccessMode::kOverwrite);
        REQUIRE(store.flush().ok());
      }
      for (TierKind tier : {kGpu, kCpu}) {
        if (tier != store.info(m.handle)->home) REQUIRE(store.evict(m.handle, tier).ok());
      }
      CHECK(f.holds(m.handle, m.bytes, m.pattern, kGpu));
    }
    const StoreStats st = store.stats();
    CHECK(st.errors == 0);
    issued += st.early_writebacks;
    used += st.early_writebacks_used;
  }
  CHECK(issued > 0);
  CHECK(used > 0);
}

}  // namespace
}  // namespace strata
