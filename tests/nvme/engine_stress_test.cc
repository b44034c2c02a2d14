// Many threads share one engine: each writes random-sized blocks at random places in its own
// region of two files, then reads them back and checks every byte. Run under TSan in CI.
#include <absl/strings/str_format.h>

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nvme/engine_fixtures.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::Engine;
using testing::fill;
using testing::kBlock;

constexpr int kThreads = 6;
constexpr int kRounds = 8;
constexpr int kPerBatch = 4;
constexpr uint64_t kSlot = 1 << 20;      // largest request
constexpr uint64_t kSlotsPerThread = 8;  // per file
constexpr uint64_t kRegion = kSlot * kSlotsPerThread;

struct Result {
  uint64_t requests = 0;
  uint64_t bytes = 0;
  std::string failure;  // Catch2 assertions are not thread-safe: report to the main thread
};

// One thread's work. Writes come from `slab` (registered with io_uring), reads land in a plain
// buffer, so both request kinds run concurrently.
void worker(IoEngine& io, int thread, std::byte* slab, Result& result) {
  std::mt19937_64 random(static_cast<uint64_t>(thread) * 7919 + 1);
  AlignedBuffer back(kPerBatch * kSlot);
  for (int round = 0; round < kRounds && result.failure.empty(); ++round) {
    struct Piece {
      uint32_t file;
      uint64_t offset;
      uint64_t length;
      uint64_t seed;
    };
    std::vector<Piece> pieces;
    std::vector<uint64_t> used;  // distinct slots within a batch, so writes never overlap
    while (pieces.size() < kPerBatch) {
      const uint32_t file = static_cast<uint32_t>(random() % 2);
      const uint64_t slot = random() % kSlotsPerThread;
      if (std::find(used.begin(), used.end(), file * kSlotsPerThread + slot) != used.end()) {
        continue;
      }
      used.push_back(file * kSlotsPerThread + slot);
      const uint64_t blocks = 1 + random() % (kSlot / kBlock);
      const uint64_t spare = (kSlot / kBlock - blocks) * kBlock;
      const uint64_t offset = static_cast<uint64_t>(thread) * kRegion + slot * kSlot +
                              (spare == 0 ? 0 : (random() % (spare / kBlock + 1)) * kBlock);
      pieces.push_back({file, offset, blocks * kBlock, random()});
    }
    std::vector<IoRequest> writes;
    std::vector<IoRequest> reads;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      fill(slab + i * kSlot, p.length, p.seed);
      writes.push_back(
          testing::request(IoOp::kWrite, p.file, p.offset, slab + i * kSlot, p.length));
      reads.push_back(
          testing::request(IoOp::kRead, p.file, p.offset, back.data() + i * kSlot, p.length));
    }
    if (absl::Status s = testing::run_batch(io, writes); !s.ok()) {
      result.failure = "write: " + s.ToString();
      return;
    }
    std::memset(back.data(), 0, back.size());
    if (absl::Status s = testing::run_batch(io, reads); !s.ok()) {
      result.failure = "read: " + s.ToString();
      return;
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!testing::matches(back.data() + i * kSlot, pieces[i].length, pieces[i].seed)) {
        result.failure = absl::StrFormat(
            "thread %d round %d: %d bytes at offset %d of file %d "
            "read back wrong",
            thread, round, pieces[i].length, pieces[i].offset, pieces[i].file);
        return;
      }
      result.requests += 2;
      result.bytes += 2 * pieces[i].length;
    }
  }
}

}  // namespace

STRATA_BOTH_ENGINES("IoEngine: concurrent submitters each read back their own data",
                    "[nvme][stress]") {
  auto files = testing::temp_files(2, kThreads * kRegion);
  AlignedBuffer slab(kThreads * kPerBatch * kSlot);
  auto io = testing::make_engine(
      engine,
      testing::engine_options(testing::io_files(files), 8, {IoBuffer{slab.data(), slab.size()}}));
  std::vector<Result> results(kThreads);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        worker(*io, t, slab.data() + static_cast<uint64_t>(t) * kPerBatch * kSlot, results[t]);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  uint64_t requests = 0;
  uint64_t bytes = 0;
  for (const Result& r : results) {
    CHECK(r.failure == "");
    requests += r.requests;
    bytes += r.bytes;
  }
  CHECK(requests == kThreads * kRounds * kPerBatch * 2);
  const IoStats s = io->stats();
  CHECK(s.reads + s.writes == requests);
  CHECK(s.bytes_read + s.bytes_written == bytes);
  CHECK(s.errors == 0);
  if (engine == Engine::kUring) {
    CHECK(s.fixed_requests == s.writes);  // every write came from the registered slab
    CHECK(s.max_in_flight <= 2 * 8);      // two rings, depth 8 each
  } else {
    CHECK(s.max_in_flight <= 8);
  }
}

}  // namespace strata
