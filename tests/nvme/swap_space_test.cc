// SwapSpace: striping, checksums, partial ranges, bad paths, exhaustion, injected faults,
// on-disk corruption, and concurrent use — on real O_DIRECT files in temporary directories.
#include "strata/nvme/swap_space.h"

#include <absl/strings/str_format.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "strata/base/format_bytes.h"
#include "strata/config/nvme_settings.h"
#include "strata/testing/fault_injector.h"
#include "temp_dir.h"

namespace strata {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

using testing::TempDir;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

Buffer aligned_buffer(uint64_t bytes) {
  const uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  return Buffer(static_cast<std::byte*>(std::aligned_alloc(4096, rounded)));
}

void fill(std::byte* data, uint64_t bytes, uint32_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(data + i, &v, std::min<uint64_t>(8, bytes - i));
  }
}

SwapSpaceOptions options_for(std::vector<std::string> paths, uint64_t per_path = 16 * kMiB,
                             uint64_t stripe = 64 * kKiB) {
  SwapSpaceOptions options;
  options.paths = std::move(paths);
  options.bytes_per_path = per_path;
  options.stripe_bytes = stripe;
  options.depth = 8;
  options.engine = IoEngineKind::kIoUring;
  return options;
}

std::unique_ptr<SwapSpace> make_swap(SwapSpaceOptions options) {
  auto swap = SwapSpace::create(std::move(options));
  REQUIRE(swap.ok());
  return *std::move(swap);
}

// The descriptors this process holds on unnamed files in `dir` (the swap files).
std::vector<int> swap_fds_in(const std::string& dir) {
  std::vector<int> fds;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.rfind(dir + "/", 0) == 0 &&
        target.find("(deleted)") != std::string::npos) {
      fds.push_back(std::stoi(entry.path().filename().string()));
    }
  }
  return fds;
}

TEST_CASE("SwapSpace round-trips tensors of every shape over striped paths", "[nvme][swap]") {
  const auto engine = GENERATE(IoEngineKind::kIoUring, IoEngineKind::kPsync);
  TempDir a, b, c;
  auto options = options_for({a.path(), b.path(), c.path()});
  options.engine = engine;
  auto swap = make_swap(options);
  CHECK(a.entries() == 0);  // the swap files have no names
  CHECK(swap_fds_in(a.path()).size() == 1);
  CHECK(swap->stats().engine == (engine == IoEngineKind::kIoUring ? "io_uring" : "psync"));

  // 1 byte, an unaligned tail, exactly one unit, units not a multiple of the paths, many units.
  for (const uint64_t bytes :
       {uint64_t{1}, 5000 + kKiB, 64 * kKiB, 5 * 64 * kKiB + 123, 3 * kMiB + 17}) {
    INFO("tensor bytes: " << bytes);
    auto extent = swap->allocate(bytes, "t" + std::to_string(bytes));
    REQUIRE(extent.ok());
    auto src = aligned_buffer(bytes);
    auto dst = aligned_buffer(bytes);
    fill(src.get(), bytes, static_cast<uint32_t>(bytes));
    REQUIRE(swap->write_sync(*extent, src.get(), bytes).ok());
    std::memset(dst.get(), 0, bytes);
    REQUIRE(swap->read_sync(*extent, dst.get(), bytes).ok());
    CHECK(std::memcmp(src.get(), dst.get(), bytes) == 0);
    REQUIRE(swap->free(*extent).ok());
  }
  // A multi-unit tensor uses every path.
  auto big = swap->allocate(6 * 64 * kKiB, "big");
  REQUIRE(big.ok());
  for (const SwapPathStats& path : swap->stats().paths) CHECK(path.arena.used == 2 * 64 * kKiB);
  CHECK(swap->stats().io.errors == 0);
}

