// io_uring with lazy_buffers: nothing registered at start, each buffer registered when asked
// (on every ring, while the rings run), requests into buffers not yet registered served
// unregistered with the same bytes, and a registration failure (RLIMIT_MEMLOCK's ENOMEM)
// degrading to unregistered I/O with one warning.
#include <atomic>
#include <thread>

#include "engine_fixtures.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::Engine;
using testing::engine_options;
using testing::fill;
using testing::kBlock;
using testing::matches;
using testing::run_batch;
using testing::run_one;

constexpr uint64_t kFileBytes = 1 << 20;
constexpr uint64_t kPiece = 16 * kBlock;
constexpr uint32_t kPieces = 4;

std::vector<IoBuffer> pieces_of(const AlignedBuffer& slab) {
  std::vector<IoBuffer> pieces;
  for (uint32_t i = 0; i < kPieces; ++i)
    pieces.push_back(IoBuffer{slab.data() + i * kPiece, kPiece});
  return pieces;
}

// Writes a block from piece `piece` of the slab to `file`, reads it back into the next piece's
// first block, and checks the bytes.
void round_trip(IoEngine& io, const AlignedBuffer& slab, uint32_t piece, uint32_t file,
                uint64_t seed) {
  std::byte* src = slab.data() + piece * kPiece;
  std::byte* dst = slab.data() + ((piece + 1) % kPieces) * kPiece + kBlock;
  fill(src, kBlock, seed);
  REQUIRE(run_one(io, IoOp::kWrite, file, 8 * kBlock, src, kBlock).ok());
  std::memset(dst, 0, kBlock);
  REQUIRE(run_one(io, IoOp::kRead, file, 8 * kBlock, dst, kBlock).ok());
  CHECK(matches(dst, kBlock, seed));
}

TEST_CASE("io_uring with lazy buffers registers each buffer when asked, on every ring", "[nvme]") {
  auto files = testing::temp_files(2, kFileBytes);  // two rings
  AlignedBuffer slab(kPieces * kPiece);
  IoEngineOptions options = engine_options(testing::io_files(files), 8, pieces_of(slab));
  options.lazy_buffers = true;
  auto io = testing::make_engine(Engine::kUring, options);
  REQUIRE(io->warning().empty());
  CHECK(io->stats().registered_bytes == 0);

  // Nothing registered yet: plain READ/WRITE, same bytes.
  round_trip(*io, slab, 1, 0, 1);
  round_trip(*io, slab, 1, 1, 2);
  CHECK(io->stats().fixed_requests == 0);

  REQUIRE(io->register_buffer(1).ok());
  IoStats s = io->stats();
  CHECK(s.registered_bytes == 2 * kPiece);  // one registration per ring
  CHECK(s.registrations == 2);
  CHECK(s.registration_failures == 0);
  // Writes from piece 1 now use it; the reads land in piece 2, still unregistered.
  round_trip(*io, slab, 1, 0, 3);
  round_trip(*io, slab, 1, 1, 4);
  CHECK(io->stats().fixed_requests == 2);
  round_trip(*io, slab, 3, 0, 5);  // piece 3, never registered; reads into piece 0
  CHECK(io->stats().fixed_requests == 2);

  REQUIRE(io->register_buffer(1).ok());  // again: nothing more
  CHECK(io->stats().registrations == 2);
  CHECK(absl::IsInvalidArgument(io->register_buffer(kPieces)));

  // Eager (the default): every buffer on every ring at start.
  IoEngineOptions eager = engine_options(testing::io_files(files), 8, pieces_of(slab));
  auto all = testing::make_engine(Engine::kUring, eager);
  CHECK(all->stats().registered_bytes == 2 * kPieces * kPiece);
  REQUIRE(all->register_buffer(0).ok());  // a no-op
  CHECK(all->stats().registrations == 2 * kPieces);
  // psync registers nothing and takes the call.
  auto psync = testing::make_engine(Engine::kPsync, options);
  CHECK(psync->register_buffer(0).ok());
  CHECK(psync->stats().registered_bytes == 0);
}

