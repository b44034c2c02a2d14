// The engines' error, retry and short-transfer paths, driven by FaultInjector on real I/O.
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <catch2/catch.hpp>
#include <cerrno>

#include "nvme/engine_fixtures.h"
#include "strata/testing/fault_injector.h"

namespace strata {
namespace {

using testing::AlignedBuffer;
using testing::Engine;
using testing::fill;
using testing::kBlock;
using testing::matches;
using testing::rule;
using testing::run_one;

constexpr uint64_t kFileBytes = 4 << 20;

struct Rig {
  std::vector<std::unique_ptr<testing::TempFile>> files;
  std::shared_ptr<FaultInjector> faults = std::make_shared<FaultInjector>();
  std::unique_ptr<IoEngine> io;

  Rig(Engine engine, int file_count, uint32_t depth = 2) {
    files = testing::temp_files(file_count, kFileBytes);
    io = testing::make_engine(engine,
                              testing::engine_options(testing::io_files(files), depth, {}, faults));
  }
};

// Six one-block writes to distinct offsets of `file`; returns each request's status.
std::vector<absl::Status> six_writes(IoEngine& io, uint32_t file, AlignedBuffer& data) {
  std::vector<absl::Status> results(6);
  IoWaiter waiter;
  std::vector<IoRequest> batch;
  for (uint32_t i = 0; i < 6; ++i) {
    batch.push_back(testing::request(IoOp::kWrite, file, i * kBlock, data.data() + i * kBlock,
                                     kBlock,
                                     [&results, i, cb = waiter.track()](absl::Status s) mutable {
                                       results[i] = s;
                                       std::move(cb)(std::move(s));
                                     }));
  }
  REQUIRE(io.submit(batch).ok());
  (void)waiter.wait();
  return results;
}

void expect_one_failure(Engine engine, int error_number, absl::StatusCode code,
                        std::string_view text) {
  Rig rig(engine, 2);
  // The third write to file 1 fails; file 0 is not affected by the rule.
  FaultRule third = rule(IoOp::kWrite, FaultRule::Action::kError);
  third.file = 1;
  third.skip = 2;
  third.error_number = error_number;
  rig.faults->add(third);
  AlignedBuffer data(6 * kBlock);
  fill(data.data(), data.size(), 42);

  for (const absl::Status& s : six_writes(*rig.io, 0, data)) CHECK(s.ok());
  const std::vector<absl::Status> results = six_writes(*rig.io, 1, data);
  int failed = 0;
  for (uint32_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) continue;
    ++failed;
    // Which write was third depends on completion order; its message names it.
    const std::string message(results[i].message());
    INFO(message);
    CHECK(results[i].code() == code);
    CHECK_THAT(message, Catch::Contains(absl::StrFormat("write of 4096 bytes at offset %d of %s",
                                                        i * kBlock, rig.files[1]->name())));
    CHECK_THAT(message, Catch::Contains(std::string(text)));
    CHECK_THAT(message, Catch::StartsWith(engine == Engine::kUring ? "io_uring" : "psync"));
  }
  CHECK(failed == 1);
  CHECK(rig.faults->fired() == 1);
  IoStats s = rig.io->stats();
  CHECK(s.errors == 1);
  CHECK(s.writes == 11);

  // The engine keeps working: rewrite and read everything back.
  for (const absl::Status& r : six_writes(*rig.io, 1, data)) CHECK(r.ok());
  AlignedBuffer back(6 * kBlock);
  REQUIRE(run_one(*rig.io, IoOp::kRead, 1, 0, back.data(), back.size()).ok());
  CHECK(std::memcmp(back.data(), data.data(), back.size()) == 0);
}

}  // namespace

STRATA_BOTH_ENGINES("EIO on one write fails that request only", "[nvme][faults]") {
  expect_one_failure(engine, EIO, absl::StatusCode::kDataLoss,
                     "failed: Input/output error (errno 5); the drive reported an I/O error");
}

