// The bookkeeping every backend shares (comm/communicator_base.h), tested over a recording
// transport instead of Gloo or NCCL: sequence numbers, argument checks, statistics, the
// signature comparison, the monitor's notifications and the broken state. Jobs of one rank, and
// of two ranks on threads of this process (each with its own JobMonitor over a real rendezvous).
#include "comm/communicator_base.h"

#include <absl/synchronization/mutex.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/job_monitor.h"
#include "comm/rank_processes.h"
#include "strata/base/mutex.h"

namespace strata {
namespace {

using comm_internal::CollectiveCall;
using comm_internal::JobMonitor;
using comm_internal::Operation;
using namespace std::chrono_literals;

class DoneWork final : public CollectiveWork {
 public:
  explicit DoneWork(uint64_t sequence) : sequence_(sequence) {}
  absl::Status wait() override { return absl::OkStatus(); }
  absl::Status synchronize() override { return absl::OkStatus(); }
  uint64_t sequence() const override { return sequence_; }

 private:
  uint64_t sequence_;
};

// A backend whose transport moves nothing and records every hook the base calls.
class RecordingCommunicator final : public comm_internal::CommunicatorBase {
 public:
  using CommunicatorBase::CommunicatorBase;
  CommBackendKind backend() const override { return CommBackendKind::kGloo; }

  // The test's controls.
  void fail_at(uint64_t sequence, std::string local) {
    MutexLock lock(&mutex_);
    fail_at_ = sequence;
    fail_local_ = std::move(local);
  }
  // Signature exchange: the other ranks send this instead of the same signature.
  void peers_send(std::optional<CollectiveCall> call) {
    MutexLock lock(&mutex_);
    peer_call_ = std::move(call);
  }
  void exchange_fails(std::string why) {
    MutexLock lock(&mutex_);
    exchange_error_ = std::move(why);
  }

  // What the base did.
  std::vector<uint64_t> started() const {
    MutexLock lock(&mutex_);
    return started_;
  }
  int exchanges() const {
    MutexLock lock(&mutex_);
    return exchanges_;
  }
  int aborts() const {
    MutexLock lock(&mutex_);
    return aborts_;
  }
  std::vector<absl::Status> broken() const {
    MutexLock lock(&mutex_);
    return broken_;
  }

 protected:
  std::string engine() const override { return "recording"; }
  absl::Status check_options(const CollectiveOptions& options) override {
    if (options.stream != nullptr) return absl::InvalidArgumentError("no streams here");
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<CollectiveWork>> start(const Operation& op,
                                                        const CollectiveOptions& options) override {
    std::optional<std::string> failure;
    {
      MutexLock lock(&mutex_);
      // Called under the issue lock: the numbers arrive in order.
      started_.push_back(op.call.sequence);
      if (fail_at_ == op.call.sequence) failure = fail_local_;
    }
    if (settings().debug) {
      if (absl::Status s = check_signatures(op.call, options); !s.ok()) return s;
    }
    if (failure) return fail(op.call, *failure);
    return std::make_unique<DoneWork>(op.call.sequence);
  }
  absl::StatusOr<std::vector<CollectiveCall::Signature>> exchange_signatures(
      const CollectiveCall& call, const CollectiveOptions&) override {
    MutexLock lock(&mutex_);
    ++exchanges_;
    if (!exchange_error_.empty()) return absl::UnavailableError(exchange_error_);
    std::vector<CollectiveCall::Signature> all(size(), call.signature());
    if (peer_call_) {
      CollectiveCall theirs = *peer_call_;
      theirs.sequence = call.sequence;
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) all[r] = theirs.signature();
      }
    }
    return all;
  }
  void abort_transport() override {
    MutexLock lock(&mutex_);
    ++aborts_;
  }
  void on_broken(const absl::Status& error) override {
    MutexLock lock(&mutex_);
    broken_.push_back(error);
  }

