// TcpStoreServer: one thread polls the listening socket, a self-pipe (shutdown) and every client
// socket; no thread per client. Waits are parked and answered when their keys exist, when their
// deadline passes, or as soon as a rank is lost.
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "strata/base/log.h"
#include "strata/base/unique_fd.h"
#include "strata/comm/tcp_store.h"
#include "tcp_store_protocol.h"

namespace strata {
namespace {

using namespace tcp_store;  // NOLINT(build/namespaces): the private wire format

// Input a client may have buffered behind a parked wait before it is judged misbehaving (a
// well-behaved client has one request in flight).
constexpr size_t kMaxBufferedInput = kHeaderBytes + kMaxFrameBytes + (64u << 10);

struct Parked {
  bool is_get = false;
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

struct Connection {
  UniqueFd fd;
  std::string peer;  // "address:port", for log lines
  std::string in;
  std::string out;
  int rank = -1;  // set by a valid hello
  bool goodbye = false;
  bool closed = false;
  bool close_after_flush = false;  // a refused hello: send the error, then close
  std::string close_reason;
  std::optional<Parked> parked;
};

std::string peer_name(const sockaddr_storage& ss, socklen_t length) {
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  return endpoint(numeric_host(reinterpret_cast<const sockaddr*>(&ss), length), port);
}

class Server final : public TcpStoreServer {
 public:
  Server(UniqueFd listener, UniqueFd wake_read, UniqueFd wake_write, uint16_t port, int world_size,
         std::string where)
      : listener_(std::move(listener)),
        wake_read_(std::move(wake_read)),
        wake_write_(std::move(wake_write)),
        port_(port),
        world_size_(world_size),
        where_(std::move(where)),
        connected_(static_cast<size_t>(world_size), false) {}

  ~Server() override {
    const char byte = 1;
    while (::write(wake_write_.get(), &byte, 1) < 0 && errno == EINTR) {
    }
    if (thread_.joinable()) thread_.join();
  }

  uint16_t port() const override { return port_; }
  int parked_waits() const override { return parked_count_.load(std::memory_order_acquire); }

  void launch() {
    thread_ = std::thread([this] { run(); });
  }

 private:
  void run();
  void accept_all();
  void read_from(Connection& c);
  void flush(Connection& c);
  void process(Connection& c);
  void handle(Connection& c, std::string_view body);
  void hello(Connection& c, FrameReader& r);
  void add(Connection& c, const std::string& key, int64_t delta);
  void reply(Connection& c, std::string frame);
  void refuse(Connection& c, absl::StatusCode code, const std::string& message);
  void protocol_error(Connection& c, const std::string& what);
  void close(Connection& c, std::string reason);
  bool try_answer(Connection& c);
  void settle();
  bool reap();
  std::optional<Clock::time_point> next_deadline() const;
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  std::vector<int> never_connected() const;

  const UniqueFd listener_;
  const UniqueFd wake_read_;
  const UniqueFd wake_write_;
  const uint16_t port_;
  const int world_size_;
  const std::string where_;  // "host:port", for messages
  std::thread thread_;
  std::atomic<int> parked_count_{0};  // written by the server thread after each round