STRATA_BOTH_ENGINES("ENOSPC on one write fails that request only", "[nvme][faults]") {
  expect_one_failure(engine, ENOSPC, absl::StatusCode::kResourceExhausted,
                     "No space left on device (errno 28); the file system is full");
}

STRATA_BOTH_ENGINES("short transfers are resubmitted until complete", "[nvme][faults]") {
  Rig rig(engine, 1);
  constexpr uint64_t kBytes = 256 * 1024;
  // Each direction: the first attempt moves half, the next a quarter of the request.
  for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
    FaultRule half = rule(op, FaultRule::Action::kShortTransfer);
    half.short_bytes = kBytes / 2;
    rig.faults->add(half);
    FaultRule quarter = rule(op, FaultRule::Action::kShortTransfer);
    quarter.skip = 1;
    quarter.short_bytes = kBytes / 4;
    rig.faults->add(quarter);
  }
  AlignedBuffer data(kBytes);
  fill(data.data(), kBytes, 77);
  REQUIRE(run_one(*rig.io, IoOp::kWrite, 0, 8 * kBlock, data.data(), kBytes).ok());
  AlignedBuffer back(kBytes);
  REQUIRE(run_one(*rig.io, IoOp::kRead, 0, 8 * kBlock, back.data(), kBytes).ok());
  CHECK(matches(back.data(), kBytes, 77));

  const IoStats s = rig.io->stats();
  CHECK(s.short_transfers == 4);
  CHECK(rig.faults->fired() == 4);
  CHECK(s.writes == 1);
  CHECK(s.reads == 1);
  CHECK(s.bytes_written == kBytes);  // requests, not attempts
  CHECK(s.errors == 0);
}

STRATA_BOTH_ENGINES("EAGAIN once is retried", "[nvme][faults]") {
  Rig rig(engine, 1);
  FaultRule again = rule(IoOp::kRead, FaultRule::Action::kError);
  again.error_number = EAGAIN;
  rig.faults->add(again);
  FaultRule interrupted = rule(IoOp::kWrite, FaultRule::Action::kError);
  interrupted.error_number = EINTR;
  rig.faults->add(interrupted);
  AlignedBuffer data(kBlock);
  fill(data.data(), kBlock, 5);
  REQUIRE(run_one(*rig.io, IoOp::kWrite, 0, 0, data.data(), kBlock).ok());
  AlignedBuffer back(kBlock);
  REQUIRE(run_one(*rig.io, IoOp::kRead, 0, 0, back.data(), kBlock).ok());
  CHECK(matches(back.data(), kBlock, 5));
  CHECK(rig.io->stats().retries == 2);
  CHECK(rig.io->stats().errors == 0);
}

STRATA_BOTH_ENGINES("EAGAIN forever fails after kMaxRetries", "[nvme][faults]") {
  Rig rig(engine, 1);
  FaultRule forever = rule(IoOp::kWrite, FaultRule::Action::kError);
  forever.times = UINT64_MAX;
  forever.error_number = EAGAIN;
  rig.faults->add(forever);
  AlignedBuffer data(kBlock);
  const absl::Status s = run_one(*rig.io, IoOp::kWrite, 0, 3 * kBlock, data.data(), kBlock);
  INFO(s.ToString());
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains(absl::StrFormat(
                 "write of 4096 bytes at offset 12288 of %s failed: still Resource temporarily "
                 "unavailable (errno 11) after 64 retries",
                 rig.files[0]->name())));
  CHECK_THAT(std::string(s.message()), Catch::Contains("lower the I/O depth"));
  CHECK(rig.io->stats().retries == IoEngine::kMaxRetries);
  CHECK(rig.faults->fired() == IoEngine::kMaxRetries + 1);
  CHECK(rig.io->stats().errors == 1);

  rig.faults->clear();
  CHECK(run_one(*rig.io, IoOp::kWrite, 0, 3 * kBlock, data.data(), kBlock).ok());
}

