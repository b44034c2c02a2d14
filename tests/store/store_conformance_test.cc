// The tensor store's conformance suite: one body per behaviour, run over {host, cuda} x
// {io_uring, psync} x {with, without NVMe} through the public Runtime/TensorStore API only, with
// every tensor's contents checked by checksum. Without a GPU the cuda variants print
// "SKIPPED: ..."; where the kernel refuses io_uring, so do the io_uring variants.
#include <absl/status/status.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "store/store_fixtures.h"
#include "strata/runtime/runtime.h"
#include "strata/store/tensor_store.h"

namespace strata::testing {
namespace {

constexpr TierKind kGpu = TierKind::kGpu;
constexpr TierKind kCpu = TierKind::kCpu;
constexpr TierKind kNvme = TierKind::kNvme;

size_t at(TierKind tier) { return static_cast<size_t>(tier); }

std::vector<TierKind> homes_of(const StoreVariant& variant) {
  std::vector<TierKind> homes = {kGpu, kCpu};
  if (variant.nvme) homes.push_back(kNvme);
  return homes;
}

// Every tier holds what it held before: nothing leaked, nothing double-freed.
void check_usage_back(const StoreStats& before, const StoreStats& after) {
  for (TierKind tier : {kGpu, kCpu, kNvme}) {
    INFO("tier " << to_string(tier));
    CHECK(after.tiers[at(tier)].used == before.tiers[at(tier)].used);
  }
}

STRATA_STORE_CONFORMANCE("store: create, write, evict, prefetch, flush and destroy keep the bytes",
                         "[store][conformance]") {
  auto rig = StoreRig::create_or_skip(variant);
  if (rig == nullptr) return;
  TensorStore& store = rig->store();
  const StoreStats empty = store.stats();
  CHECK(empty.tensors == 0);
  CHECK(empty.tiers[at(kGpu)].present);
  CHECK(empty.tiers[at(kCpu)].present);
  CHECK(empty.tiers[at(kNvme)].present == variant.nvme);

  const uint64_t bytes = 300 * kKiB + 7;  // several I/O blocks and staging chunks, odd tail
  uint32_t seed = 1;
  for (TierKind home : homes_of(variant)) {
    const std::string name = "w." + std::string(to_string(home));
    INFO(describe(variant) << ", home " << to_string(home));
    auto t = store.create(name, bytes, home);
    REQUIRE(t.ok());
    auto info = store.info(*t);
    REQUIRE(info.ok());
    CHECK(info->name == name);
    CHECK(info->bytes == bytes);
    CHECK(info->home == home);
    auto found = store.find(name);
    REQUIRE(found.ok());
    CHECK(*found == *t);
    CHECK(store.stats().tensors == 1);

    for (TierKind written : {kGpu, kCpu}) {
      const TierKind other = written == kGpu ? kCpu : kGpu;
      INFO("written in " << to_string(written));
      uint64_t sum = rig->write(*t, bytes, seed++, written);
      // The only newest copy, evicted: written back home first.
      if (written != home) REQUIRE(store.evict(*t, written).ok());
      CHECK(rig->holds(*t, bytes, sum, other));
      CHECK(rig->holds(*t, bytes, sum, written));
      // Only the home copy left: the newest bytes were written back to it first.
      for (TierKind tier : {kGpu, kCpu}) {
        if (tier != home) REQUIRE(store.evict(*t, tier).ok());
      }
      CHECK(rig->holds(*t, bytes, sum, other));
      // Prefetched toward both tiers, then read there.
      for (TierKind tier : {kGpu, kCpu}) {
        if (tier != home) REQUIRE(store.evict(*t, tier).ok());
      }
      REQUIRE(store.prefetch(*t, kGpu).ok());
      REQUIRE(store.prefetch(*t, kCpu).ok());
      CHECK(rig->holds(*t, bytes, sum, kGpu));
      CHECK(rig->holds(*t, bytes, sum, kCpu));
      // A newer version made home by flush(), then read from home alone.
      sum = rig->write(*t, bytes, seed++, other);
      REQUIRE(store.flush().ok());
      for (TierKind tier : {kGpu, kCpu}) {
        if (tier != home) REQUIRE(store.evict(*t, tier).ok());
      }
      CHECK(rig->holds(*t, bytes, sum, written));
      CHECK(rig->holds(*t, bytes, sum, other));
    }
    REQUIRE(store.destroy(*t).ok());
    CHECK(absl::IsNotFound(store.find(name).status()));
  }
  const StoreStats after = store.stats();
  CHECK(after.tensors == 0);
  CHECK(after.errors == 0);
  CHECK(after.hits + after.misses == after.acquires);
  CHECK(after.evictions_writeback > 0);
  check_usage_back(empty, after);
  CHECK(rig->swap_dir_entries() == 0);  // swap files never have a name
}

STRATA_STORE_CONFORMANCE("store: bytes move through every pair of tiers", "[store][conformance]") {
  auto rig = StoreRig::create_or_skip(variant);
  if (rig == nullptr) return;
  TensorStore& store = rig->store();
  const uint64_t bytes = 256 * kKiB + 5;
  uint32_t seed = 10;

  // gpu <-> cpu, on a CPU-homed tensor.
  auto c = store.create("c", bytes, kCpu);
  REQUIRE(c.ok());
  uint64_t sum = rig->write(*c, bytes, seed++, kCpu);
  CHECK(rig->holds(*c, bytes, sum, kGpu));  // cpu -> gpu
  sum = rig->write(*c, bytes, seed++, kGpu);
  REQUIRE(store.evict(*c, kGpu).ok());  // gpu -> cpu (write-back home)
  CHECK(rig->holds(*c, bytes, sum, kCpu));

  if (variant.nvme) {
    auto n = store.create("n", bytes, kNvme);
    REQUIRE(n.ok());
    sum = rig->write(*n, bytes, seed++, kCpu);
    REQUIRE(store.evict(*n, kGpu).ok());
    REQUIRE(store.evict(*n, kCpu).ok());      // cpu -> nvme (write-back home)
    CHECK(rig->holds(*n, bytes, sum, kCpu));  // nvme -> cpu
    REQUIRE(store.evict(*n, kCpu).ok());
    CHECK(rig->holds(*n, bytes, sum, kGpu));  // nvme -> gpu
    sum = rig->write(*n, bytes, seed++, kGpu);
    REQUIRE(store.flush().ok());  // gpu -> nvme
    REQUIRE(store.evict(*n, kGpu).ok());
    REQUIRE(store.evict(*n, kCpu).ok());
    CHECK(rig->holds(*n, bytes, sum, kGpu));
    CHECK(rig->holds(*n, bytes, sum, kCpu));
    REQUIRE(store.destroy(*n).ok());
  }
  REQUIRE(store.destroy(*c).ok());

  const StoreStats stats = store.stats();
  const std::vector<TierKind> tiers = homes_of(variant);
  for (TierKind from : tiers) {
    for (TierKind to : tiers) {
      if (from == to) continue;
      INFO(to_string(from) << " -> " << to_string(to));
      CHECK(stats.moves[at(from)][at(to)].moves > 0);
      CHECK(stats.moves[at(from)][at(to)].bytes >= bytes);
    }
  }
  if (!variant.nvme) {
    CHECK(stats.moves[at(kCpu)][at(kNvme)].moves == 0);
    CHECK(stats.moves[at(kNvme)][at(kGpu)].moves == 0);
  }
  CHECK(stats.errors == 0);
}

// What the sequence believes about one tensor.
struct Model {
  TensorHandle handle;
  std::string name;
  uint64_t bytes = 0;
  TierKind home = kCpu;
  uint64_t sum = 0;      // checksum of its newest bytes
  bool written = false;  // contents are undefined until first written
  int held_tier = -1;    // an acquisition left open across operations
  int held_stream = 0;
};

STRATA_STORE_CONFORMANCE("store: a seeded random sequence keeps the content model",
                         "[store][conformance][stress]") {
  auto rig = StoreRig::create_or_skip(variant);
  if (rig == nullptr) return;
  const uint32_t seed = GENERATE(1u, 2u);
  INFO(describe(variant) << ", seed " << seed);
  std::mt19937 rng(seed);
  const auto below = [&](uint64_t n) {
    return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
  };
  TensorStore& store = rig->store();
  const StoreStats empty = store.stats();
  const std::vector<TierKind> homes = homes_of(variant);
  // Homes reserve their tier at create(): capped so the rest of each tier stays a cache.
  std::map<TierKind, uint64_t> home_cap = {
      {kGpu, 512 * kKiB}, {kCpu, 2 * kMiB}, {kNvme, 12 * kMiB}};
  std::map<TierKind, uint64_t> home_bytes;

  std::vector<Model> live;
  std::vector<TensorHandle> dead;
  std::map<std::string, uint64_t> outcomes;  // so the run is known to cover each path
  uint32_t next_pattern = 1000;
  uint64_t created = 0;
  const auto held_count = [&] {
    return std::count_if(live.begin(), live.end(), [](const Model& m) { return m.held_tier >= 0; });
  };
  const auto release = [&](Model& m) {
    REQUIRE(store.release(m.handle, rig->stream(m.held_stream)).ok());
    m.held_tier = -1;
  };

  for (int op = 0; op < 1500; ++op) {
    const uint64_t what = below(100);
    INFO("op " << op << " kind " << what);
    if (what < 12 || live.empty()) {  // create
      Model m;
      m.name = "t" + std::to_string(created++);
      m.bytes = 1 + below(192 * kKiB);
      m.home = homes[below(homes.size())];
      if (home_bytes[m.home] + m.bytes > home_cap[m.home]) continue;
      auto t = store.create(m.name, m.bytes, m.home);
      INFO("create " << m.name << " " << m.bytes << " B in " << to_string(m.home));
      REQUIRE(t.ok());
      m.handle = *t;
      home_bytes[m.home] += m.bytes;
      live.push_back(m);
      ++outcomes["create"];
    } else if (what < 18) {  // destroy, maybe while held
      const size_t i = below(live.size());
      Model& m = live[i];
      const absl::Status status = store.destroy(m.handle);
      if (m.held_tier >= 0) {
        CHECK(absl::IsFailedPrecondition(status));
        ++outcomes["destroy-held"];
        release(m);
      } else {
        REQUIRE(status.ok());
        ++outcomes["destroy"];
        home_bytes[m.home] -= m.bytes;
        dead.push_back(m.handle);
        live.erase(live.begin() + static_cast<ptrdiff_t>(i));
      }
    } else if (what < 55) {  // acquire: write or check, then release or keep it
      Model& m = live[below(live.size())];
      if (m.held_tier >= 0) {  // a second, read-only acquisition in the same tier
        const auto tier = static_cast<TierKind>(m.held_tier);
        auto address = store.acquire(m.handle, tier, rig->stream(m.held_stream), AccessMode::kRead);
        REQUIRE(address.ok());
        if (m.written) CHECK(rig->sum(*address, tier, m.bytes, m.held_stream) == m.sum);
        REQUIRE(store.release(m.handle, rig->stream(m.held_stream)).ok());
        ++outcomes["acquire-nested"];
        continue;
      }
      const TierKind tier = below(2) == 0 ? kGpu : kCpu;
      const int s = static_cast<int>(below(2));
      const bool write = !m.written || below(3) == 0;
      // Half the writes are overwrites: every byte written, nothing fetched first.
      const bool overwrite = write && below(2) == 0;
      const AccessMode mode = overwrite ? AccessMode::kOverwrite
                              : write   ? AccessMode::kWrite
                                        : AccessMode::kRead;
      auto address = store.acquire(m.handle, tier, rig->stream(s), mode);
      INFO(m.name << " in " << to_string(tier) << " (" << to_string(mode)
                  << "): " << address.status());
      REQUIRE(address.ok());
      if (write) {
        m.sum = rig->fill(*address, tier, m.bytes, next_pattern++, s);
        m.written = true;
        ++outcomes[overwrite ? "overwrite" : "write"];
      } else {
        CHECK(rig->sum(*address, tier, m.bytes, s) == m.sum);
        ++outcomes["read"];
      }
      if (held_count() < 3 && below(3) == 0) {
        m.held_tier = static_cast<int>(tier);
        m.held_stream = s;
      } else {
        REQUIRE(store.release(m.handle, rig->stream(s)).ok());
      }
    } else if (what < 62) {  // release a held tensor, or one that is not acquired
      Model& m = live[below(live.size())];
      if (m.held_tier >= 0) {
        release(m);
      } else {
        CHECK(absl::IsFailedPrecondition(store.release(m.handle, rig->stream(0))));
        ++outcomes["release-unheld"];
      }
    } else if (what < 74) {  // evict
      Model& m = live[below(live.size())];
      const TierKind tier = homes[below(homes.size())];
      const absl::Status status = store.evict(m.handle, tier);
      if (tier == m.home) {
        CHECK(absl::IsInvalidArgument(status));
        ++outcomes["evict-home"];
      } else if (static_cast<int>(tier) == m.held_tier) {
        CHECK(absl::IsFailedPrecondition(status));
        ++outcomes["evict-held"];
      } else {
        CHECK(status.ok());
        ++outcomes["evict"];
      }
    } else if (what < 82) {
      const Model& m = live[below(live.size())];
      CHECK(store.prefetch(m.handle, below(2) == 0 ? kGpu : kCpu).ok());
      ++outcomes["prefetch"];
    } else if (what < 85) {
      CHECK(store.flush().ok());
      ++outcomes["flush"];
    } else if (what < 88) {
      if (below(2) == 0) {
        store.step_begin();
      } else {
        store.step_end();
      }
    } else if (what < 92) {  // find and info agree with the model
      const Model& m = live[below(live.size())];
      auto found = store.find(m.name);
      REQUIRE(found.ok());
      CHECK(*found == m.handle);
      auto info = store.info(m.handle);
      REQUIRE(info.ok());
      CHECK(info->bytes == m.bytes);
      CHECK(info->home == m.home);
    } else {  // invalid calls: each fails with its code and changes nothing
      const Model& m = live[below(live.size())];
      if (!dead.empty() && below(2) == 0) {
        const TensorHandle gone = dead[below(dead.size())];
        CHECK(absl::IsNotFound(
            store.acquire(gone, kCpu, rig->stream(0), AccessMode::kRead).status()));
        CHECK(absl::IsNotFound(store.evict(gone, kGpu)));
        CHECK(absl::IsNotFound(store.info(gone).status()));
        ++outcomes["stale"];
      } else {
        CHECK(absl::IsInvalidArgument(
            store.acquire(m.handle, kNvme, rig->stream(0), AccessMode::kRead).status()));
        ++outcomes["acquire-nvme"];
      }
    }
  }

  // Everything released and flushed: every written tensor holds its newest bytes everywhere.
  for (Model& m : live) {
    if (m.held_tier >= 0) release(m);
  }
  REQUIRE(store.flush().ok());
  for (const Model& m : live) {
    if (!m.written) continue;
    INFO("tensor " << m.name << " home " << to_string(m.home));
    CHECK(rig->holds(m.handle, m.bytes, m.sum, kCpu));
    CHECK(rig->holds(m.handle, m.bytes, m.sum, kGpu, 1));
    for (TierKind tier : {kGpu, kCpu}) {
      if (tier != m.home) REQUIRE(store.evict(m.handle, tier).ok());
    }
    CHECK(rig->holds(m.handle, m.bytes, m.sum, m.home == kGpu ? kCpu : kGpu));
  }
  StoreStats stats = store.stats();
  CHECK(stats.tensors == live.size());
  CHECK(stats.errors == 0);
  for (const char* path : {"create", "destroy", "write", "overwrite", "read", "evict", "evict-home",
                           "release-unheld", "prefetch", "flush", "stale"}) {
    INFO(path);
    CHECK(outcomes[path] > 0);
  }
  for (const Model& m : live) REQUIRE(store.destroy(m.handle).ok());
  stats = store.stats();
  CHECK(stats.tensors == 0);
  check_usage_back(empty, stats);
}

STRATA_STORE_CONFORMANCE("store: bad calls are errors that change nothing",
                         "[store][conformance]") {
  const StoreSizes sizes;
  auto rig = StoreRig::create_or_skip(variant, sizes);
  if (rig == nullptr) return;
  TensorStore& store = rig->store();
  Stream& stream = rig->stream();
  const uint64_t bytes = 64 * kKiB + 1;
  auto keep = store.create("keep", bytes, variant.nvme ? kNvme : kCpu);  // a home never evicted
  REQUIRE(keep.ok());
  const TierKind keep_home = variant.nvme ? kNvme : kCpu;
  const uint64_t kept = rig->write(*keep, bytes, 7, kGpu);
  // Only the home copies left, so that tier usage can be compared at the end.
  const auto settle = [&] {
    REQUIRE(store.flush().ok());
    REQUIRE(store.evict(*keep, kGpu).ok());
    if (keep_home != kCpu) REQUIRE(store.evict(*keep, kCpu).ok());
    return store.stats();
  };
  const StoreStats before = settle();

  // Arguments.
  CHECK(absl::IsInvalidArgument(store.create("zero", 0, kCpu).status()));
  CHECK(absl::IsAlreadyExists(store.create("keep", bytes, kCpu).status()));
  if (!variant.nvme) CHECK(absl::IsFailedPrecondition(store.create("n", bytes, kNvme).status()));
  CHECK(absl::IsInvalidArgument(store.acquire(*keep, kNvme, stream, AccessMode::kRead).status()));
  CHECK(absl::IsInvalidArgument(store.evict(*keep, keep_home)));
  CHECK(absl::IsFailedPrecondition(store.release(*keep, stream)));  // not acquired
  CHECK(absl::IsInvalidArgument(store.destroy(TensorHandle{})));
  CHECK(absl::IsNotFound(store.find("nope").status()));

  // An acquired tensor is neither destroyed nor evicted from the acquired tier.
  REQUIRE(store.acquire(*keep, kGpu, stream, AccessMode::kRead).ok());
  CHECK(absl::IsFailedPrecondition(store.destroy(*keep)));
  CHECK(absl::IsFailedPrecondition(store.evict(*keep, kGpu)));
  REQUIRE(store.release(*keep, stream).ok());

  // A destroyed handle stays dead, also once a new tensor takes its slot.
  auto doomed = store.create("doomed", bytes, kCpu);
  REQUIRE(doomed.ok());
  rig->write(*doomed, bytes, 8, kCpu);
  REQUIRE(store.destroy(*doomed).ok());
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    CHECK(absl::IsNotFound(store.acquire(*doomed, kGpu, stream, AccessMode::kRead).status()));
    CHECK(absl::IsNotFound(store.acquire(*doomed, kCpu, stream, AccessMode::kWrite).status()));
    CHECK(absl::IsNotFound(store.evict(*doomed, kGpu)));
    CHECK(absl::IsNotFound(store.prefetch(*doomed, kGpu)));
    CHECK(absl::IsNotFound(store.info(*doomed).status()));
    CHECK(absl::IsNotFound(store.destroy(*doomed)));
    if (round == 0) {
      auto reborn = store.create("doomed", bytes, kCpu);
      REQUIRE(reborn.ok());
      CHECK_FALSE(*reborn == *doomed);
      const uint64_t sum = rig->write(*reborn, bytes, 9, kGpu);
      CHECK(rig->holds(*reborn, bytes, sum, kCpu));
      REQUIRE(store.destroy(*reborn).ok());
    }
  }