  // Everything below belongs to the server thread alone (started by start(), joined by the
  // destructor; nothing else reads it), so it needs no lock.
  std::unordered_map<std::string, std::string> values_;
  std::vector<bool> connected_;  // by rank: said hello at least once
  std::set<int> lost_;
  std::vector<std::unique_ptr<Connection>> connections_;
  Clock::time_point accept_paused_until_{};
};

void Server::run() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    const bool accepting = Clock::now() >= accept_paused_until_;
    fds.push_back({listener_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    fds.push_back({wake_read_.get(), POLLIN, 0});
    for (const auto& c : connections_) {
      fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
    }
    std::optional<Clock::time_point> deadline = next_deadline();
    if (!accepting && (!deadline || accept_paused_until_ < *deadline)) {
      deadline = accept_paused_until_;
    }
    const int timeout = deadline ? poll_timeout_ms(*deadline) : -1;
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      STRATA_LOG(kError, "rendezvous at %s: poll failed: %s", where_, std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fds[1].revents != 0) break;  // the destructor asks to stop
    const size_t polled = connections_.size();
    for (size_t i = 0; i < polled; ++i) {
      Connection& c = *connections_[i];
      const short events = fds[2 + i].revents;
      if (!c.closed && (events & (POLLIN | POLLHUP | POLLERR)) != 0) read_from(c);
      if (!c.closed && (events & POLLOUT) != 0) flush(c);
    }
    if ((fds[0].revents & POLLIN) != 0) accept_all();
    do {
      settle();
    } while (reap());
    int parked = 0;
    for (const auto& c : connections_) parked += c->parked ? 1 : 0;
    parked_count_.store(parked, std::memory_order_release);
  }
  parked_count_.store(0, std::memory_order_release);
  // Closing every socket tells each client that the rendezvous is gone.
  connections_.clear();
}

void Server::accept_all() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t length = sizeof ss;
    const int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors, typically: retry shortly rather than spin on the listener.
        STRATA_LOG(kWarn, "rendezvous at %s: cannot accept a connection: %s", where_,
                   std::strerror(errno));
        accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    auto c = std::make_unique<Connection>();
    c->fd = UniqueFd(fd);
    c->peer = peer_name(ss, length);
    if (!configure_socket(fd)) {
      STRATA_LOG(kWarn, "rendezvous at %s: cannot configure the connection from %s: %s", where_,
                 c->peer, std::strerror(errno));
      continue;
    }
    connections_.push_back(std::move(c));
  }
}

void Server::read_from(Connection& c) {
  char buffer[64 << 10];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), buffer, sizeof buffer, 0);
    if (n > 0) {
      c.in.append(buffer, static_cast<size_t>(n));
      if (c.in.size() > kMaxBufferedInput) break;  // process() judges it
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // End of stream or a reset: what arrived before it (a goodbye, say) still counts.
    const std::string reason =
        n == 0 ? "closed without a goodbye" : absl::StrFormat("reset (%s)", std::strerror(errno));
    process(c);
    if (!c.closed) close(c, reason);
    return;
  }
  process(c);
}

void Server::flush(Connection& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(c, absl::StrFormat("send failed (%s)", std::strerror(errno)));
    return;
  }
  if (c.close_after_flush) close(c, "refused");
}

void Server::process(Connection& c) {
  while (!c.closed && !c.close_after_flush && c.in.size() >= kHeaderBytes) {
    const uint32_t length = frame_length(c.in);
    if (length == 0 || length > kMaxFrameBytes) {
      protocol_error(
          c, absl::StrFormat("a message of %u bytes (1 to %u allowed)", length, kMaxFrameBytes));
      return;
    }
    if (c.in.size() < kHeaderBytes + length) return;
    const std::string_view body = std::string_view(c.in).substr(kHeaderBytes, length);
    // One request at a time: behind a parked wait, only a goodbye is taken.
    if (c.parked && static_cast<Request>(body[0]) != Request::kGoodbye) {
      if (c.in.size() > kMaxBufferedInput) {
        protocol_error(c, "more requests while a wait was pending");
      }
      return;
    }
    handle(c, body);
    c.in.erase(0, kHeaderBytes + length);
  }
  if (!c.closed && c.in.size() > kMaxBufferedInput) {
    protocol_error(c, "more requests while a wait was pending");
  }
}

void Server::handle(Connection& c, std::string_view body) {
  FrameReader r(body);
  const auto type = static_cast<Request>(r.u8());
  if (type == Request::kHello) {
    hello(c, r);
    return;
  }
  if (c.rank < 0) {
    protocol_error(c,
                   absl::StrFormat("request type %d before the greeting", static_cast<int>(type)));
    return;
  }
  switch (type) {
    case Request::kSet: {
      std::string key = r.str();
      std::string value = r.str();
      if (!r.complete()) break;
      values_[std::move(key)] = std::move(value);
      reply(c, FrameWriter().u8(static_cast<uint8_t>(Reply::kOk)).finish());
      return;
    }
    case Request::kGet:
    case Request::kWait: {
      Parked p;
      p.is_get = type == Request::kGet;
      if (p.is_get) {
        p.keys.push_back(r.str());
      } else {
        p.keys = r.strs();
      }
      const int64_t timeout_ms = r.i64();
      if (!r.complete()) break;
      p.deadline = Clock::now() + clamp_timeout(std::chrono::milliseconds(timeout_ms));
      c.parked = std::move(p);
      try_answer(c);
      return;
    }
    case Request::kCheck: {
      const std::vector<std::string> keys = r.strs();
      if (!r.complete()) break;
      const bool all = missing(keys).empty();
      reply(c, FrameWriter().u8(static_cast<uint8_t>(Reply::kBool)).u8(all ? 1 : 0).finish());
      return;
    }
    case Request::kAdd: {
      const std::string key = r.str();
      const int64_t delta = r.i64();
      if (!r.complete()) break;
      add(c, key, delta);
      return;
    }
    case Request::kLostRanks: {
      if (!r.complete()) break;
      const std::vector<int> lost(lost_.begin(), lost_.end());
      reply(c, FrameWriter().u8(static_cast<uint8_t>(Reply::kRanks)).ints(lost).finish());
      return;
    }
    case Request::kGoodbye:
      if (!r.complete()) break;
      c.goodbye = true;
      c.parked.reset();
      close(c, "said goodbye");
      return;
    default:
      protocol_error(c, absl::StrFormat("unknown request type %d", static_cast<int>(type)));
      return;
  }
  protocol_error(c, absl::StrFormat("a malformed request of type %d", static_cast<int>(type)));
}