STRATA_BOTH_ENGINES("a delayed completion arrives later, intact", "[nvme][faults]") {
  Rig rig(engine, 1);
  AlignedBuffer data(kBlock);
  fill(data.data(), kBlock, 8);
  REQUIRE(run_one(*rig.io, IoOp::kWrite, 0, 0, data.data(), kBlock).ok());
  constexpr absl::Duration kDelay = absl::Milliseconds(50);
  FaultRule slow = rule(IoOp::kRead, FaultRule::Action::kDelay);
  slow.delay = kDelay;
  rig.faults->add(slow);
  AlignedBuffer back(kBlock);
  const absl::Time start = absl::Now();
  REQUIRE(run_one(*rig.io, IoOp::kRead, 0, 0, back.data(), kBlock).ok());
  // A lower bound only: the engine holds the completion at least as long as told.
  CHECK(absl::Now() - start >= kDelay);
  CHECK(matches(back.data(), kBlock, 8));
  CHECK(rig.faults->fired() == 1);
}

STRATA_BOTH_ENGINES("reading past the end of a file is an error", "[nvme][faults]") {
  Rig rig(engine, 1);
  AlignedBuffer back(2 * kBlock);
  // Real EOF: the last block exists, the one after it does not.
  absl::Status s = run_one(*rig.io, IoOp::kRead, 0, kFileBytes - kBlock, back.data(), 2 * kBlock);
  INFO(s.ToString());
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("failed: unexpected end of file after 4096 bytes"));
  CHECK(rig.io->stats().short_transfers == 1);

  // Injected: a read that reports zero bytes.
  rig.faults->add(rule(IoOp::kRead, FaultRule::Action::kShortTransfer));  // short_bytes = 0
  s = run_one(*rig.io, IoOp::kRead, 0, 0, back.data(), kBlock);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains(absl::StrFormat(
                 "read of 4096 bytes at offset 0 of %s failed: unexpected end of file;",
                 rig.files[0]->name())));
  CHECK(rig.io->stats().errors == 2);
}

TEST_CASE("FaultInjector matches rules in order and counts skip/times per rule", "[nvme]") {
  FaultInjector f;
  FaultRule writes = rule(IoOp::kWrite, FaultRule::Action::kError);
  writes.skip = 1;
  writes.times = 2;
  f.add(writes);  // EIO by default
  FaultRule file3 = rule(std::nullopt, FaultRule::Action::kShortTransfer);
  file3.file = 3;
  file3.times = UINT64_MAX;
  file3.short_bytes = 100;
  f.add(file3);
  // Writes to file 0: first passes, next two fail, then pass again.
  CHECK(f.apply(IoOp::kWrite, 0, 4096).result == 4096);
  CHECK(f.apply(IoOp::kWrite, 0, 4096).result == -EIO);
  CHECK(f.apply(IoOp::kWrite, 0, 4096).result == -EIO);
  CHECK(f.apply(IoOp::kWrite, 0, 4096).result == 4096);
  // Reads are not matched by the first rule; file 3 is by the second, forever.
  CHECK(f.apply(IoOp::kRead, 0, 4096).result == 4096);
  CHECK(f.apply(IoOp::kRead, 3, 4096).result == 100);
  CHECK(f.apply(IoOp::kRead, 3, 50).result == 50);      // already short
  CHECK(f.apply(IoOp::kRead, 3, -EIO).result == -EIO);  // errors pass through
  CHECK(f.fired() == 5);
  f.clear();
  CHECK(f.apply(IoOp::kRead, 3, 4096).result == 4096);
  CHECK(f.fired() == 5);

  FaultRule slow = rule(std::nullopt, FaultRule::Action::kDelay);
  slow.delay = absl::Milliseconds(3);
  f.add(slow);
  const FaultInjector::Decision d = f.apply(IoOp::kRead, 0, 7);
  CHECK(d.result == 7);
  CHECK(d.delay == absl::Milliseconds(3));
}

}  // namespace strata
