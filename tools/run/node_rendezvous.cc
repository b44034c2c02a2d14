#include "run/node_rendezvous.h"

#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "run/launcher.h"
#include "strata/base/system.h"
#include "strata/base/unique_fd.h"
#include "strata/comm/tcp_store.h"
#include "strata/config/comm_settings.h"

namespace strata::run {
namespace {

std::string node_key(int node) { return absl::StrFormat("strata-run/node/%d", node); }
constexpr const char* kRanksPortKey = "strata-run/ranks-port";
// Set by each node once it read the agreement: all of them set, the job's ranks run.
std::string read_key(int node) { return absl::StrFormat("strata-run/read/%d", node); }
std::vector<std::string> read_keys(int nnodes) {
  std::vector<std::string> keys;
  for (int n = 0; n < nnodes; ++n) keys.push_back(read_key(n));
  return keys;
}

// A free port of `addr`: bind port 0, read what the kernel chose, close (as for -n alone).
absl::StatusOr<int> free_port_of(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(addr.c_str(), "0", &hints, &found); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("--master-addr '%s' cannot be resolved (%s)", addr, gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (!fd || ::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 ||
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      error = sys::errno_text(errno);
      continue;
    }
    freeaddrinfo(found);
    return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  freeaddrinfo(found);
  return absl::FailedPreconditionError(
      absl::StrFormat("no free port for the ranks on %s: %s", addr, error));
}

std::string who(const NodeOptions& o) {
  return absl::StrFormat("node %d of %d", o.node_rank, o.nnodes);
}

}  // namespace

absl::StatusOr<std::chrono::milliseconds> rendezvous_timeout() {
  const char* text = std::getenv("STRATA_COMM_TIMEOUT");
  if (text == nullptr) return CommSettings{}.timeout;
  absl::StatusOr<std::chrono::milliseconds> t = parse_comm_timeout(text);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("STRATA_COMM_TIMEOUT=%s", t.status().message()));
  }
  return *t;
}

