#include "gloo_peers.h"

#include <algorithm>

namespace strata::comm_internal {
namespace {

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// "host" of the first "[host]:port" at or after `at`; empty when there is none.
std::string bracketed_host(std::string_view local, std::string_view::size_type at) {
  const auto open = local.find('[', at);
  const auto close = open == std::string_view::npos ? open : local.find(']', open);
  if (close == std::string_view::npos) return "";
  return std::string(local.substr(open + 1, close - open - 1));
}

// Gloo's broadcast (gloo/broadcast.cc): a binomial tree over virtual ranks (root = 0). In step i
// the ranks whose virtual rank has no bit above i-1 set take part: the one with bit i clear
// sends to the one with it set.
std::vector<int> broadcast_peers(int world, int rank, int root, TransportDirection direction) {
  std::vector<int> peers;
  int dim = 0;
  while ((1 << dim) < world) ++dim;
  const int vrank = (rank + world - root) % world;
  int mask = (1 << dim) - 1;
  for (int i = 0; i < dim; ++i) {
    mask ^= 1 << i;
    if ((vrank & mask) != 0) continue;
    const int vpeer = vrank ^ (1 << i);
    if (vpeer >= world) continue;
    const bool sends = (vrank & (1 << i)) == 0;
    if (sends == (direction == TransportDirection::kSend)) peers.push_back((vpeer + root) % world);
  }
  return peers;
}

}  // namespace

std::vector<int> gloo_peers(const CollectiveCall& call, int world, int rank,
                            TransportDirection direction) {
  std::vector<int> peers;
  if (world < 2) return peers;
  const bool send = direction == TransportDirection::kSend;
  const int next = (rank + 1) % world;
  const int previous = (rank + world - 1) % world;
  switch (call.kind) {
    case CollectiveKind::kAllGather:  // gloo/allgatherv.cc: a ring, sending to rank + 1
      peers = {send ? next : previous};
      break;
    case CollectiveKind::kReduceScatter:
      if (is_power_of_two(world)) {  // halving-doubling: every other rank may be a peer
        for (int r = 0; r < world; ++r) {
          if (r != rank) peers.push_back(r);
        }
        break;
      }
      [[fallthrough]];                // other world sizes: strata runs Gloo's ring all-reduce
    case CollectiveKind::kAllReduce:  // gloo/allreduce.cc: a ring, sending to rank - 1
      peers = {send ? previous : next};
      break;
    case CollectiveKind::kBroadcast:
      peers = broadcast_peers(world, rank, call.root, direction);
      break;
    case CollectiveKind::kBarrier:  // gloo/barrier.cc: dissemination, rank ± 1, 2, 4, ...
      for (int d = 1; d < world; d <<= 1) {
        peers.push_back(send ? (rank + d) % world : (rank + world - d) % world);
      }
      break;
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

std::optional<std::string> gloo_closed_by(std::string_view local) {
  const auto at = local.find("Connection closed by peer");
  if (at == std::string_view::npos) return std::nullopt;
  return bracketed_host(local, at);
}

std::optional<TransportWait> gloo_transport_wait(const CollectiveCall& call, int world, int rank,
                                                 std::string_view local) {
  TransportWait wait;
  // Unbound buffers (gloo/transport/tcp/unbound_buffer.cc) name no peer; pair-level buffers
  // (gloo/transport/tcp/buffer.cc) name its address as "[host]:port".
  std::string_view::size_type at = std::string_view::npos;
  if (local.find("for send operation to complete") != std::string_view::npos) {
    wait.direction = TransportDirection::kSend;
  } else if (local.find("for recv operation to complete") != std::string_view::npos) {
    wait.direction = TransportDirection::kRecv;
  } else if ((at = local.find("Write timeout [")) != std::string_view::npos) {
    wait.direction = TransportDirection::kSend;
  } else if ((at = local.find("Read timeout [")) != std::string_view::npos) {
    wait.direction = TransportDirection::kRecv;
  } else {
    return std::nullopt;
  }
  if (at != std::string_view::npos) wait.address = bracketed_host(local, at);
  CollectiveCall algorithm = call;
  if (local.starts_with("the signature check")) algorithm.kind = CollectiveKind::kAllGather;
  wait.peers = gloo_peers(algorithm, world, rank, wait.direction);
  if (wait.peers.empty()) return std::nullopt;
  return wait;
}

}  // namespace strata::comm_internal