TEST_CASE("Partial ranges read and write whole stripe units", "[nvme][swap]") {
  TempDir a, b;
  auto swap = make_swap(options_for({a.path(), b.path()}));
  const uint64_t unit = swap->stripe_bytes();
  const uint64_t bytes = 4 * unit + 1000;
  auto extent = swap->allocate(bytes, "layer.weight");
  REQUIRE(extent.ok());
  auto src = aligned_buffer(bytes);
  fill(src.get(), bytes, 1);
  // Write in two pieces, the second ending at the tensor's (unaligned) end.
  REQUIRE(swap->write_sync(*extent, src.get(), bytes).ok());
  auto part = aligned_buffer(bytes);
  IoWaiter waiter;
  REQUIRE(swap->read(*extent, 2 * unit, part.get(), bytes - 2 * unit, waiter.track()).ok());
  REQUIRE(waiter.wait().ok());
  CHECK(std::memcmp(part.get(), src.get() + 2 * unit, bytes - 2 * unit) == 0);

  SECTION("ranges that do not start or end on a unit are refused") {
    CHECK(absl::IsInvalidArgument(swap->read(*extent, 100, part.get(), unit, [](absl::Status) {})));
    CHECK(
        absl::IsInvalidArgument(swap->read(*extent, 0, part.get(), unit + 5, [](absl::Status) {})));
    CHECK(absl::IsInvalidArgument(
        swap->read(*extent, 0, part.get(), bytes + 1, [](absl::Status) {})));
    CHECK(
        absl::IsInvalidArgument(swap->write(*extent, 0, src.get() + 8, unit, [](absl::Status) {})));
    CHECK(absl::IsInvalidArgument(swap->write(*extent, 0, nullptr, unit, [](absl::Status) {})));
  }
  SECTION("reading a range never written is refused") {
    auto fresh = swap->allocate(unit, "never.written");
    REQUIRE(fresh.ok());
    auto status = swap->read_sync(*fresh, part.get(), unit);
    CHECK(absl::IsFailedPrecondition(status));
    CHECK_THAT(std::string(status.message()), Catch::Contains("never.written"));
  }
  SECTION("stale handles") {
    REQUIRE(swap->free(*extent).ok());
    CHECK(absl::IsNotFound(swap->free(*extent)));
    CHECK(absl::IsNotFound(swap->read_sync(*extent, part.get(), unit)));
    CHECK(absl::IsInvalidArgument(swap->free(ExtentHandle{})));
  }
}

TEST_CASE("Bad swap paths are errors that name the path", "[nvme][swap]") {
  TempDir ok;
  SECTION("missing directory") {
    auto swap = SwapSpace::create(options_for({ok.path() + "/missing"}));
    REQUIRE(absl::IsNotFound(swap.status()));
    CHECK_THAT(std::string(swap.status().message()), Catch::Contains(ok.path() + "/missing"));
  }
  SECTION("a file, not a directory") {
    const std::string file = ok.path() + "/plain-file";
    { std::ofstream(file) << "x"; }
    auto swap = SwapSpace::create(options_for({file}));
    REQUIRE(absl::IsInvalidArgument(swap.status()));
    CHECK_THAT(std::string(swap.status().message()), Catch::Contains("is not a directory"));
  }
  SECTION("a directory nobody can create files in") {
    // Tests run as root, where file modes do not stop writes; /proc refuses file creation to
    // everyone, which exercises the same error path.
    auto swap = SwapSpace::create(options_for({"/proc"}));
    REQUIRE_FALSE(swap.ok());
    CHECK_THAT(std::string(swap.status().message()), Catch::Contains("/proc"));
  }
  SECTION("more than the disk holds") {
    auto swap = SwapSpace::create(options_for({ok.path()}, uint64_t{1} << 60));
    REQUIRE(absl::IsResourceExhausted(swap.status()));
    CHECK_THAT(std::string(swap.status().message()), Catch::Contains(ok.path()));
    CHECK_THAT(std::string(swap.status().message()), Catch::Contains("free there"));
    CHECK_THAT(std::string(swap.status().message()),
               Catch::Contains("lower the swap size per path"));
    CHECK(ok.entries() == 0);
  }
  SECTION("a stripe unit that is not a multiple of 4096") {
    auto swap = SwapSpace::create(options_for({ok.path()}, 16 * kMiB, 5000));
    REQUIRE(absl::IsInvalidArgument(swap.status()));
    CHECK_THAT(std::string(swap.status().message()),
               Catch::Contains("the stripe unit 5000 must be a positive multiple of 4096"));
  }
}

