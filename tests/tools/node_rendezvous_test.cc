// strata-run's nodes' rendezvous (tools/run/node_rendezvous.h) on loopback: each node's launcher
// is a thread here. A --node-rank claimed twice is an error at once; when the job already runs,
// the error says that a node cannot rejoin it (a node restarted after a crash) and what to do.
#include "run/node_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <string>
#include <vector>

namespace strata::run {
namespace {

// A TCP port of the loopback interface that was free a moment ago.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
  ::close(fd);
  REQUIRE(ok);
  return ntohs(addr.sin_port);
}

NodeOptions node(int port, int nnodes, int node_rank) {
  return {.nnodes = nnodes,
          .node_rank = node_rank,
          .nproc = 2,
          .master_addr = "127.0.0.1",
          .port = port,
          .timeout = std::chrono::seconds(20)};  // bounds every wait (a hang fails the test)
}

std::future<absl::StatusOr<NodeAgreement>> join_async(const NodeOptions& o) {
  return std::async(std::launch::async, [o] { return agree_with_nodes(o); });
}

std::string message(const absl::StatusOr<NodeAgreement>& result) {
  return std::string(result.status().message());
}

TEST_CASE("a node restarted into a running job is told it cannot rejoin", "[run][nodes]") {
  const int port = free_port();
  auto node0 = join_async(node(port, 2, 0));
  absl::StatusOr<NodeAgreement> node1 = agree_with_nodes(node(port, 2, 1));
  absl::StatusOr<NodeAgreement> agreed0 = node0.get();
  INFO(agreed0.status().ToString() << " / " << node1.status().ToString());
  REQUIRE(agreed0.ok());
  REQUIRE(node1.ok());
  REQUIRE(agreed0->server != nullptr);  // node 0 serves the rendezvous while its job runs

  // Node 1's launcher died (a crash, a reboot) and is started again with the same rank.
  absl::StatusOr<NodeAgreement> again = agree_with_nodes(node(port, 2, 1));
  INFO(again.status().ToString());
  REQUIRE(again.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string m = message(again);
  CHECK_THAT(m, Catch::StartsWith(
                    "node 1 of 2: the job whose nodes met at 127.0.0.1:" + std::to_string(port) +
                    " is already running with node 1 (which joined from 127.0.0.1): a node "
                    "cannot rejoin a running job (strata has no elastic restart)"));
  CHECK_THAT(m, Catch::Contains("restart every node's strata-run, loading the last checkpoint "
                                "(resharding allows fewer nodes)"));
  CHECK_THAT(m, !Catch::Contains("give each machine its own --node-rank"));
}

TEST_CASE("two launchers claiming one node rank at start-up: the second is told at once",
          "[run][nodes]") {
  const int port = free_port();
  auto node0 = join_async(node(port, 3, 0));
  auto first = join_async(node(port, 3, 1));
  auto second = join_async(node(port, 3, 1));
  // The one that claimed node 1 second returns at once; the other waits for node 2 (so the job
  // cannot be running yet when the second claims).
  std::future<absl::StatusOr<NodeAgreement>>* told = nullptr;
  std::future<absl::StatusOr<NodeAgreement>>* waiting = nullptr;
  for (int i = 0; i < 2000 && told == nullptr; ++i) {
    if (first.wait_for(std::chrono::milliseconds(5)) == std::future_status::ready) {
      told = &first;
      waiting = &second;
    } else if (second.wait_for(std::chrono::milliseconds(5)) == std::future_status::ready) {
      told = &second;
      waiting = &first;
    }
  }
  REQUIRE(told != nullptr);
  absl::StatusOr<NodeAgreement> duplicate = told->get();
  INFO(duplicate.status().ToString());
  REQUIRE(duplicate.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(message(duplicate) ==
        "node 1 of 3: another strata-run already joined the nodes' rendezvous at 127.0.0.1:" +
            std::to_string(port) +
            " as --node-rank=1 (from 127.0.0.1): give each machine its own --node-rank, from 0 "
            "to 2");

  // Node 2 comes: the job of nodes 0, 1 (the first claim) and 2 agrees.
  absl::StatusOr<NodeAgreement> node2 = agree_with_nodes(node(port, 3, 2));
  absl::StatusOr<NodeAgreement> agreed0 = node0.get();
  absl::StatusOr<NodeAgreement> node1 = waiting->get();
  INFO(agreed0.status().ToString()
       << " / " << node1.status().ToString() << " / " << node2.status().ToString());
  CHECK(agreed0.ok());
  CHECK(node1.ok());
  CHECK(node2.ok());
}

}  // namespace
}  // namespace strata::run
