// The store's timeline (TensorStore::set_timeline): its structure over a pass with prefetches,
// evictions and write-backs, and what it showed for issue 26: a caller waiting for a prefetch in
// flight used to wait for the completion worker to see it end, and that worker blocks on the
// oldest move in flight, so a slow write-back held up every read issued after it.
#include <absl/container/flat_hash_map.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "store_fixture.h"
#include "strata/device/host_device.h"

namespace strata {
namespace {

using testing::Fixture;
using testing::kKiB;
using testing::kMiB;
using testing::StoreSetup;

constexpr uint64_t kBytes = 256 * kKiB;

std::string arg(const Timeline::Span& s, std::string_view key) {
  for (const Timeline::Arg& a : s.args) {
    if (a.key == key) return a.value;
  }
  return "";
}

// Polls `done` (a liveness bound, not a speed: 20 s is far beyond any of these waits).
template <typename F>
bool eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Tensors homed on NVMe, written and then only there.
std::vector<TensorHandle> on_nvme(Fixture& f, int count) {
  TensorStore& store = f.store();
  std::vector<TensorHandle> tensors;
  for (int i = 0; i < count; ++i) {
    auto t = store.create("t" + std::to_string(i), kBytes, TierKind::kNvme);
    REQUIRE(t.ok());
    f.write(*t, kBytes, static_cast<uint32_t>(10 + i), TierKind::kCpu);
    tensors.push_back(*t);
  }
  REQUIRE(store.flush().ok());
  for (TensorHandle t : tensors) {
    REQUIRE(store.evict(t, TierKind::kCpu).ok());
    REQUIRE(store.wait_evicted(t, TierKind::kCpu).ok());
  }
  return tensors;
}

STRATA_BOTH_BACKENDS("The timeline records every move, wait and acquire, well formed",
                     "[store][timeline]") {
  StoreSetup setup;
  setup.faults = std::make_shared<FaultInjector>();
  setup.gpu_bytes = 1 * kMiB;  // three of the eight tensors at a time: the pass evicts
  setup.staging_bytes = 4 * kMiB;
  Fixture f(device, setup);
  TensorStore& store = f.store();
  const std::vector<TensorHandle> tensors = on_nvme(f, 8);
  std::vector<std::pair<TensorHandle, TierKind>> order;
  for (TensorHandle t : tensors) order.emplace_back(t, TierKind::kGpu);
  REQUIRE(store.set_access_order(order).ok());

  // Every NVMe read from here on completes 2 ms late, so that some acquire finds its tensor's
  // read still in flight (its own or a prefetch's) however fast the machine.
  FaultRule slow;
  slow.op = IoOp::kRead;
  slow.times = UINT64_MAX;
  slow.action = FaultRule::Action::kDelay;
  slow.delay = absl::Milliseconds(2);
  setup.faults->add(slow);
  auto timeline = std::make_shared<Timeline>();
  store.set_timeline(timeline);
  // Two passes, the odd tensors written (their evictions write back), every one checked.
  for (int pass = 0; pass < 2; ++pass) {
    store.step_begin();
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (i % 2 == 1) {
        f.write(tensors[i], kBytes, static_cast<uint32_t>(100 + i));
      } else {
        CHECK(f.holds(tensors[i], kBytes, static_cast<uint32_t>(10 + i)));
      }
    }
    store.step_end();
  }
  // Quiet the store while the timeline is still set, so that every move it recorded has ended
  // and every span is in: no read-ahead from here (an empty order); an acquire of each tensor
  // waits for its arrival's last copies (an NVMe -> GPU arrival completes for the store when
  // its reads are done, its copies' spans come when their stream reaches them); flush() ends the
  // write-backs. Without this a fresh-clone run counted spans that came after the count, or a
  // copy of a move that ended after the timeline was unset.
  REQUIRE(store.set_access_order({}).ok());
  REQUIRE(eventually([&] { return store.stats().fetches_in_flight == 0; }));
  for (size_t i = 0; i < tensors.size(); ++i) {
    CHECK(f.holds(tensors[i], kBytes, static_cast<uint32_t>(i % 2 == 1 ? 100 + i : 10 + i)));
  }
  REQUIRE(store.flush().ok());
  store.set_timeline(nullptr);
  const size_t recorded = timeline->spans().size();
  CHECK(f.holds(tensors[1], kBytes, 101));  // not recorded: the timeline is unset
  CHECK(timeline->spans().size() == recorded);