TEST_CASE("A full swap space refuses new tensors and keeps the old ones", "[nvme][swap]") {
  TempDir a;
  auto swap = make_swap(options_for({a.path()}, 1 * kMiB));
  auto src = aligned_buffer(256 * kKiB);
  fill(src.get(), 256 * kKiB, 9);
  std::vector<ExtentHandle> stored;
  for (int i = 0; i < 4; ++i) {
    auto extent = swap->allocate(256 * kKiB, "p" + std::to_string(i));
    REQUIRE(extent.ok());
    REQUIRE(swap->write_sync(*extent, src.get(), 256 * kKiB).ok());
    stored.push_back(*extent);
  }
  auto more = swap->allocate(4 * kKiB, "one.too.many");
  REQUIRE(absl::IsResourceExhausted(more.status()));
  CHECK_THAT(std::string(more.status().message()), Catch::Contains("one.too.many"));
  CHECK_THAT(std::string(more.status().message()), Catch::Contains("raise the swap size per path"));
  auto dst = aligned_buffer(256 * kKiB);
  for (const ExtentHandle& extent : stored) {
    REQUIRE(swap->read_sync(extent, dst.get(), 256 * kKiB).ok());
    CHECK(std::memcmp(src.get(), dst.get(), 256 * kKiB) == 0);
  }
}

TEST_CASE("Injected I/O faults fail the move and lose nothing", "[nvme][swap][faults]") {
  const auto engine = GENERATE(IoEngineKind::kIoUring, IoEngineKind::kPsync);
  TempDir a, b;
  auto options = options_for({a.path(), b.path()});
  options.engine = engine;
  auto faults = std::make_shared<FaultInjector>();
  options.faults = faults;
  auto swap = make_swap(options);
  const uint64_t bytes = 8 * swap->stripe_bytes();
  auto extent = swap->allocate(bytes, "optimizer.exp_avg");
  REQUIRE(extent.ok());
  auto src = aligned_buffer(bytes);
  fill(src.get(), bytes, 3);
  auto pristine = aligned_buffer(bytes);
  std::memcpy(pristine.get(), src.get(), bytes);
  auto dst = aligned_buffer(bytes);

  SECTION("EIO and ENOSPC on a write") {
    const int error_number = GENERATE(EIO, ENOSPC);
    FaultRule rule;
    rule.op = IoOp::kWrite;
    rule.skip = 2;
    rule.error_number = error_number;
    faults->add(rule);
    auto status = swap->write_sync(*extent, src.get(), bytes);
    REQUIRE_FALSE(status.ok());
    CHECK_THAT(std::string(status.message()), Catch::Contains("optimizer.exp_avg"));
    CHECK_THAT(std::string(status.message()), Catch::Contains(std::strerror(error_number)));
    CHECK(std::memcmp(src.get(), pristine.get(), bytes) == 0);  // the source is untouched
    // The failed range holds no trustworthy data, so reading it is refused, not garbage.
    CHECK(absl::IsFailedPrecondition(swap->read_sync(*extent, dst.get(), bytes)));
    // The engine and the swap space keep working: the retry by the caller succeeds.
    REQUIRE(swap->write_sync(*extent, src.get(), bytes).ok());
    REQUIRE(swap->read_sync(*extent, dst.get(), bytes).ok());
    CHECK(std::memcmp(dst.get(), pristine.get(), bytes) == 0);
    CHECK(swap->stats().io.errors == 1);
  }
  SECTION("short writes and reads are completed transparently") {
    FaultRule rule;
    rule.action = FaultRule::Action::kShortTransfer;
    rule.short_bytes = 4096;
    rule.times = 6;
    faults->add(rule);
    REQUIRE(swap->write_sync(*extent, src.get(), bytes).ok());
    REQUIRE(swap->read_sync(*extent, dst.get(), bytes).ok());
    CHECK(std::memcmp(dst.get(), pristine.get(), bytes) == 0);
    CHECK(swap->stats().io.short_transfers >= 6);
  }
  SECTION("EIO on a read fails that read only") {
    REQUIRE(swap->write_sync(*extent, src.get(), bytes).ok());
    FaultRule rule;
    rule.op = IoOp::kRead;
    faults->add(rule);
    auto status = swap->read_sync(*extent, dst.get(), bytes);
    REQUIRE_FALSE(status.ok());
    CHECK_THAT(std::string(status.message()), Catch::Contains("optimizer.exp_avg"));
    REQUIRE(swap->read_sync(*extent, dst.get(), bytes).ok());
    CHECK(std::memcmp(dst.get(), pristine.get(), bytes) == 0);
  }
}