absl::StatusOr<NodeAgreement> agree_with_nodes(const NodeOptions& o) {
  NodeAgreement agreement;
  const std::string where = absl::StrFormat("%s:%d", o.master_addr, o.port);
  const std::string limit = format_duration(o.timeout);
  if (o.node_rank == 0) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::start(o.master_addr, static_cast<uint16_t>(o.port), o.nnodes);
    if (!server.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s cannot serve the nodes' rendezvous on %s: %s (node 0 serves it: --master-addr must "
          "be an address of this machine, --port a free port)",
          who(o), where, server.status().message()));
    }
    agreement.server = *std::move(server);
  }
  TcpStore::Options store_options;
  store_options.host = o.master_addr;
  store_options.port = static_cast<uint16_t>(o.port);
  store_options.rank = o.node_rank;
  store_options.world_size = o.nnodes;
  store_options.timeout = o.timeout;
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect(store_options);
  if (!store.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s cannot reach the nodes' rendezvous at %s within %s (STRATA_COMM_TIMEOUT): %s. Start "
        "node 0 (--node-rank=0) on the machine of --master-addr with the same --port, and check "
        "that this machine can reach it",
        who(o), where, limit, store.status().message()));
  }
  TcpStore& s = **store;
  // Two launchers given the same --node-rank would overwrite each other's entry: the second
  // to come says so at once.
  absl::StatusOr<int64_t> claims = s.add(absl::StrFormat("strata-run/claim/%d", o.node_rank), 1);
  if (!claims.ok()) {
    return absl::UnavailableError(absl::StrFormat("%s: the nodes' rendezvous at %s failed: %s",
                                                  who(o), where, claims.status().message()));
  }
  if (*claims > 1) {
    absl::StatusOr<std::string> other = s.get(node_key(o.node_rank));
    const std::string address = other.ok() ? other->substr(other->find(' ') + 1) : "";
    // Every node read the agreement: the ranks run. The claim is then most likely a node whose
    // strata-run or machine died and was started again, which cannot join (no elastic restart).
    absl::StatusOr<bool> running = s.check(read_keys(o.nnodes));
    if (running.ok() && *running) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: the job whose nodes met at %s is already running with node %d%s: a node cannot "
          "rejoin a running job (strata has no elastic restart). If node %d's strata-run or "
          "machine failed, the other nodes end the job with an error within STRATA_COMM_TIMEOUT; "
          "then restart every node's strata-run, loading the last checkpoint (resharding allows "
          "fewer nodes)",
          who(o), where, o.node_rank,
          address.empty() ? "" : absl::StrFormat(" (which joined from %s)", address), o.node_rank));
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: another strata-run already joined the nodes' rendezvous at %s as --node-rank=%d%s: "
        "give each machine its own --node-rank, from 0 to %d",
        who(o), where, o.node_rank, address.empty() ? "" : absl::StrFormat(" (from %s)", address),
        o.nnodes - 1));
  }
  const std::string mine = absl::StrFormat("%d %s", o.nproc, s.local_address());
  if (absl::Status st = s.set(node_key(o.node_rank), mine); !st.ok()) {
    return absl::UnavailableError(
        absl::StrFormat("%s: the nodes' rendezvous at %s failed: %s", who(o), where, st.message()));
  }
  if (o.node_rank == 0) {
    absl::StatusOr<int> port = free_port_of(o.master_addr);
    if (!port.ok()) return absl::FailedPreconditionError(port.status().message());
    if (absl::Status st = s.set(kRanksPortKey, absl::StrFormat("%d", *port)); !st.ok()) {
      return absl::UnavailableError(absl::StrFormat("%s: the nodes' rendezvous at %s failed: %s",
                                                    who(o), where, st.message()));
    }
  }
  std::vector<std::string> keys;
  for (int n = 0; n < o.nnodes; ++n) keys.push_back(node_key(n));
  if (absl::Status st = s.wait(keys, o.timeout); !st.ok()) {
    std::vector<int> missing;
    for (int n = 0; n < o.nnodes; ++n) {
      absl::StatusOr<bool> there = s.check({node_key(n)});
      if (there.ok() && !*there) missing.push_back(n);
    }
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s: %s did not join the nodes' rendezvous at %s within %s (STRATA_COMM_TIMEOUT): start "
        "strata-run with --nnodes=%d and each --node-rank from 0 to %d (%s)",
        who(o),
        missing.empty()       ? std::string("some nodes")
        : missing.size() == 1 ? absl::StrFormat("node %d", missing[0])
                              : "nodes " + rank_list(missing),
        where, limit, o.nnodes, o.nnodes - 1, st.message()));
  }
  std::vector<int> counts;
  for (int n = 0; n < o.nnodes; ++n) {
    absl::StatusOr<std::string> value = s.get(node_key(n));
    if (!value.ok()) {
      return absl::UnavailableError(absl::StrFormat("%s: the nodes' rendezvous at %s failed: %s",
                                                    who(o), where, value.status().message()));
    }
    const std::pair<std::string, std::string> parts =
        absl::StrSplit(*value, absl::MaxSplits(' ', 1));
    int count = 0;
    if (!absl::SimpleAtoi(parts.first, &count)) count = -1;
    counts.push_back(count);
    agreement.addresses.push_back(parts.second);
  }
  absl::StatusOr<std::string> port_text = s.get(kRanksPortKey);
  int ranks_port = 0;
  if (!port_text.ok() || !absl::SimpleAtoi(*port_text, &ranks_port)) {
    return absl::UnavailableError(absl::StrFormat(
        "%s: node 0 did not say the ranks' port through the nodes' rendezvous at %s: %s", who(o),
        where, port_text.ok() ? *port_text : std::string(port_text.status().message())));
  }
  agreement.ranks_port = ranks_port;
  // Every node has read what it needs: node 0's store may go (it waits, bounded, so that a node
  // that is still reading sees the disagreement too, not a lost rendezvous).
  if (absl::Status st = s.set(read_key(o.node_rank), ""); !st.ok() && o.node_rank != 0) {
    return absl::UnavailableError(
        absl::StrFormat("%s: the nodes' rendezvous at %s failed: %s", who(o), where, st.message()));
  }
  if (o.node_rank == 0) {
    // A node lost now fails on its own, with its ranks.
    (void)s.wait(read_keys(o.nnodes), o.timeout);
  }
  for (int n = 0; n < o.nnodes; ++n) {
    if (counts[static_cast<size_t>(n)] == counts[0]) continue;
    std::string list;
    for (int m = 0; m < o.nnodes; ++m) {
      list += absl::StrFormat("%snode %d (%s) -n %d", m == 0 ? "" : ", ", m,
                              agreement.addresses[static_cast<size_t>(m)],
                              counts[static_cast<size_t>(m)]);
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the nodes disagree on the number of ranks per node: %s. Every node starts the same "
        "-n (RANK = node rank x -n + local rank)",
        who(o), list));
  }
  return agreement;
}

}  // namespace strata::run
