// SwapSpace: striping, checksums, partial ranges, bad paths, exhaustion, injected faults,
// on-disk corruption, and concurrent use — on real O_DIRECT files in temporary directories.
#include "strata/swap_space.h"

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

#include "strata/fault_injector.h"
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
    CHECK_THAT(std::string(swap.status().message()), Catch::Contains("STRATA_NVME_BYTES"));
    CHECK(ok.entries() == 0);
  }
  SECTION("a stripe unit that is not a multiple of 4096") {
    auto swap = SwapSpace::create(options_for({ok.path()}, 16 * kMiB, 5000));
    REQUIRE(absl::IsInvalidArgument(swap.status()));
    CHECK_THAT(std::string(swap.status().message()), Catch::Contains("STRATA_IO_BLOCK"));
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
  CHECK_THAT(std::string(more.status().message()), Catch::Contains("STRATA_NVME_BYTES"));
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

}  // namespace
}  // namespace strata
