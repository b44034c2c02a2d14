// A timed-out Gloo send or receive is pinned on the peer it waited on: the peers of each of
// Gloo's algorithms as strata calls them (comm/gloo_peers), and the post-mortem that follows the
// waits to the rank (and host) at fault when every rank answered and none issued another call.
// Host-only: ranks are JobMonitors on threads of this process over one rendezvous on loopback;
// the other "machine" is a host key the test overwrites.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_peers.h"
#include "comm/job_monitor.h"
#include "comm/rank_processes.h"

namespace strata {
namespace {

using comm_internal::CollectiveCall;
using comm_internal::gloo_peers;
using comm_internal::gloo_transport_wait;
using comm_internal::JobMonitor;
using comm_internal::TransportDirection;
using namespace std::chrono_literals;

constexpr TransportDirection kSend = TransportDirection::kSend;
constexpr TransportDirection kRecv = TransportDirection::kRecv;

CollectiveCall call_of(CollectiveKind kind, uint64_t sequence, int world, int root = -1) {
  CollectiveCall call = CollectiveCall::of(kind, DataType::kFloat32);
  call.sequence = sequence;
  call.root = root;
  const bool per_rank =
      kind == CollectiveKind::kAllGather || kind == CollectiveKind::kReduceScatter;
  call.counts.assign(per_rank ? world : 1, 64);
  return call;
}

TEST_CASE("Gloo's peers: rings, halving-doubling, the broadcast tree, the barrier",
          "[comm][blame]") {
  using V = std::vector<int>;
  // all-gather: a ring sending to rank + 1; all-reduce: a ring sending to rank - 1.
  CHECK(gloo_peers(call_of(CollectiveKind::kAllGather, 1, 4), 4, 1, kSend) == V{2});
  CHECK(gloo_peers(call_of(CollectiveKind::kAllGather, 1, 4), 4, 0, kRecv) == V{3});
  CHECK(gloo_peers(call_of(CollectiveKind::kAllReduce, 1, 4), 4, 0, kSend) == V{3});
  CHECK(gloo_peers(call_of(CollectiveKind::kAllReduce, 1, 4), 4, 0, kRecv) == V{1});
  // reduce-scatter: halving-doubling on a power of two (any other rank), else the all-reduce ring.
  CHECK(gloo_peers(call_of(CollectiveKind::kReduceScatter, 1, 4), 4, 1, kRecv) == V{0, 2, 3});
  CHECK(gloo_peers(call_of(CollectiveKind::kReduceScatter, 1, 3), 3, 1, kSend) == V{0});
  CHECK(gloo_peers(call_of(CollectiveKind::kReduceScatter, 1, 3), 3, 1, kRecv) == V{2});
  // broadcast from root 1 over 4 ranks: 1 → 2 (step 0), then 1 → 3 and 2 → 0 (step 1).
  const CollectiveCall broadcast = call_of(CollectiveKind::kBroadcast, 1, 4, 1);
  CHECK(gloo_peers(broadcast, 4, 1, kSend) == V{2, 3});
  CHECK(gloo_peers(broadcast, 4, 1, kRecv).empty());
  CHECK(gloo_peers(broadcast, 4, 2, kSend) == V{0});
  CHECK(gloo_peers(broadcast, 4, 2, kRecv) == V{1});
  CHECK(gloo_peers(broadcast, 4, 0, kRecv) == V{2});
  CHECK(gloo_peers(call_of(CollectiveKind::kBroadcast, 1, 3, 0), 3, 2, kRecv) == V{0});
  // barrier (dissemination): rank ± 1, 2, 4, ...
  CHECK(gloo_peers(call_of(CollectiveKind::kBarrier, 1, 5), 5, 0, kSend) == V{1, 2, 4});
  CHECK(gloo_peers(call_of(CollectiveKind::kBarrier, 1, 5), 5, 0, kRecv) == V{1, 3, 4});
  CHECK(gloo_peers(call_of(CollectiveKind::kAllGather, 1, 1), 1, 0, kSend).empty());
}

TEST_CASE("Gloo's words: which operation timed out, and the peer's host when named",
          "[comm][blame]") {
  const CollectiveCall gather = call_of(CollectiveKind::kAllGather, 7, 4);
  auto send = gloo_transport_wait(
      gather, 4, 1,
      "[../gloo/transport/tcp/unbound_buffer.cc:136] Timed out waiting 4000ms for send operation "
      "to complete");
  REQUIRE(send.has_value());
  CHECK(send->direction == kSend);
  CHECK(send->address.empty());
  CHECK(send->peers == std::vector<int>{2});
  auto recv =
      gloo_transport_wait(gather, 4, 1, "Timed out waiting 4000ms for recv operation to complete");
  REQUIRE(recv.has_value());
  CHECK(recv->direction == kRecv);
  CHECK(recv->peers == std::vector<int>{0});
  auto read = gloo_transport_wait(call_of(CollectiveKind::kReduceScatter, 7, 4), 4, 1,
                                  "[./gloo/transport/tcp/buffer.cc:73] Read timeout "
                                  "[10.77.0.2]:58053");
  REQUIRE(read.has_value());
  CHECK(read->direction == kRecv);
  CHECK(read->address == "10.77.0.2");
  CHECK(read->peers == std::vector<int>{0, 2, 3});
  auto write = gloo_transport_wait(call_of(CollectiveKind::kReduceScatter, 7, 4), 4, 1,
                                   "Write timeout [::1]:4000");
  REQUIRE(write.has_value());
  CHECK(write->direction == kSend);
  CHECK(write->address == "::1");
  // The signature check is Gloo's ring all-gather whatever the call.
  auto check = gloo_transport_wait(call_of(CollectiveKind::kAllReduce, 7, 4), 4, 1,
                                   "the signature check: Timed out waiting 4000ms for send "
                                   "operation to complete");
  REQUIRE(check.has_value());
  CHECK(check->peers == std::vector<int>{2});
  // Not a timed-out transport operation.
  CHECK_FALSE(
      gloo_transport_wait(gather, 4, 1, "Connection closed by peer [10.77.0.2]:1").has_value());
  CHECK_FALSE(gloo_transport_wait(gather, 4, 1, "NCCL error: unhandled system error").has_value());
}

// Four ranks' monitors; ranks 2 and 3 are said to run on 10.77.0.2 (their host keys).
struct Job {
  std::vector<std::unique_ptr<JobMonitor>> ranks;
  Job() {
    const uint16_t port = testing::free_port();
    CommSettings settings;
    settings.timeout = 10s;  // bounds rank 0's wait for the others to leave
    std::vector<absl::StatusOr<std::unique_ptr<JobMonitor>>> joined;
    for (int r = 0; r < 4; ++r) joined.emplace_back(absl::UnknownError("not run"));
    {
      std::vector<std::jthread> joining;
      for (int r = 0; r < 4; ++r) {
        joining.emplace_back([&, r] {
          LaunchInfo launch;
          launch.rank = r;
          launch.world_size = 4;
          launch.master_port = port;
          launch.launched = true;
          joined[r] = JobMonitor::join(launch, settings);
        });
      }
    }
    for (int r = 0; r < 4; ++r) {
      INFO(joined[r].status().ToString());
      REQUIRE(joined[r].ok());
      ranks.push_back(*std::move(joined[r]));
    }
    for (int r : {2, 3})
      REQUIRE(ranks[0]->store().set("strata/host/" + std::to_string(r), "10.77.0.2").ok());
  }
  ~Job() {
    while (!ranks.empty()) ranks.pop_back();  // rank 0 last: it serves the rendezvous
  }
  void issued(const CollectiveCall& call) {
    for (auto& rank : ranks) rank->issued(call);
  }
};

std::string text(const absl::Status& status) { return std::string(status.message()); }

TEST_CASE(
    "A send that timed out is pinned on the rank sent to, with its host, not on a rank "
    "that had gone on",
    "[comm][blame]") {
  // The slow link of multinode.fault_slow: every rank answered, rank 0 had already issued the
  // next collective (they run asynchronously), and rank 1's send to rank 2 timed out.
  Job job;
  const CollectiveCall gather = call_of(CollectiveKind::kAllGather, 5, 4);
  job.issued(gather);
  job.ranks[0]->issued(call_of(CollectiveKind::kAllGather, 6, 4));
  const std::string message = text(job.ranks[1]->post_mortem(
      gather,
      "[../gloo/transport/tcp/unbound_buffer.cc:136] Timed out waiting 4000ms for send operation "
      "to complete"));
  INFO(message);
  CHECK_THAT(message, Catch::Contains("Rank 1 (this rank) timed out sending to rank(s) 2 (on "
                                      "10.77.0.2)"));
  CHECK_THAT(message, Catch::Contains("Rank 0 had gone on to all_gather #6"));
  CHECK_THAT(message, Catch::EndsWith("Rank(s) at fault: 2."));
}

TEST_CASE("A read that timed out on a named host is pinned on that host's ranks", "[comm][blame]") {
  // Gloo's halving-doubling reduce-scatter names the peer's address: of every other rank, the
  // ones on that host are the suspects.
  Job job;
  const CollectiveCall scatter = call_of(CollectiveKind::kReduceScatter, 5, 4);
  job.issued(scatter);
  const std::string message = text(job.ranks[1]->post_mortem(
      scatter, "[./gloo/transport/tcp/buffer.cc:73] Read timeout [10.77.0.2]:58053"));
  INFO(message);
  CHECK_THAT(message, Catch::Contains("receiving from rank(s) 2, 3 (on 10.77.0.2)"));
  CHECK_THAT(message, Catch::EndsWith("Rank(s) at fault: 2, 3."));
}

TEST_CASE("A receive that timed out on a rank that itself waited: the blame follows the chain",
          "[comm][blame]") {
  // All-reduce ring: rank 0 receives from rank 1, rank 1 from rank 2 (across the slow link).
  // Rank 1 timed out first, waiting on rank 2; rank 0 then timed out waiting on rank 1.
  Job job;
  const CollectiveCall reduce = call_of(CollectiveKind::kAllReduce, 5, 4);
  job.issued(reduce);
  const std::string recv_timeout = "Timed out waiting 4000ms for recv operation to complete";
  std::string first;
  std::jthread rank1([&] { first = text(job.ranks[1]->post_mortem(reduce, recv_timeout)); });
  // Rank 0 fails once rank 1 has said on whom it waits.
  for (int i = 0; i < 5000; ++i) {
    auto posted = job.ranks[0]->store().check({"strata/waiting/1"});
    if (posted.ok() && *posted) break;
    std::this_thread::sleep_for(1ms);
  }
  const std::string message = text(job.ranks[0]->post_mortem(reduce, recv_timeout));
  rank1.join();
  INFO(message);
  INFO(first);
  CHECK_THAT(message, Catch::Contains("Rank 0 (this rank) timed out receiving from rank(s) 1:"));
  CHECK_THAT(message, Catch::Contains("Rank 1 had timed out itself, waiting on rank(s) 2."));
  CHECK_THAT(message, Catch::Contains("The waits lead to rank(s) 2 (on 10.77.0.2)."));
  CHECK_THAT(message, Catch::EndsWith("Rank(s) at fault: 2."));
  CHECK_THAT(first, Catch::EndsWith("Rank(s) at fault: 2."));
}

TEST_CASE("A connection closed by a rank that timed out: the blame follows that rank's wait",
          "[comm][blame]") {
  // Rank 0 (this host) timed out receiving from rank 3 (all-gather ring) and closed its pairs;
  // rank 1 then sees its connection to rank 0 closed, while rank 0 is alive and answers.
  Job job;
  const CollectiveCall gather = call_of(CollectiveKind::kAllGather, 5, 4);
  job.issued(gather);
  std::string first;
  std::jthread rank0([&] {
    first = text(job.ranks[0]->post_mortem(
        gather, "Timed out waiting 4000ms for recv operation to complete"));
  });
  const std::string message = text(job.ranks[1]->post_mortem(
      gather, "[./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:59072"));
  rank0.join();
  INFO(message);
  INFO(first);
  CHECK_THAT(message, Catch::Contains("Rank(s) 0 closed their connections to this rank after "
                                      "timing out themselves."));
  CHECK_THAT(message, Catch::Contains("The waits lead to rank(s) 3 (on 10.77.0.2)."));
  CHECK_THAT(message, Catch::EndsWith("Rank(s) at fault: 3."));
  CHECK_THAT(first, Catch::EndsWith("Rank(s) at fault: 3."));
}

TEST_CASE("Two ranks that timed out waiting on each other across hosts: the other host is named",
          "[comm][blame]") {
  // All-gather ring over a slow link: rank 1's send to rank 2 timed out, and rank 2's receive
  // from rank 1. Each side names the other's ranks; on one host alone such a cycle says nothing
  // (the ranks out of step are named as before: comm_failure_test's size mismatch).
  Job job;
  const CollectiveCall gather = call_of(CollectiveKind::kAllGather, 5, 4);
  job.issued(gather);
  std::string rank2_says;
  std::jthread rank2([&] {
    rank2_says = text(job.ranks[2]->post_mortem(
        gather, "Timed out waiting 4000ms for recv operation to complete"));
  });
  for (int i = 0; i < 5000; ++i) {
    auto posted = job.ranks[1]->store().check({"strata/waiting/2"});
    if (posted.ok() && *posted) break;
    std::this_thread::sleep_for(1ms);
  }
  const std::string message = text(
      job.ranks[1]->post_mortem(gather, "Timed out waiting 4000ms for send operation to complete"));
  rank2.join();
  INFO(message);
  INFO(rank2_says);
  CHECK_THAT(message, Catch::Contains("Rank 2 had timed out itself, waiting on rank(s) 1."));
  CHECK_THAT(message, Catch::EndsWith("Rank(s) at fault: 2."));
  CHECK_THAT(rank2_says, Catch::Contains("receiving from rank(s) 1 (on 127.0.0.1)"));
  CHECK_THAT(rank2_says, Catch::EndsWith("Rank(s) at fault: 1."));
}

TEST_CASE("Both ends of a slow link time out on each other's host: each names the other host",
          "[comm][blame]") {
  // Halving-doubling reduce-scatter over a slow link: rank 1 read from 10.77.0.2 (ranks 2, 3)
  // and timed out; rank 2 read from this host (ranks 0, 1) and timed out too. Rank 2's wait
  // includes rank 1: the two wait on each other, and rank 0 (healthy, on rank 1's host) is not
  // at fault for being a candidate of rank 2's.
  Job job;
  const CollectiveCall scatter = call_of(CollectiveKind::kReduceScatter, 5, 4);
  job.issued(scatter);
  std::string rank2_says;
  std::jthread rank2([&] {
    rank2_says = text(job.ranks[2]->post_mortem(
        scatter, "[./gloo/transport/tcp/buffer.cc:73] Read timeout [127.0.0.1]:4740"));
  });
  for (int i = 0; i < 5000; ++i) {
    auto posted = job.ranks[1]->store().check({"strata/waiting/2"});
    if (posted.ok() && *posted) break;
    std::this_thread::sleep_for(1ms);
  }
  const std::string message = text(job.ranks[1]->post_mortem(
      scatter, "[./gloo/transport/tcp/buffer.cc:73] Read timeout [10.77.0.2]:58053"));
  rank2.join();
  INFO(message);
  INFO(rank2_says);
  CHECK_THAT(message, Catch::Contains("Rank 2 had timed out itself, waiting on rank(s) 0, 1."));
  CHECK_THAT(message, Catch::EndsWith("Rank(s) at fault: 2, 3."));
  CHECK_THAT(rank2_says, Catch::EndsWith("Rank(s) at fault: 0, 1."));
}

}  // namespace
}  // namespace strata
