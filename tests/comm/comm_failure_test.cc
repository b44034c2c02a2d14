// Failure is an error, never a hang: a rank killed mid-collective, ranks that issue different
// collectives, a rank that stops issuing them, a rank that never arrives, a port in use. Each
// job runs as real processes (comm_fault_rank) over loopback; every test bounds its own time
// and leaves no process behind (RankProcesses).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "comm/rank_processes.h"

namespace strata {
namespace {

using testing::RankOutcome;
using testing::RankProcesses;
using namespace std::chrono_literals;

std::vector<RankOutcome> run_job(const std::string& scenario, int faulty, int world,
                                 std::vector<int> ranks, const std::string& timeout,
                                 bool debug = false, uint16_t port = 0) {
  // A rank that stops issuing collectives sleeps until the test ends it, once the others are done.
  const std::vector<int> stuck =
      scenario == "fewer" || scenario == "freeze" ? std::vector<int>{faulty} : std::vector<int>{};
  if (ranks.empty()) {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
  }
  RankProcesses job({STRATA_COMM_FAULT_RANK, scenario, std::to_string(faulty)}, world, ranks,
                    port != 0 ? port : testing::free_port(),
                    {{"STRATA_COMM_TIMEOUT", timeout},
                     {"STRATA_COMM_DEBUG", debug ? "on" : "off"},
                     {"STRATA_COMM_BACKEND", "gloo"}});
  // Far above the communication timeout: ranks that keep to it end long before.
  return job.wait(60s, stuck);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("A healthy job of three ranks finishes", "[comm][failure]") {
  for (const RankOutcome& r : run_job("ok", -1, 3, {}, "20s")) {
    INFO(r.output);
    CHECK(r.exited);
    CHECK(r.status == 0);
    CHECK(contains(r.output, "ok"));
  }
}

TEST_CASE("A rank killed mid-collective: every other rank fails naming it", "[comm][failure]") {
  for (const RankOutcome& r : run_job("die", 1, 3, {}, "30s")) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    if (r.rank == 1) {
      CHECK_FALSE(r.exited);  // SIGKILL
      continue;
    }
    CHECK(r.exited);
    CHECK(r.status == 1);
    // Killed while its #4 was in flight: the others fail in #4, or in #5 when rank 1's part of
    // #4 was done before the kill landed.
    CHECK((contains(r.output, "all_reduce #4") || contains(r.output, "all_reduce #5")));
    CHECK(contains(r.output, "Rank 1 exited or was killed"));
    CHECK(contains(r.output, "Rank(s) at fault: 1."));
  }
}

TEST_CASE("Ranks that issue a different collective: a timeout that names the odd rank",
          "[comm][failure]") {
  for (const RankOutcome& r : run_job("other-op", 2, 3, {}, "2s")) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    CHECK(r.exited);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "#4"));
    CHECK(contains(r.output, "Rank 2"));
    CHECK(contains(r.output, "issued broadcast #4"));
    CHECK(contains(r.output, "Rank(s) at fault: 2."));
  }
}

TEST_CASE("STRATA_COMM_DEBUG catches a size mismatch before it runs, on every rank",
          "[comm][failure]") {
  for (const RankOutcome& r : run_job("other-size", 0, 3, {}, "30s", /*debug=*/true)) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    CHECK(r.exited);
    CHECK(r.status == 1);
    CHECK(contains(r.output,
                   "ranks issued different collectives: 2 of 3 ranks issued "
                   "all_reduce #4 (float32 average, 4194304 elements)"));
    CHECK(contains(r.output, "issued all_reduce #4 (float32 sum, 2097152 elements)"));
    CHECK(contains(r.output, "Rank(s) at fault: 0"));
  }
}

TEST_CASE("A size mismatch without the debug check is still an error naming the rank",
          "[comm][failure]") {
  for (const RankOutcome& r : run_job("other-size", 1, 2, {}, "2s")) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    CHECK(r.exited);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "#4"));
    // Two ranks, two different calls: neither is a majority, so both are named.
    CHECK(contains(r.output, "Rank(s) at fault: 0, 1."));
  }
}