TEST_CASE("A failed registration stops registering, warns once, and I/O goes on", "[nvme]") {
  auto files = testing::temp_files(2, kFileBytes);
  AlignedBuffer slab(kPieces * kPiece);
  auto faults = std::make_shared<FaultInjector>();
  // Through: the two rings' empty tables and piece 0 on ring 0. Then ENOMEM, as RLIMIT_MEMLOCK.
  faults->fail_registrations(3, ENOMEM);
  IoEngineOptions options = engine_options(testing::io_files(files), 8, pieces_of(slab), faults);
  options.lazy_buffers = true;
  auto io = testing::make_engine(Engine::kUring, options);
  REQUIRE(io->warning().empty());

  const absl::Status failed = io->register_buffer(0);
  CHECK(absl::IsResourceExhausted(failed));
  CHECK_THAT(io->warning(), Catch::Contains("RLIMIT_MEMLOCK"));
  CHECK_THAT(io->warning(), Catch::Contains("stopped"));
  CHECK(io->register_buffer(1).ok());  // registration has stopped: later calls do nothing
  IoStats s = io->stats();
  CHECK(s.registration_failures == 1);
  CHECK(s.registrations == 1);
  CHECK(s.registered_bytes == kPiece);

  // Piece 0 is registered on ring 0 (file 0) only: fixed there, plain on ring 1, bytes right.
  round_trip(*io, slab, 0, 0, 11);
  CHECK(io->stats().fixed_requests == 1);
  round_trip(*io, slab, 0, 1, 12);
  CHECK(io->stats().fixed_requests == 1);
  round_trip(*io, slab, 1, 1, 13);
  CHECK(io->stats().errors == 0);
}

// Registration runs on the pinned CPU tier's background thread while I/O runs: requests taken
// before a buffer's registration use plain I/O, later ones the fixed buffer, all bytes right.
TEST_CASE("Buffers registered while I/O runs into them keep every byte", "[nvme][stress]") {
  auto files = testing::temp_files(2, kFileBytes);
  AlignedBuffer slab(kPieces * kPiece);
  IoEngineOptions options = engine_options(testing::io_files(files), 4, pieces_of(slab));
  options.lazy_buffers = true;
  auto io = testing::make_engine(Engine::kUring, options);
  std::atomic<bool> go{false};
  std::atomic<int> failed{0};  // Catch2 assertions are for the main thread only
  std::thread registrar([&] {
    while (!go.load()) std::this_thread::yield();
    for (uint32_t i = 0; i < kPieces; ++i) {
      if (!io->register_buffer(i).ok()) failed.fetch_add(1);
      std::this_thread::yield();
    }
  });
  constexpr uint64_t kBlocks = kPieces * kPiece / kBlock;
  // Every block of the slab out to the files, then back, checked.
  const auto round_of = [&](int round) {
    std::vector<IoRequest> batch;
    for (uint64_t b = 0; b < kBlocks; ++b) {
      fill(slab.data() + b * kBlock, kBlock, 100 * round + b);
      batch.push_back(
          testing::request(IoOp::kWrite, b % 2, b * kBlock, slab.data() + b * kBlock, kBlock));
    }
    REQUIRE(run_batch(*io, batch).ok());
    std::memset(slab.data(), 0, slab.size());
    batch.clear();
    for (uint64_t b = 0; b < kBlocks; ++b) {
      batch.push_back(
          testing::request(IoOp::kRead, b % 2, b * kBlock, slab.data() + b * kBlock, kBlock));
    }
    REQUIRE(run_batch(*io, batch).ok());
    uint64_t wrong = 0;
    for (uint64_t b = 0; b < kBlocks; ++b) {
      wrong += matches(slab.data() + b * kBlock, kBlock, 100 * round + b) ? 0 : 1;
    }
    CHECK(wrong == 0);
  };
  for (int round = 0; round < 12; ++round) {
    if (round == 1) go.store(true);
    round_of(round);
  }
  registrar.join();
  CHECK(failed.load() == 0);
  const uint64_t fixed_before = io->stats().fixed_requests;
  round_of(12);  // after every registration: all fixed
  const IoStats s = io->stats();
  CHECK(s.fixed_requests - fixed_before == 2 * kBlocks);
  CHECK(s.registrations == 2 * kPieces);
  CHECK(s.errors == 0);
}

}  // namespace
}  // namespace strata