TEST_CASE("A flipped byte on disk is caught by the checksum", "[nvme][swap]") {
  TempDir a;
  auto options = options_for({a.path()});
  const bool verify = GENERATE(true, false);
  options.verify = verify;
  auto swap = make_swap(options);
  const uint64_t bytes = 3 * swap->stripe_bytes();
  auto extent = swap->allocate(bytes, "embedding.weight");
  REQUIRE(extent.ok());
  auto src = aligned_buffer(bytes);
  fill(src.get(), bytes, 5);
  REQUIRE(swap->write_sync(*extent, src.get(), bytes).ok());

  // Corrupt it through a second, buffered descriptor on the same (unnamed) file.
  const auto fds = swap_fds_in(a.path());
  REQUIRE(fds.size() == 1);
  const int corrupt = open(("/proc/self/fd/" + std::to_string(fds[0])).c_str(), O_RDWR);
  REQUIRE(corrupt >= 0);
  const uint64_t where = swap->stripe_bytes() + 4321;  // inside unit 1 (the first extent is at 0)
  unsigned char byte = 0;
  REQUIRE(pread(corrupt, &byte, 1, static_cast<off_t>(where)) == 1);
  byte ^= 0x40;
  REQUIRE(pwrite(corrupt, &byte, 1, static_cast<off_t>(where)) == 1);
  REQUIRE(fsync(corrupt) == 0);
  close(corrupt);

  auto dst = aligned_buffer(bytes);
  auto status = swap->read_sync(*extent, dst.get(), bytes);
  if (verify) {
    REQUIRE(absl::IsDataLoss(status));
    CHECK_THAT(std::string(status.message()), Catch::Contains("embedding.weight"));
    CHECK_THAT(std::string(status.message()), Catch::Contains("stripe unit 1"));
    CHECK(swap->stats().checksum_failures == 1);
  } else {
    // STRATA_VERIFY=off trades this protection for speed: the corrupted byte comes back.
    REQUIRE(status.ok());
    CHECK(std::memcmp(dst.get(), src.get(), bytes) != 0);
  }
}

TEST_CASE("Many threads swap concurrently without losing a byte", "[nvme][swap][stress]") {
  TempDir a, b;
  auto options = options_for({a.path(), b.path()}, 64 * kMiB);
  options.depth = 16;
  auto swap = make_swap(options);
  constexpr int kThreads = 6;
  constexpr int kRounds = 40;
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t + 1));
      for (int round = 0; round < kRounds; ++round) {
        const uint64_t bytes = 1 + rng() % (600 * kKiB);
        auto extent = swap->allocate(bytes, "t" + std::to_string(t));
        if (!extent.ok()) {
          ++errors;
          continue;
        }
        auto src = aligned_buffer(bytes);
        auto dst = aligned_buffer(bytes);
        fill(src.get(), bytes, static_cast<uint32_t>(t * 1000 + round));
        if (!swap->write_sync(*extent, src.get(), bytes).ok() ||
            !swap->read_sync(*extent, dst.get(), bytes).ok()) {
          ++errors;
        } else if (std::memcmp(src.get(), dst.get(), bytes) != 0) {
          ++mismatches;
        }
        if (!swap->free(*extent).ok()) ++errors;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(mismatches == 0);
  CHECK(errors == 0);
  const SwapStats stats = swap->stats();
  CHECK(stats.used == 0);
  CHECK(stats.extents == 0);
  CHECK(stats.io.errors == 0);
}

