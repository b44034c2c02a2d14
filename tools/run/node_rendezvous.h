// strata-run across machines: before any rank starts, the launchers of a job's nodes meet at
// --master-addr:--port (the rendezvous store, served by node 0's launcher) and agree on what the
// ranks need — that every node starts the same number of ranks, and the port on which rank 0
// serves the ranks' own rendezvous (docs/strata-run.md, "Several machines").
//
// Why two stores: the ranks' store is served by rank 0 for the ranks alone (comm/job_monitor),
// and it counts connections as ranks; the launchers are nodes, not ranks. Node 0 picks a free
// port of --master-addr for the ranks and hands it to every node through the launchers' store.
#pragma once

#include <absl/status/statusor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace strata {
class TcpStoreServer;
}

namespace strata::run {

struct NodeOptions {
  int nnodes = 1;
  int node_rank = 0;
  int nproc = 0;            // this node's ranks (-n)
  std::string master_addr;  // node 0's address
  int port = 0;             // the launchers' rendezvous port on master_addr
  std::chrono::milliseconds timeout{};
};

struct NodeAgreement {
  int ranks_port = 0;                  // MASTER_PORT for every rank of the job
  std::vector<std::string> addresses;  // each node's address, as it reaches node 0
  // Node 0 only: the launchers' store, kept until the job ends so that a slow node still finds it.
  std::shared_ptr<TcpStoreServer> server;
};

// Meets the other nodes' launchers. Errors (FailedPrecondition, naming this node, the address
// and the fix): node 0 cannot serve --master-addr:--port; this node cannot reach it within
// `timeout`; nodes that did not come within `timeout`; nodes whose -n differs; a --node-rank
// another launcher already claimed — at once, and, when the job already runs (a node restarted
// after a crash), saying that a node cannot rejoin and that every node restarts from the last
// checkpoint.
absl::StatusOr<NodeAgreement> agree_with_nodes(const NodeOptions& options);

// "STRATA_COMM_TIMEOUT" from the environment (default 5 min), or an error naming its value.
absl::StatusOr<std::chrono::milliseconds> rendezvous_timeout();

}  // namespace strata::run