 private:
  mutable absl::Mutex mutex_;
  uint64_t fail_at_ ABSL_GUARDED_BY(mutex_) = 0;
  std::string fail_local_ ABSL_GUARDED_BY(mutex_);
  std::optional<CollectiveCall> peer_call_ ABSL_GUARDED_BY(mutex_);
  std::string exchange_error_ ABSL_GUARDED_BY(mutex_);
  std::vector<uint64_t> started_ ABSL_GUARDED_BY(mutex_);
  int exchanges_ ABSL_GUARDED_BY(mutex_) = 0;
  int aborts_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<absl::Status> broken_ ABSL_GUARDED_BY(mutex_);
};

CommOptions options_of(int rank, int world_size, uint16_t port, bool debug = false) {
  CommOptions options;
  options.launch.rank = rank;
  options.launch.world_size = world_size;
  options.launch.master_port = port;
  options.launch.launched = world_size > 1;
  options.settings.timeout = 20s;
  options.settings.debug = debug;
  return options;
}

std::unique_ptr<RecordingCommunicator> alone(bool debug = false) {
  const CommOptions options = options_of(0, 1, 0, debug);
  auto monitor = JobMonitor::join(options.launch, options.settings);
  REQUIRE(monitor.ok());
  return std::make_unique<RecordingCommunicator>(options, *std::move(monitor));
}

// Ranks on threads of this process, each with its own monitor over one rendezvous. Rank 0 is
// destroyed last: it serves the rendezvous until the others have left.
struct Job {
  std::vector<std::unique_ptr<RecordingCommunicator>> ranks;
  explicit Job(int world_size, bool debug = false) {
    const uint16_t port = testing::free_port();
    std::vector<absl::StatusOr<std::unique_ptr<JobMonitor>>> monitors;
    for (int r = 0; r < world_size; ++r) monitors.emplace_back(absl::UnknownError("not run"));
    {
      std::vector<std::jthread> joining;
      for (int r = 0; r < world_size; ++r) {
        joining.emplace_back(
            [&, r] { monitors[r] = JobMonitor::join(options_of(r, world_size, port).launch, {}); });
      }
    }
    for (int r = 0; r < world_size; ++r) {
      REQUIRE(monitors[r].ok());
      ranks.push_back(std::make_unique<RecordingCommunicator>(
          options_of(r, world_size, port, debug), *std::move(monitors[r])));
    }
  }
  ~Job() {
    while (!ranks.empty()) ranks.pop_back();
  }
  RecordingCommunicator& operator[](int rank) { return *ranks[rank]; }
};

bool contains(const absl::Status& status, const std::string& part) {
  return std::string(status.message()).find(part) != std::string::npos;
}

TEST_CASE("Communicator base: a call rejected for its arguments takes no sequence number",
          "[comm][base]") {
  Job job(2);
  RecordingCommunicator& c = job[0];
  std::vector<float> buffer(8);
  auto first = c.barrier();
  REQUIRE(first.ok());
  CHECK((*first)->sequence() == 1);
  const CommStats before = c.stats();

  const std::vector<uint64_t> three_counts = {1, 1, 1};
  auto gather = c.all_gather(buffer.data(), buffer.data(), std::span<const uint64_t>(three_counts),
                             DataType::kFloat32);
  REQUIRE_FALSE(gather.ok());
  CHECK(gather.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(contains(gather.status(), "all_gather #2 was given 3 per-rank counts for 2 ranks"));
  auto scatter =
      c.reduce_scatter(buffer.data(), buffer.data(), std::span<const uint64_t>(three_counts),
                       DataType::kFloat32, ReduceOp::kSum);
  REQUIRE_FALSE(scatter.ok());
  CHECK(contains(scatter.status(), "reduce_scatter #2 was given 3 per-rank counts"));
  auto root = c.broadcast(buffer.data(), 8, DataType::kFloat32, 2);
  REQUIRE_FALSE(root.ok());
  CHECK(contains(root.status(), "broadcast #2 has root 2: use a rank from 0 to 1"));
  Stream* const some_stream = reinterpret_cast<Stream*>(&buffer);  // never dereferenced
  auto stream = c.all_reduce(buffer.data(), buffer.data(), 8, DataType::kFloat32, ReduceOp::kSum,
                             {.stream = some_stream});
  REQUIRE_FALSE(stream.ok());
  CHECK(contains(stream.status(), "no streams here"));  // the backend's own check

  // None reached the transport, the counters or the monitor: the next call is #2.
  CHECK(c.started() == std::vector<uint64_t>{1});
  const CommStats after = c.stats();
  for (size_t k = 0; k < after.by_kind.size(); ++k) {
    CHECK(after.by_kind[k].calls == before.by_kind[k].calls);
    CHECK(after.by_kind[k].bytes == before.by_kind[k].bytes);
  }
  auto next = c.all_reduce(buffer.data(), buffer.data(), 8, DataType::kFloat32, ReduceOp::kSum);
  REQUIRE(next.ok());
  CHECK((*next)->sequence() == 2);
  CHECK(c.started() == std::vector<uint64_t>{1, 2});
  CHECK(c.aborts() == 0);
  CHECK(c.broken().empty());
}

TEST_CASE("Communicator base: statistics, description and the equal-shard forms", "[comm][base]") {
  Job job(2);
  RecordingCommunicator& c = job[1];
  std::vector<float> buffer(64);
  REQUIRE(c.all_gather(buffer.data(), buffer.data(), 8, DataType::kFloat32).ok());
  REQUIRE(
      c.reduce_scatter(buffer.data(), buffer.data(), 8, DataType::kFloat32, ReduceOp::kSum).ok());
  REQUIRE(c.all_reduce(buffer.data(), buffer.data(), 10, DataType::kFloat64, ReduceOp::kMax).ok());
  REQUIRE(c.broadcast(buffer.data(), 12, DataType::kUInt8, 1).ok());
  REQUIRE(c.barrier().ok());
  const CommStats s = c.stats();
  CHECK(s[CollectiveKind::kAllGather].calls == 1);
  CHECK(s[CollectiveKind::kAllGather].bytes == 2 * 8 * 4);
  CHECK(s[CollectiveKind::kAllGather].wire_bytes == 2 * 8 * 4 / 2);
  CHECK(s[CollectiveKind::kReduceScatter].bytes == 2 * 8 * 4);
  CHECK(s[CollectiveKind::kAllReduce].bytes == 80);
  CHECK(s[CollectiveKind::kAllReduce].wire_bytes == 80);  // 2 (n-1)/n at two ranks
  CHECK(s[CollectiveKind::kBroadcast].wire_bytes == 12);  // this rank is the root
  CHECK(s[CollectiveKind::kBarrier].calls == 1);
  CHECK(c.started() == std::vector<uint64_t>{1, 2, 3, 4, 5});
  const std::string text = c.description();
  CHECK(text.rfind("recording, rank 1 of 2, rendezvous at 127.0.0.1:", 0) == 0);
  CHECK(text.find("timeout 20 s") != std::string::npos);
  CHECK(text.find("signatures checked") == std::string::npos);
}

TEST_CASE("Communicator base: a transport failure aborts once and is every later call's answer",
          "[comm][base]") {
  auto c = alone();
  std::vector<float> buffer(8);
  c->fail_at(2, "the wire was cut");
  REQUIRE(c->barrier().ok());
  auto failed = c->all_reduce(buffer.data(), buffer.data(), 8, DataType::kFloat32, ReduceOp::kSum);
  REQUIRE_FALSE(failed.ok());
  // The monitor's post-mortem names the operation, its number and this rank.
  CHECK(
      contains(failed.status(),
               "all_reduce #2 (float32 sum, 8 elements) failed on rank 0 of 1: the wire was cut"));
  CHECK(c->aborts() == 1);
  REQUIRE(c->broken().size() == 1);
  CHECK(c->broken()[0] == failed.status());
  // Broken: the same error, before any number, check or transport call.
  const std::vector<uint64_t> bad_counts = {1, 2, 3};
  for (int i = 0; i < 3; ++i) {
    auto later = i == 0   ? c->barrier()
                 : i == 1 ? c->all_gather(buffer.data(), buffer.data(),
                                          std::span<const uint64_t>(bad_counts), DataType::kFloat32)
                          : c->broadcast(buffer.data(), 8, DataType::kFloat32, 0);
    REQUIRE_FALSE(later.ok());
    CHECK(later.status() == failed.status());
  }
  CHECK(c->started() == std::vector<uint64_t>{1, 2});
  CHECK(c->stats()[CollectiveKind::kBarrier].calls == 1);
  CHECK(c->aborts() == 1);
  CHECK(c->broken().size() == 1);
}

TEST_CASE("Communicator base: the post-mortem names what the other rank had issued",
          "[comm][base]") {
  Job job(3);
  // Ranks 0 and 2 issue #1 to #3, rank 1 only #1 and #2; rank 0 fails in #3. The other ranks'
  // monitors post what the base told them they had issued.
  std::vector<int32_t> data(4);
  for (int r : {0, 1, 2}) {
    REQUIRE(job[r].barrier().ok());
    REQUIRE(job[r].broadcast(data.data(), 4, DataType::kInt32, 0).ok());
  }
  REQUIRE(job[2].barrier().ok());
  job[0].fail_at(3, "peer gone quiet");
  auto failed = job[0].barrier();
  REQUIRE_FALSE(failed.ok());
  INFO(failed.status().message());
  CHECK(contains(failed.status(), "barrier #3 failed on rank 0 of 3: peer gone quiet"));
  CHECK(contains(failed.status(), "2 of 3 ranks were at barrier #3"));
  CHECK(contains(failed.status(),
                 "Rank 1 had issued only up to broadcast #2 (int32, 4 elements, root 0) (it "
                 "never issued #3)"));
  CHECK(contains(failed.status(), "Rank(s) at fault: 1."));
  CHECK(job[0].aborts() == 1);
  CHECK(job[1].aborts() == 0);  // the others learn on their next call to their engines
}

TEST_CASE("Communicator base: signatures that differ break every rank with the verdict",
          "[comm][base]") {
  Job job(2, /*debug=*/true);
  CHECK(job[0].description().find("signatures checked") != std::string::npos);
  std::vector<float> buffer(16);
  REQUIRE(
      job[0].all_reduce(buffer.data(), buffer.data(), 16, DataType::kFloat32, ReduceOp::kSum).ok());
  CHECK(job[0].exchanges() == 1);
  // Rank 1 "issued" a broadcast where this rank issued an all-reduce.
  CollectiveCall theirs = CollectiveCall::of(CollectiveKind::kBroadcast, DataType::kFloat32);
  theirs.root = 1;
  theirs.counts = {16};
  job[0].peers_send(theirs);
  auto mismatch =
      job[0].all_reduce(buffer.data(), buffer.data(), 16, DataType::kFloat32, ReduceOp::kSum);
  REQUIRE_FALSE(mismatch.ok());
  INFO(mismatch.status().message());
  CHECK(mismatch.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(mismatch.status(),
                 "all_reduce #2 (float32 sum, 16 elements) on rank 0: "
                 "ranks issued different collectives"));
  CHECK(contains(mismatch.status(), "issued broadcast #2 (float32, 16 elements, root 1)"));
  // Every rank reached the same verdict from the same table: no post-mortem.
  CHECK_FALSE(contains(mismatch.status(), "failed on rank"));
  CHECK(job[0].aborts() == 1);
  auto later = job[0].barrier();
  REQUIRE_FALSE(later.ok());
  CHECK(later.status() == mismatch.status());

  // An exchange that fails in the engine is a failure of that call, with a post-mortem.
  job[1].exchange_fails("connection reset");
  auto failed = job[1].barrier();
  REQUIRE_FALSE(failed.ok());
  CHECK(contains(failed.status(),
                 "barrier #1 failed on rank 1 of 2: the signature check: connection reset"));
  CHECK(job[1].aborts() == 1);
}

// Several threads issue at once, some with bad arguments; one call fails in the transport. Every
// accepted call gets a distinct number, the transport sees them in order, and every call after
// the failure returns the one verdict.
TEST_CASE("Communicator base: concurrent issuers, a failure among them", "[comm][base]") {
  auto c = alone();
  constexpr int kThreads = 4;
  constexpr int kCalls = 300;
  constexpr uint64_t kFailAt = 500;
  c->fail_at(kFailAt, "the engine broke");
  std::vector<std::vector<uint64_t>> got(kThreads);
  std::vector<std::vector<absl::Status>> errors(kThreads);
  std::vector<int> wrongly_rejected(kThreads, 0);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<float> buffer(4);
        for (int i = 0; i < kCalls; ++i) {
          const int root = i % 7 == 0 ? 1 : 0;  // root 1 of 1 rank: rejected
          auto work = c->broadcast(buffer.data(), 4, DataType::kFloat32, root);
          if (work.ok()) {
            got[t].push_back((*work)->sequence());
          } else if (work.status().code() != absl::StatusCode::kInvalidArgument) {
            errors[t].push_back(work.status());
          } else if (root != 1) {
            ++wrongly_rejected[t];  // checked after the threads (Catch2 is not thread-safe)
          }
        }
      });
    }
  }
  CHECK(wrongly_rejected == std::vector<int>(kThreads, 0));
  std::vector<uint64_t> all;
  for (const auto& g : got) all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  REQUIRE(all.size() == kFailAt - 1);  // #1 .. #499 each once; #500 failed
  for (size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == i + 1);
  std::vector<uint64_t> started = c->started();
  REQUIRE(started.size() == kFailAt);
  for (size_t i = 0; i < started.size(); ++i) REQUIRE(started[i] == i + 1);
  REQUIRE(c->broken().size() == 1);
  const absl::Status verdict = c->broken()[0];
  CHECK(contains(verdict, "broadcast #500"));
  size_t failures = 0;
  for (const auto& e : errors) {
    for (const absl::Status& s : e) {
      CHECK(s == verdict);
      ++failures;
    }
  }
  CHECK(failures >= 1);
  CHECK(c->aborts() == 1);
  CHECK(c->stats()[CollectiveKind::kBroadcast].calls == kFailAt);
}

}  // namespace
}  // namespace strata
