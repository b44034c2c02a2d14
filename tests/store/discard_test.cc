// TensorStore::discard: the caller no longer needs a tensor's bytes, so its copies go without a
// write-back, and the next write makes it whole again. Counts and contents are asserted.
#include <absl/synchronization/notification.h>
#include <absl/time/clock.h>

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

uint64_t moves_out_of(const StoreStats& s, TierKind from) {
  uint64_t n = 0;
  for (const MoveStats& m : s.moves[at(from)]) n += m.moves;
  return n;
}

TEST_CASE("A discarded tensor's copies go without a write-back, and the next write is whole",
          "[store][discard]") {
  auto device = testing::host_device();
  Fixture f(*device, StoreSetup{});
  TensorStore& store = f.store();
  const uint64_t bytes = 200 * kKiB + 5;
  for (TierKind home : {kCpu, kNvme}) {
    INFO("home " << to_string(home));
    auto t = store.create(std::string("t-") + std::string(to_string(home)), bytes, home);
    REQUIRE(t.ok());
    f.write(*t, bytes, 1, kGpu);  // the only newest bytes are on the GPU
    const StoreStats before = store.stats();
    REQUIRE(store.discard(*t).ok());
    REQUIRE(store.evict(*t, kGpu).ok());
    REQUIRE(store.wait_evicted(*t, kGpu).ok());
    REQUIRE(store.flush().ok());
    const StoreStats after = store.stats();
    CHECK(after.discards == before.discards + 1);
    CHECK(moves_out_of(after, kGpu) == moves_out_of(before, kGpu));  // nothing written back
    CHECK(after.evictions_writeback == before.evictions_writeback);
    // Written again (an overwrite fetches nothing): the new bytes everywhere.
    f.write(*t, bytes, 2, kGpu, AccessMode::kOverwrite);
    CHECK(f.holds(*t, bytes, 2, kCpu));
    REQUIRE(store.flush().ok());
    REQUIRE(store.evict(*t, kGpu).ok());
    if (home == kNvme) REQUIRE(store.evict(*t, kCpu).ok());
    CHECK(f.holds(*t, bytes, 2, kGpu));
    CHECK(store.stats().errors == 0);
  }
}

TEST_CASE("discard refuses an acquired tensor and changes nothing", "[store][discard]") {
  auto device = testing::host_device();
  Fixture f(*device, StoreSetup{});
  TensorStore& store = f.store();
  const uint64_t bytes = 64 * kKiB;
  auto t = store.create("held", bytes, kCpu);
  REQUIRE(t.ok());
  f.write(*t, bytes, 7, kGpu);
  auto address = store.acquire(*t, kGpu, f.stream(), AccessMode::kRead);
  REQUIRE(address.ok());
  const absl::Status status = store.discard(*t);
  CHECK(absl::IsFailedPrecondition(status));
  CHECK(status.message() == "tensor 'held' is acquired; release it before discarding its bytes");
  REQUIRE(store.release(*t, f.stream()).ok());
  CHECK(store.stats().discards == 0);
  REQUIRE(store.evict(*t, kGpu).ok());
  CHECK(f.holds(*t, bytes, 7, kCpu));  // written back on eviction: still the newest bytes
  CHECK(absl::IsInvalidArgument(store.discard(TensorHandle{99, 0})));
  REQUIRE(store.destroy(*t).ok());
  CHECK(absl::IsNotFound(store.discard(*t)));  // a stale handle
}

// A discarded copy that device work still reads gives its room back only when that work ends.
// A prefetch (which may only evict copies needed after the access it serves) takes an idle copy
// first: else its worker waits for the running layer's compute instead of issuing the next
// prefetches (issue 26's train step: the discarded activation of the layer being computed).
TEST_CASE("A prefetch evicts an idle copy before a discarded one that device work still reads",
          "[store][discard]") {
  auto device = testing::host_device();
  StoreSetup setup;
  setup.gpu_bytes = 3 * kMiB + 64 * kKiB;  // three tensors and the compaction reserve
  setup.options.early_writeback_bytes = 0;
  Fixture f(*device, setup);
  TensorStore& store = f.store();
  std::vector<TensorHandle> t;  // X, A, B, C
  for (int i = 0; i < 4; ++i) {
    auto h = store.create("t" + std::to_string(i), kMiB, kCpu);
    REQUIRE(h.ok());
    t.push_back(*h);
    f.write(*h, kMiB, 10 + i, kCpu);
  }
  const TensorHandle x = t[0], a = t[1], b = t[2], c = t[3];
  REQUIRE(f.holds(x, kMiB, 10, kGpu));  // X and B on the GPU, clean and idle
  REQUIRE(f.holds(b, kMiB, 12, kGpu));
  // Their releases' events done (on the host backend the stream's worker completes them).
  REQUIRE(device->synchronize(f.stream()).ok());
  // A on the GPU, read by device work held until the end, then discarded.
  absl::Notification work_may_end;
  auto held = device->create_stream();
  REQUIRE(held.ok());
  REQUIRE(device->launch_host_callback(**held, [&] { work_may_end.WaitForNotification(); }).ok());
  REQUIRE(store.acquire(a, kGpu, **held, AccessMode::kRead).ok());
  REQUIRE(store.release(a, **held).ok());
  REQUIRE(store.discard(a).ok());
  // X, then C, then B: C's prefetch needs room and may evict B (needed after it) or A.
  const auto fetched = [&] { return store.stats().moves[at(kCpu)][at(kGpu)].moves; };
  const uint64_t before = fetched();
  REQUIRE(store
              .set_access_plan({{x, kGpu, AccessMode::kRead},
                                {c, kGpu, AccessMode::kRead},
                                {b, kGpu, AccessMode::kRead}})
              .ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (fetched() == before && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  const bool prefetched_while_held = fetched() == before + 1;
  work_may_end.Notify();
  REQUIRE(device->synchronize(**held).ok());
  CHECK(prefetched_while_held);
  CHECK(store.stats().prefetches_issued == 1);
  CHECK(f.holds(x, kMiB, 10, kGpu));
  CHECK(f.holds(c, kMiB, 13, kGpu));
  CHECK(store.stats().prefetches_used == 1);
  CHECK(f.holds(b, kMiB, 12, kGpu));  // evicted clean, fetched again: the same bytes
}

}  // namespace
}  // namespace strata