TEST_CASE("Two 8 MiB paths hold sixteen 1 MiB tensors", "[nvme][swap]") {
  // One stripe unit per tensor: before placement spread small tensors, all of them went to the
  // first path and the ninth failed with half of the space free.
  TempDir a, b;
  auto swap = make_swap(options_for({a.path(), b.path()}, 8 * kMiB, 1 * kMiB));
  REQUIRE(swap->capacity() == 16 * kMiB);
  auto src = aligned_buffer(kMiB);
  std::vector<ExtentHandle> stored;
  for (uint32_t i = 0; i < 16; ++i) {
    INFO("tensor " << i);
    auto extent = swap->allocate(kMiB, "w" + std::to_string(i));
    REQUIRE(extent.ok());
    fill(src.get(), kMiB, 100 + i);
    REQUIRE(swap->write_sync(*extent, src.get(), kMiB).ok());
    stored.push_back(*extent);
  }
  const SwapStats stats = swap->stats();
  CHECK(stats.used == 16 * kMiB);
  for (const SwapPathStats& path : stats.paths) CHECK(path.arena.used == 8 * kMiB);
  auto more = swap->allocate(1, "one.too.many");
  REQUIRE(absl::IsResourceExhausted(more.status()));
  CHECK_THAT(std::string(more.status().message()),
             Catch::Contains(absl::StrFormat("but %s of 16.00 MiB are free across 2 path(s)",
                                             format_bytes(0))));
  auto dst = aligned_buffer(kMiB);
  for (uint32_t i = 0; i < 16; ++i) {
    REQUIRE(swap->read_sync(stored[i], dst.get(), kMiB).ok());
    fill(src.get(), kMiB, 100 + i);
    CHECK(std::memcmp(src.get(), dst.get(), kMiB) == 0);
  }
}

TEST_CASE("Small tensors of mixed sizes fill every path to 99%, and refill after frees",
          "[nvme][swap]") {
  const int path_count = GENERATE(2, 3);
  const IoEngineKind engine = path_count == 2 ? IoEngineKind::kIoUring : IoEngineKind::kPsync;
  constexpr uint64_t kStripe = 64 * kKiB;
  std::vector<TempDir> dirs(static_cast<size_t>(path_count));
  std::vector<std::string> paths;
  for (const TempDir& dir : dirs) paths.push_back(dir.path());
  auto options = options_for(paths, 4 * kMiB, kStripe);
  options.engine = engine;
  options.verify = true;
  auto swap = make_swap(options);
  INFO(path_count << " paths, " << swap->stats().engine);

  struct Stored {
    ExtentHandle extent;
    uint64_t bytes;
    uint32_t seed;
  };
  std::vector<Stored> stored;
  std::mt19937 rng(static_cast<uint32_t>(path_count));
  // One stripe unit and smaller, unaligned tails included.
  const auto next_size = [&rng]() -> uint64_t {
    switch (rng() % 6) {
      case 0:
        return kStripe;
      case 1:
        return kStripe - 1;
      case 2:
        return 4 * kKiB;
      case 3:
        return 1 + rng() % 100;
      default:
        return 1 + rng() % kStripe;
    }
  };
  uint32_t seeds = 0;
  auto src = aligned_buffer(kStripe);
  // Allocates and writes tensors until 32 in a row do not fit (after frees, holes are filled by
  // the smaller ones); returns the last refusal.
  const auto fill_up = [&]() -> absl::Status {
    absl::Status refused;
    for (int misses = 0; misses < 32;) {
      const uint64_t bytes = next_size();
      const uint32_t seed = ++seeds;
      auto extent = swap->allocate(bytes, "t" + std::to_string(seed));
      if (!extent.ok()) {
        refused = extent.status();
        ++misses;
        continue;
      }
      misses = 0;
      fill(src.get(), bytes, seed);
      REQUIRE(swap->write_sync(*extent, src.get(), bytes).ok());
      stored.push_back({*extent, bytes, seed});
    }
    return refused;
  };
  const auto verify_all = [&] {
    auto dst = aligned_buffer(kStripe);
    int mismatches = 0;
    for (const Stored& s : stored) {
      REQUIRE(swap->read_sync(s.extent, dst.get(), s.bytes).ok());
      fill(src.get(), s.bytes, s.seed);
      if (std::memcmp(src.get(), dst.get(), s.bytes) != 0) ++mismatches;
    }
    CHECK(mismatches == 0);
    CHECK(swap->stats().checksum_failures == 0);
  };
  const auto check_full = [&](const absl::Status& full) {
    REQUIRE(absl::IsResourceExhausted(full));
    const SwapStats stats = swap->stats();
    INFO(full.message());
    CHECK(stats.capacity == static_cast<uint64_t>(path_count) * 4 * kMiB);
    CHECK(static_cast<double>(stats.used) >= 0.99 * static_cast<double>(stats.capacity));
    for (const SwapPathStats& path : stats.paths) {
      CHECK(static_cast<double>(path.arena.used) >= 0.98 * static_cast<double>(4 * kMiB));
    }
    // The message's figures are the swap space's own.
    CHECK_THAT(std::string(full.message()),
               Catch::Contains(absl::StrFormat("but %s of %s are free across %d path(s)",
                                               format_bytes(stats.capacity - stats.used),
                                               format_bytes(stats.capacity), path_count)));
  };

  check_full(fill_up());
  verify_all();

  // Free every third tensor, then refill with new contents.
  std::vector<Stored> kept;
  for (size_t i = 0; i < stored.size(); ++i) {
    if (i % 3 == 0) {
      REQUIRE(swap->free(stored[i].extent).ok());
    } else {
      kept.push_back(stored[i]);
    }
  }
  stored = std::move(kept);
  const uint64_t before_refill = stored.size();
  check_full(fill_up());
  CHECK(stored.size() > before_refill);
  verify_all();
  CHECK(swap->stats().io.errors == 0);
}

