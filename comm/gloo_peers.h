// Which peers a rank was waiting on when one of Gloo's transport operations timed out. Gloo's
// words say whether a send or a receive timed out, and name the peer's address only for its
// pair-level buffers ("Write timeout [10.77.0.2]:54424"); its unbound buffers (ring all-gather,
// ring all-reduce, broadcast, barrier) say only "Timed out waiting 4000ms for send operation to
// complete". The peers then follow from the algorithm Gloo runs for the call, which strata
// chooses (comm/gloo_communicator.cc: keep the two in step). A send that does not complete means
// the receiving peer (or the link to it) did not take the data; a receive that does not complete
// means nothing came from the sending peer (or over the link from it). Either peer may itself be
// waiting on another: JobMonitor::post_mortem follows such chains.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collective_call.h"

namespace strata::comm_internal {

enum class TransportDirection { kSend, kRecv };

// The ranks `rank` sends to (kSend) or receives from (kRecv) in `call` as strata runs it on Gloo,
// sorted. Gloo's halving-doubling reduce-scatter (world a power of two) exchanges with peers
// that depend on the counts: every other rank is a candidate.
std::vector<int> gloo_peers(const CollectiveCall& call, int world_size, int rank,
                            TransportDirection direction);

struct TransportWait {
  TransportDirection direction = TransportDirection::kSend;
  std::string address;     // the peer's host when Gloo's words name it ("10.77.0.2"), else empty
  std::vector<int> peers;  // the candidates (gloo_peers), not yet narrowed by the address
};

// A timed-out send or receive read from Gloo's words `local` for `call` on `rank`; nullopt for
// any other error (a closed connection, NCCL's words, ...). A failed signature check
// (STRATA_COMM_DEBUG) ran Gloo's ring all-gather whatever the call.
std::optional<TransportWait> gloo_transport_wait(const CollectiveCall& call, int world_size,
                                                 int rank, std::string_view local);

// Gloo's words when a peer closed its connection to this rank ("Connection closed by peer
// [10.77.0.1]:59072"): the peer's host, or empty when the words name none; nullopt for any other
// error. A rank whose own send or receive timed out closes all its pairs, so its peers see this.
std::optional<std::string> gloo_closed_by(std::string_view local);

}  // namespace strata::comm_internal
