#include "strata/nvme/io_engine.h"

#include <sys/mman.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <vector>

#include "nvme/engine_fixtures.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::Engine;
using testing::engine_options;
using testing::fill;
using testing::kBlock;
using testing::matches;
using testing::request;
using testing::run_batch;
using testing::run_one;

constexpr uint64_t kFileBytes = 8 << 20;

struct Planned {
  uint32_t file;
  uint64_t offset;
  uint64_t length;
  bool fixed;       // inside the registered slab
  uint64_t at = 0;  // where in its buffer (slab offset, or index into `plain`)
};

// Requests over three files, sizes 4 KiB .. 1 MiB, half inside the registered slab.
std::vector<Planned> plan() {
  std::vector<Planned> out;
  uint64_t slab_at = 0;
  for (uint32_t i = 0; i < 24; ++i) {
    const uint64_t length = kBlock << (i % 9);  // 4 KiB .. 1 MiB
    Planned p{.file = i % 3, .offset = (i / 3) * (1 << 20), .length = length, .fixed = i % 2 == 0};
    if (p.fixed) {
      p.at = slab_at;
      slab_at += length;
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace

STRATA_BOTH_ENGINES("IoEngine writes and reads back patterns over several files", "[nvme]") {
  auto files = testing::temp_files(3, kFileBytes);
  AlignedBuffer slab(8 << 20);
  auto io = testing::make_engine(
      engine, engine_options(testing::io_files(files), 4, {IoBuffer{slab.data(), slab.size()}}));
  CHECK(io->warning().empty());
  CHECK(io->name() == (engine == Engine::kUring ? "io_uring" : "psync"));

  const std::vector<Planned> planned = plan();
  std::vector<std::unique_ptr<AlignedBuffer>> plain;
  auto buffer_of = [&](const Planned& p, size_t i) -> std::byte* {
    return p.fixed ? slab.data() + p.at : plain[i]->data();
  };
  for (const Planned& p : planned) plain.push_back(std::make_unique<AlignedBuffer>(p.length));

  // One batch of 24 writes at depth 4: most wait in the queue. Each callback counts its calls.
  std::vector<std::atomic<int>> calls(planned.size());
  std::vector<IoRequest> batch;
  uint64_t bytes = 0;
  uint64_t fixed = 0;
  IoWaiter waiter;
  for (size_t i = 0; i < planned.size(); ++i) {
    const Planned& p = planned[i];
    fill(buffer_of(p, i), p.length, 1000 + i);
    bytes += p.length;
    fixed += p.fixed ? 1 : 0;
    batch.push_back(request(IoOp::kWrite, p.file, p.offset, buffer_of(p, i), p.length,
                            [&calls, i, cb = waiter.track()](absl::Status s) mutable {
                              calls[i].fetch_add(1);
                              std::move(cb)(std::move(s));
                            }));
  }
  REQUIRE(io->submit(batch).ok());
  REQUIRE(waiter.wait().ok());
  for (auto& c : calls) CHECK(c.load() == 1);

  IoStats s = io->stats();
  CHECK(s.writes == planned.size());
  CHECK(s.bytes_written == bytes);
  CHECK(s.reads == 0);
  CHECK(s.errors == 0);
  CHECK(s.fixed_requests == (engine == Engine::kUring ? fixed : 0));
  CHECK(s.max_in_flight >= 1);
  CHECK(s.max_in_flight <= (engine == Engine::kUring ? 3 * 4 : 4));  // 3 rings or 4 threads
  CHECK(s.busy_ns > 0);

  // Wipe the buffers, read everything back.
  std::memset(slab.data(), 0, slab.size());
  for (auto& b : plain) std::memset(b->data(), 0, b->size());
  batch.clear();
  for (size_t i = 0; i < planned.size(); ++i) {
    const Planned& p = planned[i];
    batch.push_back(request(IoOp::kRead, p.file, p.offset, buffer_of(p, i), p.length));
  }
  REQUIRE(run_batch(*io, batch).ok());
  for (size_t i = 0; i < planned.size(); ++i) {
    INFO("request " << i);
    CHECK(matches(buffer_of(planned[i], i), planned[i].length, 1000 + i));
  }
  s = io->stats();
  CHECK(s.reads == planned.size());
  CHECK(s.bytes_read == bytes);
  CHECK(s.fixed_requests == (engine == Engine::kUring ? 2 * fixed : 0));
}

STRATA_BOTH_ENGINES("IoEngine rejects malformed requests without calling back", "[nvme]") {
  auto files = testing::temp_files(1, kFileBytes);
  auto io = testing::make_engine(engine, engine_options(testing::io_files(files)));
  AlignedBuffer buffer(kBlock);
  std::atomic<int> calls{0};
  auto counted = [&](uint32_t file, void* data, uint64_t length) {
    return request(IoOp::kWrite, file, 0, data, length,
                   [&calls](absl::Status) { calls.fetch_add(1); });
  };
  auto check = [&](std::vector<IoRequest> batch, std::string_view expected) {
    const absl::Status s = io->submit(batch);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()), Catch::Contains(std::string(expected)));
  };
  std::vector<IoRequest> batch;
  batch.push_back(counted(1, buffer.data(), kBlock));
  check(std::move(batch), "file index 1 is out of range; the engine has 1 file(s)");
  batch.clear();
  batch.push_back(counted(0, nullptr, kBlock));
  check(std::move(batch), "the buffer is null");
  batch.clear();
  batch.push_back(counted(0, buffer.data(), 0));
  check(std::move(batch), "the length is 0");
  // A good request batched with a bad one does not run either.
  batch.clear();
  batch.push_back(counted(0, buffer.data(), kBlock));
  batch.push_back(counted(7, buffer.data(), kBlock));
  check(std::move(batch), "I/O request 1 of 2");

  // The engine still works, and none of the rejected callbacks ever ran.
  REQUIRE(run_one(*io, IoOp::kWrite, 0, 0, buffer.data(), kBlock).ok());
  CHECK(calls.load() == 0);
  CHECK(io->stats().writes == 1);
}

STRATA_BOTH_ENGINES("IoEngine finishes queued requests when destroyed", "[nvme]") {
  auto files = testing::temp_files(2, kFileBytes);
  AlignedBuffer data(64 * kBlock);
  fill(data.data(), data.size(), 7);
  std::atomic<int> ok{0};
  std::atomic<int> calls{0};
  {
    auto io = testing::make_engine(engine, engine_options(testing::io_files(files), 2));
    std::vector<IoRequest> batch;
    for (uint32_t i = 0; i < 64; ++i) {
      batch.push_back(request(IoOp::kWrite, i % 2, i * kBlock, data.data() + i * kBlock, kBlock,
                              [&](absl::Status s) {
                                calls.fetch_add(1);
                                if (s.ok()) ok.fetch_add(1);
                              }));
    }
    REQUIRE(io->submit(batch).ok());
  }  // destroyed with most of the batch still queued
  CHECK(calls.load() == 64);
  CHECK(ok.load() == 64);

  auto io = testing::make_engine(engine, engine_options(testing::io_files(files)));
  AlignedBuffer back(kBlock);
  REQUIRE(run_one(*io, IoOp::kRead, 1, 63 * kBlock, back.data(), kBlock).ok());
  CHECK(std::memcmp(back.data(), data.data() + 63 * kBlock, kBlock) == 0);
}

STRATA_BOTH_ENGINES("IoEngine callbacks may submit follow-up requests", "[nvme]") {
  auto files = testing::temp_files(1, kFileBytes);
  auto io = testing::make_engine(engine, engine_options(testing::io_files(files)));
  AlignedBuffer out(kBlock);
  AlignedBuffer in(kBlock);
  fill(out.data(), kBlock, 11);
  IoWaiter waiter;
  IoCallback read_done = waiter.track();
  std::vector<IoRequest> write;
  write.push_back(request(IoOp::kWrite, 0, 5 * kBlock, out.data(), kBlock,
                          [&, cb = std::move(read_done)](absl::Status s) mutable {
                            if (!s.ok()) return std::move(cb)(s);
                            std::vector<IoRequest> read;
                            read.push_back(request(IoOp::kRead, 0, 5 * kBlock, in.data(), kBlock,
                                                   std::move(cb)));
                            if (absl::Status submitted = io->submit(read); !submitted.ok()) {
                              // Rejected: the engine did not take the callback; report through the
                              // waiter.
                              std::move(read[0].done)(submitted);
                            }
                          }));
  REQUIRE(io->submit(write).ok());
  REQUIRE(waiter.wait().ok());
  CHECK(std::memcmp(in.data(), out.data(), kBlock) == 0);
}

TEST_CASE("io_uring registers fixed buffers, or works without them and says why", "[nvme]") {
  auto files = testing::temp_files(1, kFileBytes);
  // Read-only memory cannot be pinned for the kernel to write into: registration fails.
  void* map = mmap(nullptr, 1 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  std::unique_ptr<void, void (*)(void*)> unmap(map, [](void* p) { munmap(p, 1 << 20); });
  auto io = testing::make_engine(
      Engine::kUring, engine_options(testing::io_files(files), 32, {IoBuffer{map, 1 << 20}}));
  CHECK_THAT(io->warning(), Catch::Contains("1048576 bytes of fixed buffers not registered"));
  CHECK_THAT(io->warning(), Catch::Contains("anonymous memory"));

  AlignedBuffer data(kBlock);
  fill(data.data(), kBlock, 3);
  REQUIRE(run_one(*io, IoOp::kWrite, 0, 0, data.data(), kBlock).ok());
  AlignedBuffer back(kBlock);
  REQUIRE(run_one(*io, IoOp::kRead, 0, 0, back.data(), kBlock).ok());
  CHECK(matches(back.data(), kBlock, 3));
  CHECK(io->stats().fixed_requests == 0);
}

TEST_CASE("io_uring uses a fixed buffer only for requests entirely inside it", "[nvme]") {
  auto files = testing::temp_files(1, kFileBytes);
  AlignedBuffer big(4 * kBlock);
  auto io = testing::make_engine(  // only the first half is registered
      Engine::kUring,
      engine_options(testing::io_files(files), 32, {IoBuffer{big.data(), 2 * kBlock}}));
  REQUIRE(io->warning().empty());
  fill(big.data(), big.size(), 9);
  REQUIRE(run_one(*io, IoOp::kWrite, 0, 0, big.data(), 2 * kBlock).ok());           // inside
  REQUIRE(run_one(*io, IoOp::kWrite, 0, 0, big.data() + kBlock, 2 * kBlock).ok());  // straddles
  REQUIRE(run_one(*io, IoOp::kWrite, 0, 0, big.data() + 2 * kBlock, kBlock).ok());  // outside
  CHECK(io->stats().fixed_requests == 1);
  CHECK(io->stats().writes == 3);
}

TEST_CASE("make_io_engine: auto probes io_uring and falls back to psync", "[nvme]") {
  auto files = testing::temp_files(1, kFileBytes);
  const IoEngineOptions options = engine_options(testing::io_files(files));
  const bool uring_works = make_uring_engine(options).ok();
  auto choice = make_io_engine(IoEngineKind::kAuto, options);
  REQUIRE(choice.ok());
  INFO(choice->decision.reason);
  if (uring_works) {  // as on the CI machines
    CHECK(choice->engine->name() == "io_uring");
    CHECK_THAT(choice->decision.reason, Catch::StartsWith("auto: the io_uring probe passed"));
    CHECK_THAT(choice->decision.reason, Catch::Contains(files[0]->name()));
  } else {
    CHECK(choice->engine->name() == "psync");
    CHECK_THAT(choice->decision.reason, Catch::Contains("io_uring refused"));
    CHECK_THAT(choice->decision.reason, Catch::EndsWith("using psync"));
    CHECK_THAT(choice->decision.warning, Catch::Contains("NVMe I/O uses psync"));
  }
  AlignedBuffer data(kBlock);
  CHECK(run_one(*choice->engine, IoOp::kWrite, 0, 0, data.data(), kBlock).ok());

  // Without files the probe is the ring's own eventfd read.
  auto no_files = make_io_engine(IoEngineKind::kAuto, engine_options({}));
  REQUIRE(no_files.ok());
  CHECK(no_files->engine != nullptr);
}

TEST_CASE("make_io_engine: psync and io_uring on request", "[nvme]") {
  auto files = testing::temp_files(1, kFileBytes);
  const IoEngineOptions options = engine_options(testing::io_files(files));
  auto psync = make_io_engine(IoEngineKind::kPsync, options);
  REQUIRE(psync.ok());
  CHECK(psync->engine->name() == "psync");
  CHECK(psync->decision.reason == "asked for by the I/O engine setting");
  CHECK(psync->decision.requested == IoEngineKind::kPsync);
  AlignedBuffer data(kBlock);
  fill(data.data(), kBlock, 5);
  REQUIRE(run_one(*psync->engine, IoOp::kWrite, 0, kBlock, data.data(), kBlock).ok());
  AlignedBuffer back(kBlock);
  REQUIRE(run_one(*psync->engine, IoOp::kRead, 0, kBlock, back.data(), kBlock).ok());
  CHECK(matches(back.data(), kBlock, 5));

  auto uring = make_io_engine(IoEngineKind::kIoUring, options);
  if (make_uring_engine(options).ok()) {
    REQUIRE(uring.ok());
    CHECK(uring->engine->name() == "io_uring");
  } else {
    REQUIRE_FALSE(uring.ok());
    CHECK_THAT(std::string(uring.status().message()), Catch::Contains("set it to psync"));
  }
}

TEST_CASE("IoEngine options are checked", "[nvme]") {
  const IoEngineOptions zero_depth = engine_options({}, 0);
  for (const absl::Status& s :
       {make_uring_engine(zero_depth).status(), make_psync_engine(zero_depth).status()}) {
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("the I/O depth 0 is out of range: use an integer from 1 to 4096"));
  }
  // The runtime's names reach the message: a user reads the variable to change.
  IoEngineOptions named = engine_options({}, 5000);
  named.names.depth = "STRATA_IO_DEPTH";
  CHECK_THAT(std::string(make_psync_engine(named).status().message()),
             Catch::Contains("STRATA_IO_DEPTH 5000 is out of range"));
  CHECK(check_io_depth(1).ok());
  CHECK(check_io_depth(kMaxIoDepth).ok());
  CHECK(absl::IsInvalidArgument(check_io_depth(-3)));
  CHECK(absl::IsInvalidArgument(check_io_depth(int64_t{kMaxIoDepth} + 1)));
  const IoEngineOptions closed = engine_options({IoFile{.fd = -1, .name = "swap file in /nvme0"}});
  auto made = make_psync_engine(closed);
  REQUIRE_FALSE(made.ok());
  CHECK_THAT(std::string(made.status().message()), Catch::Contains("swap file in /nvme0"));
}

TEST_CASE("IoWaiter keeps the first error and counts dropped callbacks", "[nvme]") {
  CHECK(IoWaiter().wait().ok());

  IoWaiter waiter;
  IoCallback a = waiter.track();
  IoCallback b = waiter.track();
  IoCallback c = waiter.track();
  std::move(a)(absl::OkStatus());
  std::move(b)(absl::DataLossError("first"));
  std::move(c)(absl::InternalError("second"));
  const absl::Status s = waiter.wait();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(s.message() == "first");

  // A callback destroyed without running (its batch was rejected) does not hang wait().
  IoWaiter dropped;
  { IoCallback never = dropped.track(); }
  CHECK(dropped.wait().code() == absl::StatusCode::kCancelled);

  CHECK(to_string(IoOp::kRead) == "read");
  CHECK(to_string(IoOp::kWrite) == "write");
}

}  // namespace strata
