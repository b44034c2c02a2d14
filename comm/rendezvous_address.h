// Where rank 0 serves strata's rendezvous when a launcher's store is the meeting point
// (strata/comm/launcher_store.h): rank 0 listens on a free port of the interface that routes to
// MASTER_ADDR (the address the other ranks, which reach MASTER_ADDR, reach it by) and announces
// "host port" under a key of its own; the others read it there.
//
// Keys: strata/rendezvous/<run>/attempt_<TORCHELASTIC_RESTART_COUNT>/<n>, n counting the
// communicators this rank joined through a launcher's store in this attempt (every rank creates
// the same ones in the same order, so the n-th is the same job). A restarted job (torchrun
// --max-restarts) reads its own attempt's key, never an earlier attempt's address of a rank 0 that
// is gone.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <string>

#include "strata/comm/launch.h"

namespace strata::comm_internal {

struct RendezvousPoint {
  std::string host;  // numeric IP address
  uint16_t port = 0;
};

// The IP address of this machine's interface that routes to `host` (a UDP socket connected to
// it, which sends nothing): "127.0.0.1" for a loopback host. An error names the host.
absl::StatusOr<std::string> local_address_towards(const std::string& host);

// The key of the next rendezvous this process announces or reads through a launcher's store.
std::string next_announcement_key(const LaunchInfo& launch);

std::string encode(const RendezvousPoint& point);
absl::StatusOr<RendezvousPoint> decode_rendezvous_point(const std::string& text);

}  // namespace strata::comm_internal
