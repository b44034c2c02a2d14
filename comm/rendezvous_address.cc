#include "rendezvous_address.h"

#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "strata/base/mutex.h"
#include "strata/base/text.h"
#include "strata/base/unique_fd.h"
#include "tcp_store_protocol.h"

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

// Communicators joined through a launcher's store so far, per job attempt and rank. A process
// holds one rank of a job; tests run several ranks on threads, each counting its own.
struct Announcements {
  absl::Mutex mutex;
  std::map<std::string, int> counts ABSL_GUARDED_BY(mutex);
};

Announcements& announcements() {
  static Announcements made;
  return made;
}

}  // namespace

absl::StatusOr<std::string> local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* raw = nullptr;
  // Any port: connect() on a UDP socket only chooses the route and the local address.
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &raw);
  if (rc != 0) {
    return absl::InvalidArgumentError(to_absl(
        cat("MASTER_ADDR='", host, "' does not resolve (",
            rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc),
            "): the ranks meet through the launcher's store there, so it must be a host name or "
            "IP address every rank reaches")));
  }
  const tcp_store::AddrInfoList list(raw);
  int last_errno = 0;
  for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd || ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last_errno = errno;
      continue;
    }
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0) {
      last_errno = errno;
      continue;
    }
    std::string address = tcp_store::numeric_host(reinterpret_cast<sockaddr*>(&local), length);
    if (!address.empty()) return address;
  }
  return absl::UnavailableError(to_absl(cat("no route from this machine to MASTER_ADDR='", host,
                                            "' (", std::strerror(last_errno),
                                            "): rank 0 serves strata's rendezvous on the "
                                            "interface that reaches it")));
}

std::string next_announcement_key(const LaunchInfo& launch) {
  const std::string job = cat("strata/rendezvous/", launch.run_id.empty() ? "job" : launch.run_id,
                              "/attempt_", launch.restart_count, "/");
  int n = 0;
  {
    Announcements& a = announcements();
    MutexLock lock(&a.mutex);
    n = a.counts[cat(job, launch.rank)]++;
  }
  return cat(job, n);
}

std::string encode(const RendezvousPoint& point) { return cat(point.host, " ", point.port); }

absl::StatusOr<RendezvousPoint> decode_rendezvous_point(const std::string& text) {
  const size_t space = text.find(' ');
  uint32_t port = 0;
  if (space == std::string::npos || space == 0 ||
      !absl::SimpleAtoi(to_absl(std::string_view(text).substr(space + 1)), &port) || port == 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        to_absl(cat("'", text,
                    "' is not a rendezvous address (\"host port\"): is every rank "
                    "the same strata version?")));
  }
  return RendezvousPoint{text.substr(0, space), static_cast<uint16_t>(port)};
}

}  // namespace strata::comm_internal