void Server::hello(Connection& c, FrameReader& r) {
  const uint32_t magic = r.u32();
  const uint32_t version = r.u32();
  const int rank = r.i32();
  const int world_size = r.i32();
  if (!r.complete() || magic != kMagic) {
    protocol_error(c, "a greeting that is not strata's (is something else using this port?)");
    return;
  }
  if (c.rank >= 0) {
    protocol_error(c, "a second greeting");
    return;
  }
  if (version != kVersion) {
    refuse(c, absl::StatusCode::kFailedPrecondition,
           absl::StrFormat("this rank speaks rendezvous protocol version %u, but rank 0's "
                           "rendezvous at %s speaks version %u: run the same strata on every rank",
                           version, where_, kVersion));
    return;
  }
  if (world_size != world_size_) {
    refuse(c, absl::StatusCode::kInvalidArgument,
           absl::StrFormat("WORLD_SIZE mismatch: rank %d was started with WORLD_SIZE=%d, but rank "
                           "0 serves the rendezvous at %s for WORLD_SIZE=%d: start every rank "
                           "with the same WORLD_SIZE",
                           rank, world_size, where_, world_size_));
    return;
  }
  if (rank < 0 || rank >= world_size_) {
    refuse(c, absl::StatusCode::kInvalidArgument,
           absl::StrFormat("RANK=%d is out of range for WORLD_SIZE=%d: ranks are 0 to %d", rank,
                           world_size_, world_size_ - 1));
    return;
  }
  c.rank = rank;
  connected_[static_cast<size_t>(rank)] = true;
  reply(c, FrameWriter().u8(static_cast<uint8_t>(Reply::kOk)).finish());
}

void Server::add(Connection& c, const std::string& key, int64_t delta) {
  int64_t value = 0;
  const auto it = values_.find(key);
  if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
    reply(c, FrameWriter()
                 .u8(static_cast<uint8_t>(Reply::kError))
                 .u32(static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition))
                 .str(absl::StrFormat("add(): key '%s' holds a value that is not an integer: use "
                                      "a key that only add() writes",
                                      key))
                 .finish());
    return;
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    reply(c, FrameWriter()
                 .u8(static_cast<uint8_t>(Reply::kError))
                 .u32(static_cast<uint32_t>(absl::StatusCode::kOutOfRange))
                 .str(absl::StrFormat("add(): key '%s' holds %d; adding %d overflows 64 bits", key,
                                      value, delta))
                 .finish());
    return;
  }
  values_[key] = absl::StrFormat("%d", sum);
  reply(c, FrameWriter().u8(static_cast<uint8_t>(Reply::kInt)).i64(sum).finish());
}

void Server::reply(Connection& c, std::string frame) {
  c.out += frame;
  flush(c);
}

void Server::refuse(Connection& c, absl::StatusCode code, const std::string& message) {
  STRATA_LOG(kWarn, "rendezvous at %s: refused the connection from %s: %s", where_, c.peer,
             message);
  c.close_after_flush = true;
  reply(c, FrameWriter()
               .u8(static_cast<uint8_t>(Reply::kError))
               .u32(static_cast<uint32_t>(code))
               .str(message)
               .finish());
}

void Server::protocol_error(Connection& c, const std::string& what) {
  STRATA_LOG(kWarn, "rendezvous at %s: closing the connection from %s (%s): it sent %s", where_,
             c.peer, c.rank >= 0 ? absl::StrFormat("rank %d", c.rank) : "no greeting yet", what);
  close(c, "sent a malformed message");
}

void Server::close(Connection& c, std::string reason) {
  c.closed = true;
  c.close_reason = std::move(reason);
}