  // A tensor bigger than every tier: refused at create(), whatever its home.
  const uint64_t huge = sizes.gpu + sizes.cpu + sizes.nvme + kMiB;
  for (TierKind home : homes_of(variant)) {
    INFO("huge tensor homed in " << to_string(home));
    auto t = store.create("huge", huge, home);
    CHECK(absl::IsResourceExhausted(t.status()));
  }
  // One that fits its home but not the GPU arena: acquiring it there fails, nothing is lost.
  auto wide = store.create("wide", sizes.gpu + kMiB, kCpu);
  REQUIRE(wide.ok());
  const uint64_t wide_sum = rig->write(*wide, sizes.gpu + kMiB, 11, kCpu);
  CHECK(absl::IsResourceExhausted(store.acquire(*wide, kGpu, stream, AccessMode::kRead).status()));
  CHECK(rig->holds(*wide, sizes.gpu + kMiB, wide_sum, kCpu));
  REQUIRE(store.destroy(*wide).ok());

  // The store still works, and the tensor it kept holds its bytes.
  const StoreStats after = settle();
  CHECK(after.tensors == before.tensors);
  check_usage_back(before, after);
  CHECK(rig->holds(*keep, bytes, kept, kCpu));
  CHECK(rig->holds(*keep, bytes, kept, kGpu));
  REQUIRE(store.destroy(*keep).ok());
}

}  // namespace
}  // namespace strata::testing
