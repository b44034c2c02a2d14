// TensorStore::discard: the caller no longer needs a tensor's bytes, so its copies go without a
// write-back, and the next write makes it whole again. Counts and contents are asserted.
#include "store_fixture.h"

namespace strata {
namespace {

using testing::Fixture;
using testing::kKiB;
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

}  // namespace
}  // namespace strata