bool Server::try_answer(Connection& c) {
  if (c.closed || !c.parked) return false;
  const Parked& p = *c.parked;
  const std::vector<std::string> absent = missing(p.keys);
  std::string frame;
  if (absent.empty()) {
    frame = p.is_get ? FrameWriter()
                           .u8(static_cast<uint8_t>(Reply::kValue))
                           .str(values_.at(p.keys.front()))
                           .finish()
                     : FrameWriter().u8(static_cast<uint8_t>(Reply::kOk)).finish();
  } else if (!lost_.empty()) {
    const std::vector<int> lost(lost_.begin(), lost_.end());
    frame = FrameWriter().u8(static_cast<uint8_t>(Reply::kLost)).ints(lost).strs(absent).finish();
  } else if (Clock::now() >= p.deadline) {
    frame = FrameWriter()
                .u8(static_cast<uint8_t>(Reply::kTimeout))
                .ints(never_connected())
                .strs(absent)
                .finish();
  } else {
    return false;
  }
  c.parked.reset();
  reply(c, std::move(frame));
  return true;
}

// Answers every parked wait that can be answered now, then takes the requests buffered behind
// it; repeats while that changes anything (a request taken may set a key another waits for).
void Server::settle() {
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t i = 0; i < connections_.size(); ++i) {
      Connection& c = *connections_[i];
      if (try_answer(c)) {
        progress = true;
        process(c);
      }
    }
  }
}

// Drops closed connections; one that had greeted and left without a goodbye loses its rank.
// True when any was dropped.
bool Server::reap() {
  bool any = false;
  for (auto it = connections_.begin(); it != connections_.end();) {
    Connection& c = **it;
    if (!c.closed) {
      ++it;
      continue;
    }
    any = true;
    if (c.rank >= 0 && !c.goodbye && lost_.insert(c.rank).second) {
      STRATA_LOG(kWarn,
                 "rendezvous at %s: rank %d lost its connection (%s from %s): its process exited "
                 "or was killed",
                 where_, c.rank, c.close_reason, c.peer);
    }
    it = connections_.erase(it);
  }
  return any;
}

std::optional<Clock::time_point> Server::next_deadline() const {
  std::optional<Clock::time_point> next;
  for (const auto& c : connections_) {
    if (c->parked && (!next || c->parked->deadline < *next)) next = c->parked->deadline;
  }
  return next;
}

std::vector<std::string> Server::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    if (values_.find(key) == values_.end()) out.push_back(key);
  }
  return out;
}

std::vector<int> Server::never_connected() const {
  std::vector<int> out;
  for (size_t rank = 0; rank < connected_.size(); ++rank) {
    if (!connected_[rank]) out.push_back(static_cast<int>(rank));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host,
                                                                      uint16_t port,
                                                                      int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("WORLD_SIZE=%d: a rendezvous needs at least one rank", world_size));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* raw = nullptr;
  const std::string service = absl::StrFormat("%u", port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &raw);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MASTER_ADDR='%s' does not resolve (%s): rank 0 serves the rendezvous there, so it must "
        "be a host name or IP address of rank 0's machine",
        host, rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc)));
  }
  const AddrInfoList list(raw);
  UniqueFd listener;
  int bind_errno = 0;
  bool in_use = false;
  for (const addrinfo* ai = list.get(); ai != nullptr && !listener; ai = ai->ai_next) {
    UniqueFd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      bind_errno = errno;
      continue;
    }
    const int one = 1;
    const int zero = 0;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) {
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
      bind_errno = errno;
      in_use = in_use || errno == EADDRINUSE;
      continue;
    }
    listener = std::move(fd);
  }
  if (!listener) {
    if (in_use) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "MASTER_PORT=%u is in use on %s: choose a free port (strata-run picks one) or stop the "
          "process holding it",
          port, host));
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot serve the rendezvous on %s: %s: MASTER_ADDR must be an address of rank 0's "
        "machine (0.0.0.0 listens on every interface)",
        endpoint(host, port), std::strerror(bind_errno)));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    return absl::InternalError(
        absl::StrFormat("rendezvous: getsockname failed: %s", std::strerror(errno)));
  }
  const uint16_t actual = bound.ss_family == AF_INET6
                              ? ntohs(reinterpret_cast<const sockaddr_in6&>(bound).sin6_port)
                              : ntohs(reinterpret_cast<const sockaddr_in&>(bound).sin_port);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("rendezvous: cannot create a pipe: %s", std::strerror(errno)));
  }
  auto server =
      std::make_unique<Server>(std::move(listener), UniqueFd(pipe_fds[0]), UniqueFd(pipe_fds[1]),
                               actual, world_size, endpoint(host, actual));
  server->launch();
  return server;
}

}  // namespace strata