TEST_CASE("A rank that stops issuing collectives: the others time out naming it",
          "[comm][failure]") {
  for (const RankOutcome& r : run_job("fewer", 2, 3, {}, "2s")) {
    INFO("rank " << r.rank << ": " << r.output);
    if (r.rank == 2) {
      CHECK(r.killed_by_test);  // asleep outside strata until the test ends it
      continue;
    }
    CHECK(r.exited);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "all_reduce #4"));
    CHECK(contains(r.output, "Rank 2 had issued only up to all_reduce #3"));
    CHECK(contains(r.output, "Rank(s) at fault: 2."));
  }
}

TEST_CASE("A rank that does not answer at all: the others time out naming it at fault",
          "[comm][failure]") {
  // Stopped whole (its watcher too), like the ranks of a machine whose link went down: its
  // sockets stay open, nothing comes. It is the cause, not the ranks that did answer.
  for (const RankOutcome& r : run_job("freeze", 2, 3, {}, "2s")) {
    INFO("rank " << r.rank << ": " << r.output);
    if (r.rank == 2) {
      CHECK(r.killed_by_test);
      continue;
    }
    CHECK(r.exited);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "all_reduce #4"));
    CHECK(contains(r.output, "Rank(s) 2 did not answer"));
    CHECK(contains(r.output, "Rank(s) at fault: 2."));
    CHECK_FALSE(contains(r.output, "(on "));  // one host: no address to name
  }
}

TEST_CASE("A split that one rank does not call: a timeout naming it, not a hang",
          "[comm][failure][split]") {
  for (const RankOutcome& r : run_job("split-fewer", 2, 4, {}, "2s")) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    CHECK(r.exited);
    if (r.rank == 2) {
      CHECK(r.status == 0);  // it called split #1 only, and left
      continue;
    }
    CHECK(r.status == 1);
    CHECK(contains(r.output, "Communicator::split #2 (color 0, key " + std::to_string(r.rank) +
                                 ") on rank " + std::to_string(r.rank) + " of 4"));
    CHECK(contains(r.output, "rank(s) 2 did not call split #2 within STRATA_COMM_TIMEOUT"));
  }
}

TEST_CASE("A rank killed inside its split group's collective: its group fails naming it",
          "[comm][failure][split]") {
  // Groups {0, 1} and {2, 3}; rank 3 (rank 1 of its group) dies. The other group finishes.
  for (const RankOutcome& r : run_job("split-die", 3, 4, {}, "10s")) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    if (r.rank == 3) {
      CHECK_FALSE(r.exited);
      continue;
    }
    CHECK(r.exited);
    if (r.rank < 2) {
      CHECK(r.status == 0);
      continue;
    }
    CHECK(r.status == 1);
    CHECK((contains(r.output, "all_reduce #2") || contains(r.output, "all_reduce #3")));
    CHECK(contains(r.output, "Rank 1 exited or was killed"));
    CHECK(contains(r.output,
                   "[split #1 color 1 of a communicator of 4 ranks: its ranks 0..1 are "
                   "that one's ranks 2, 3]"));
  }
}

TEST_CASE("A rank that never arrives: the rendezvous times out naming it", "[comm][failure]") {
  for (const RankOutcome& r : run_job("ok", -1, 3, {0, 1}, "1s")) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    CHECK(r.exited);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "never connected"));
    CHECK(contains(r.output, "2"));
  }
}

TEST_CASE("MASTER_PORT in use: rank 0 says so", "[comm][failure]") {
  const int holder = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  REQUIRE(bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(holder, 4) == 0);
  REQUIRE(getsockname(holder, reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  const uint16_t port = ntohs(addr.sin_port);
  const std::vector<RankOutcome> outcomes = run_job("ok", -1, 2, {}, "1s", false, port);
  close(holder);
  for (const RankOutcome& r : outcomes) {
    INFO("rank " << r.rank << ": " << r.output);
    CHECK_FALSE(r.killed_by_test);
    CHECK(r.exited);
    CHECK(r.status == 1);
    if (r.rank == 0)
      CHECK(contains(r.output, "MASTER_PORT=" + std::to_string(port) + " is in use"));
  }
}

}  // namespace
}  // namespace strata