  const std::vector<Timeline::Span> spans = timeline->spans();
  absl::flat_hash_map<uint64_t, const Timeline::Span*> moves;
  size_t acquires = 0, reads = 0, write_backs = 0;
  for (const Timeline::Span& s : spans) {
    INFO(s.track << " / " << s.name);
    CHECK(s.start_ns <= s.end_ns);
    CHECK(s.start_ns >= 0);
    if (s.category == "acquire") ++acquires;
    if (s.category != "move") continue;
    CHECK(s.id != 0);
    CHECK(moves.emplace(s.id, &s).second);  // ids are unique
    CHECK(arg(s, "ok") == "yes");
    if (s.track == "nvme->gpu") ++reads;
    if (s.track == "gpu->nvme") {
      ++write_backs;
      CHECK(arg(s, "purpose") == "write-back");
    }
  }
  CHECK(acquires == 3 * tensors.size());  // two passes, then the quieting acquires
  CHECK(reads > 0);
  CHECK(write_backs > 0);
  size_t waits_on_moves = 0;
  for (const Timeline::Span& s : spans) {
    if (s.ref == 0) continue;
    INFO(s.category << " " << s.name << " refers to move " << s.ref);
    auto m = moves.find(s.ref);
    REQUIRE(m != moves.end());  // every reference names a recorded move
    if (s.category == "wait" && (s.name == "move in flight" || s.name == "own move")) {
      ++waits_on_moves;
      CHECK(arg(s, "tensor") == arg(*m->second, "tensor"));
    }
    if (s.category == "io") {  // a chunk lies within its move
      CHECK(s.start_ns >= m->second->start_ns);
      CHECK(s.end_ns <= m->second->end_ns);
    }
  }
  CHECK(waits_on_moves > 0);
  const auto trace = nlohmann::json::parse(timeline->chrome_json());
  CHECK(trace["displayTimeUnit"] == "ms");
  size_t events = 0;
  for (const auto& event : trace["traceEvents"]) events += event["ph"] == "X" ? 1 : 0;
  CHECK(events == spans.size());
}

// The older move is a write-back to the CPU tier over a D2H link throttled to 64 KB/s (1 s for
// its 64 KiB), which the completion worker blocks on; the read is a prefetch from NVMe with H2D
// unthrottled. Host only: the throttle is the HostDevice's.
TEST_CASE("A caller waiting for a prefetch ends it itself, not behind older moves",
          "[store][timeline]") {
  constexpr uint64_t kSmall = 64 * kKiB;
  HostDeviceOptions throttle;
  throttle.d2h_bytes_per_second = 64e3;
  auto device = make_host_device(throttle);
  REQUIRE(device.ok());
  StoreSetup setup;
  setup.staging_bytes = 4 * kMiB;
  setup.options.prefetch = false;  // only the explicit prefetch below
  Fixture f(**device, setup);
  TensorStore& store = f.store();
  auto read = store.create("read", kSmall, TierKind::kNvme);
  REQUIRE(read.ok());
  f.write(*read, kSmall, 10, TierKind::kCpu);
  REQUIRE(store.flush().ok());
  REQUIRE(store.evict(*read, TierKind::kCpu).ok());
  REQUIRE(store.wait_evicted(*read, TierKind::kCpu).ok());
  auto written = store.create("written", kSmall, TierKind::kCpu);
  REQUIRE(written.ok());
  f.write(*written, kSmall, 7);  // its newest bytes only on the GPU: evicting writes back

  auto timeline = std::make_shared<Timeline>();
  store.set_timeline(timeline);
  // Returns at once: the write-back (1 s of D2H) ends on the completion worker, which blocks on
  // it, the oldest move in flight.
  REQUIRE(store.evict(*written, TierKind::kGpu).ok());
  const StoreStats before = store.stats();
  REQUIRE(store.prefetch(*read, TierKind::kGpu).ok());
  REQUIRE(eventually([&] { return store.stats().prefetches_issued > before.prefetches_issued; }));
  auto address = store.acquire(*read, TierKind::kGpu, f.stream(), AccessMode::kRead);
  REQUIRE(address.ok());
  REQUIRE(store.release(*read, f.stream()).ok());
  REQUIRE(store.wait_evicted(*written, TierKind::kGpu).ok());
  store.set_timeline(nullptr);

  const Timeline::Span* write_back = nullptr;
  const Timeline::Span* prefetch = nullptr;
  const Timeline::Span* acquire = nullptr;
  const std::vector<Timeline::Span> spans = timeline->spans();
  for (const Timeline::Span& s : spans) {
    if (s.category == "move" && s.track == "gpu->cpu") write_back = &s;
    if (s.category == "move" && s.track == "nvme->gpu") prefetch = &s;
    if (s.category == "acquire" && s.name == "acquire read") acquire = &s;
  }
  REQUIRE(write_back != nullptr);
  REQUIRE(prefetch != nullptr);
  REQUIRE(acquire != nullptr);
  CHECK(arg(*prefetch, "purpose") == "prefetch");
  CHECK(acquire->ref == prefetch->id);  // it waited for that prefetch
  // The prefetch was issued after the write-back and its reads land in milliseconds: the
  // acquire that waited for it returned before the write-back's second of D2H was over. It used
  // to return only once the completion worker, blocked on the write-back, got to the read.
  CHECK(prefetch->start_ns > write_back->start_ns);
  CHECK(acquire->end_ns < write_back->end_ns);
  CHECK(store.stats().errors == 0);
}

// A tensor smaller than a staging chunk still moves between NVMe and the GPU in pieces, so that
// the H2D copy of one overlaps the read of the next (issue 26: an 8 MiB weight was read whole into
// a 32 MiB chunk, then copied whole, while the compute stream waited). Here the chunk is 128 KiB
// and the stripe unit 64 KiB: a 128 KiB tensor goes in two pieces each way.
STRATA_BOTH_BACKENDS("An NVMe <-> GPU move of a tensor below a chunk goes in pieces",
                     "[store][timeline]") {
  constexpr uint64_t kTwoUnits = 128 * kKiB;
  StoreSetup setup;
  setup.options.prefetch = false;
  Fixture f(device, setup);
  TensorStore& store = f.store();
  auto t = store.create("two-units", kTwoUnits, TierKind::kNvme);
  REQUIRE(t.ok());
  f.write(*t, kTwoUnits, 3, TierKind::kCpu);
  REQUIRE(store.flush().ok());
  REQUIRE(store.evict(*t, TierKind::kCpu).ok());
  REQUIRE(store.wait_evicted(*t, TierKind::kCpu).ok());

  auto timeline = std::make_shared<Timeline>();
  store.set_timeline(timeline);
  CHECK(f.holds(*t, kTwoUnits, 3));               // read from NVMe into the GPU
  f.write(*t, kTwoUnits, 4);                      // written on the GPU
  REQUIRE(store.evict(*t, TierKind::kGpu).ok());  // written back to NVMe
  store.set_timeline(nullptr);
  CHECK(f.holds(*t, kTwoUnits, 4));

  uint64_t read_move = 0, write_move = 0;
  for (const Timeline::Span& s : timeline->spans()) {
    if (s.category == "move" && s.track == "nvme->gpu") read_move = s.id;
    if (s.category == "move" && s.track == "gpu->nvme") write_move = s.id;
  }
  REQUIRE(read_move != 0);
  REQUIRE(write_move != 0);
  std::vector<uint64_t> read_pieces, write_pieces;
  for (const Timeline::Span& s : timeline->spans()) {
    if (s.category != "io") continue;
    const auto bytes = static_cast<uint64_t>(std::stod(arg(s, "bytes")));
    if (s.ref == read_move) read_pieces.push_back(bytes);
    if (s.ref == write_move) write_pieces.push_back(bytes);
  }
  CHECK(read_pieces == std::vector<uint64_t>{64 * kKiB, 64 * kKiB});
  CHECK(write_pieces == std::vector<uint64_t>{64 * kKiB, 64 * kKiB});
}

}  // namespace
}  // namespace strata