TEST_CASE("auto decided upstream falls back to psync when io_uring cannot read the swap file",
          "[nvme][swap]") {
  TempDir a;
  auto options = options_for({a.path()});
  options.engine = IoEngineKind::kAuto;
  // As the runtime passes it: auto chose io_uring from the machine's probe.
  IoEngineDecision decided;
  decided.requested = IoEngineKind::kAuto;
  decided.kind = IoEngineKind::kIoUring;
  decided.reason = "auto: the io_uring probe passed (test)";
  options.decided = decided;
  options.names = io_setting_names();
  SECTION("the probe read passes: the upstream decision stands") {
    auto swap = make_swap(options);
    const SwapStats stats = swap->stats();
    if (stats.engine == "io_uring") {
      CHECK(stats.engine_reason == decided.reason);
      CHECK(stats.warnings.empty());
    }
  }
  SECTION("the probe read fails: psync, with a warning, not an error") {
    auto faults = std::make_shared<FaultInjector>();
    FaultRule refuse;
    refuse.op = IoOp::kRead;
    refuse.error_number = EINVAL;
    faults->add(refuse);
    options.faults = faults;
    auto swap = SwapSpace::create(options);
    INFO(swap.status().ToString());
    REQUIRE(swap.ok());
    const SwapStats stats = (*swap)->stats();
    CHECK(stats.engine == "psync");
    CHECK_THAT(stats.engine_reason, Catch::StartsWith("auto: io_uring refused"));
    CHECK_THAT(stats.engine_reason, Catch::EndsWith("using psync"));
    CHECK(stats.engine_reason.find("STRATA_IO_ENGINE=io_uring") == std::string::npos);
    REQUIRE(stats.warnings.size() == 1);
    CHECK_THAT(stats.warnings[0], Catch::Contains("NVMe I/O uses psync"));
    // It works.
    auto extent = (*swap)->allocate(3 * kKiB, "after.fallback");
    REQUIRE(extent.ok());
    auto src = aligned_buffer(3 * kKiB);
    auto dst = aligned_buffer(3 * kKiB);
    fill(src.get(), 3 * kKiB, 77);
    REQUIRE((*swap)->write_sync(*extent, src.get(), 3 * kKiB).ok());
    REQUIRE((*swap)->read_sync(*extent, dst.get(), 3 * kKiB).ok());
    CHECK(std::memcmp(src.get(), dst.get(), 3 * kKiB) == 0);
  }
}

TEST_CASE("The runtime's names reach the swap space's errors", "[nvme][swap][config]") {
  TempDir ok;
  auto options = options_for({ok.path()}, 1 * kMiB);
  options.names = io_setting_names();
  {
    auto swap = make_swap(options);
    auto big = swap->allocate(2 * kMiB, "too.big");
    REQUIRE(absl::IsResourceExhausted(big.status()));
    CHECK_THAT(std::string(big.status().message()),
               Catch::Contains("raise STRATA_NVME_BYTES or add paths to STRATA_NVME_PATHS"));
  }
  options.paths = {ok.path() + "/missing"};
  auto missing = SwapSpace::create(options);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("STRATA_NVME_PATHS entry '" + ok.path() + "/missing'"));
  options.paths = {ok.path()};
  options.depth = 0;
  CHECK_THAT(std::string(SwapSpace::create(options).status().message()),
             Catch::Contains("STRATA_IO_DEPTH 0 is out of range: use an integer from 1 to 4096"));
}

}  // namespace
}  // namespace strata
