// TcpStore: one connection to the rendezvous, one request in flight (a mutex lets threads share
// it). Every send and receive polls against a deadline, so no call outlives its timeout even if
// the server is stuck.
#include <absl/base/thread_annotations.h>
#include <absl/strings/str_format.h>
#include <absl/synchronization/mutex.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "strata/base/mutex.h"
#include "strata/base/unique_fd.h"
#include "strata/comm/tcp_store.h"
#include "strata/testing/tcp_store_testing.h"
#include "tcp_store_protocol.h"

namespace strata {
namespace {

using namespace tcp_store;  // NOLINT(build/namespaces): the private wire format
using std::chrono::milliseconds;

// How long past the server's own deadline the client waits for its answer before giving up on
// a stuck server.
constexpr milliseconds kBackstop = std::chrono::seconds(1);
constexpr milliseconds kFirstBackoff{5};
constexpr milliseconds kMaxBackoff{100};

enum class Io { kOk, kClosed, kTimeout };

// Waits until `fd` is ready for `events` (a retry follows) or `deadline` passes: kOk, kTimeout,
// or kClosed with errno.
Io wait_until_ready(int fd, short events, Clock::time_point deadline, int& error) {
  pollfd p{fd, events, 0};
  const int timeout = poll_timeout_ms(deadline);
  const int ready = ::poll(&p, 1, timeout);
  if (ready == 0 && timeout == 0) return Io::kTimeout;
  if (ready < 0 && errno != EINTR) {
    error = errno;
    return Io::kClosed;
  }
  return Io::kOk;
}

// Sends all of `data` before `deadline`. kClosed carries errno (0: the peer closed).
Io send_all(int fd, std::string_view data, Clock::time_point deadline, int& error) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      error = errno;
      return Io::kClosed;
    }
    if (const Io io = wait_until_ready(fd, POLLOUT, deadline, error); io != Io::kOk) return io;
  }
  return Io::kOk;
}

// Receives exactly `n` bytes into `out` before `deadline`.
Io recv_exact(int fd, char* out, size_t n, Clock::time_point deadline, int& error) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, out, n, MSG_DONTWAIT);
    if (got > 0) {
      out += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) {
      error = 0;
      return Io::kClosed;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      error = errno;
      return Io::kClosed;
    }
    if (const Io io = wait_until_ready(fd, POLLIN, deadline, error); io != Io::kOk) return io;
  }
  return Io::kOk;
}

// One reply body; kClosed also when the server announces a malformed length.
Io recv_frame(int fd, std::string& body, Clock::time_point deadline, int& error) {
  char header[kHeaderBytes];
  Io io = recv_exact(fd, header, sizeof header, deadline, error);
  if (io != Io::kOk) return io;
  const uint32_t length = frame_length(std::string_view(header, sizeof header));
  if (length == 0 || length > kMaxFrameBytes) {
    error = EPROTO;
    return Io::kClosed;
  }
  body.resize(length);
  return recv_exact(fd, body.data(), length, deadline, error);
}

std::string goodbye_frame() {
  return FrameWriter().u8(static_cast<uint8_t>(Request::kGoodbye)).finish();
}

class Client final : public TcpStore {
 public:
  Client(Options options, UniqueFd fd, std::string local_address)
      : options_(std::move(options)),
        where_(endpoint(options_.host, options_.port)),
        local_address_(std::move(local_address)),
        fd_(std::move(fd)) {}

  ~Client() override {
    MutexLock lock(&mu_);
    if (fd_ && !skip_goodbye_) {
      // The socket's send buffer is empty (replies are read before the next request), so this
      // small send does not block.
      const std::string frame = goodbye_frame();
      (void)::send(fd_.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }

  absl::Status set(std::string_view key, std::string_view value) override {
    const std::string frame =
        FrameWriter().u8(static_cast<uint8_t>(Request::kSet)).str(key).str(value).finish();
    auto reply = call(frame, options_.timeout, "set", {std::string(key)});
    if (!reply.ok()) return reply.status();
    return expect(*reply, Reply::kOk, "set").status();
  }

  absl::StatusOr<std::string> get(std::string_view key) override {
    return get(key, options_.timeout);
  }

  absl::StatusOr<std::string> get(std::string_view key, milliseconds timeout) override {
    timeout = clamp_timeout(timeout);
    const std::string frame = FrameWriter()
                                  .u8(static_cast<uint8_t>(Request::kGet))
                                  .str(key)
                                  .i64(timeout.count())
                                  .finish();
    auto reply = call(frame, timeout, "get", {std::string(key)});
    if (!reply.ok()) return reply.status();
    auto r = expect(*reply, Reply::kValue, "get");
    if (!r.ok()) return r.status();
    std::string value = r->str();
    if (!r->complete()) return malformed("get");
    return value;
  }

  absl::Status wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    timeout = clamp_timeout(timeout);
    const std::string frame = FrameWriter()
                                  .u8(static_cast<uint8_t>(Request::kWait))
                                  .strs(keys)
                                  .i64(timeout.count())
                                  .finish();
    auto reply = call(frame, timeout, "wait", keys);
    if (!reply.ok()) return reply.status();
    return expect(*reply, Reply::kOk, "wait").status();
  }

  absl::StatusOr<bool> check(const std::vector<std::string>& keys) override {
    const std::string frame =
        FrameWriter().u8(static_cast<uint8_t>(Request::kCheck)).strs(keys).finish();
    auto reply = call(frame, options_.timeout, "check", keys);
    if (!reply.ok()) return reply.status();
    auto r = expect(*reply, Reply::kBool, "check");
    if (!r.ok()) return r.status();
    const bool all = r->u8() != 0;
    if (!r->complete()) return malformed("check");
    return all;
  }

  absl::StatusOr<int64_t> add(std::string_view key, int64_t delta) override {
    const std::string frame =
        FrameWriter().u8(static_cast<uint8_t>(Request::kAdd)).str(key).i64(delta).finish();
    auto reply = call(frame, options_.timeout, "add", {std::string(key)});
    if (!reply.ok()) return reply.status();
    auto r = expect(*reply, Reply::kInt, "add");
    if (!r.ok()) return r.status();
    const int64_t sum = r->i64();
    if (!r->complete()) return malformed("add");
    return sum;
  }

  absl::StatusOr<std::vector<int>> lost_ranks() override {
    const std::string frame = FrameWriter().u8(static_cast<uint8_t>(Request::kLostRanks)).finish();
    auto reply = call(frame, options_.timeout, "lost_ranks", {});
    if (!reply.ok()) return reply.status();
    auto r = expect(*reply, Reply::kRanks, "lost_ranks");
    if (!r.ok()) return r.status();
    std::vector<int> ranks = r->ints();
    if (!r->complete()) return malformed("lost_ranks");
    return ranks;
  }

  std::string local_address() const override { return local_address_; }
  const Options& options() const override { return options_; }

  void drop_without_goodbye() {
    MutexLock lock(&mu_);
    skip_goodbye_ = true;
    fd_ = UniqueFd();
  }

 private:
  // A request and its reply body. `timeout` is the server's bound for the request; the client
  // waits kBackstop longer before deciding the server is stuck.
  absl::StatusOr<std::string> call(const std::string& frame, milliseconds timeout,
                                   std::string_view op, const std::vector<std::string>& keys) {
    if (frame.size() - kHeaderBytes > kMaxFrameBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rendezvous %s: the request is %u bytes, more than the %u the rendezvous carries: it "
          "exchanges ids and addresses, not data",
          op, frame.size(), kMaxFrameBytes));
    }
    MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    const Clock::time_point deadline = Clock::now() + clamp_timeout(timeout) + kBackstop;
    int error = 0;
    Io io = send_all(fd_.get(), frame, deadline, error);
    std::string body;
    if (io == Io::kOk) io = recv_frame(fd_.get(), body, deadline, error);
    if (io == Io::kOk) {
      FrameReader r(body);
      const auto type = static_cast<Reply>(r.u8());
      if (type == Reply::kTimeout || type == Reply::kLost)
        return failed(r, type, timeout, op, keys);
      return body;
    }
    if (io == Io::kTimeout) {
      // The reply may still come; the stream is out of step, so this connection is done.
      const std::string goodbye = goodbye_frame();
      (void)::send(fd_.get(), goodbye.data(), goodbye.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      fd_ = UniqueFd();
      broken_ = absl::UnavailableError(absl::StrFormat(
          "the connection to the rendezvous at %s was closed after rank 0 did not answer a %s "
          "within %s",
          where_, op, format_duration(timeout + kBackstop)));
      return absl::DeadlineExceededError(
          absl::StrFormat("rendezvous %s: rank 0's rendezvous at %s did not answer within %s "
                          "(rank 0 may be stuck or overloaded)",
                          op, where_, format_duration(timeout + kBackstop)));
    }
    fd_ = UniqueFd();
    broken_ = lost_server(error);
    return broken_;
  }

  // A kTimeout or kLost reply as the error it stands for.
  absl::Status failed(FrameReader& r, Reply type, milliseconds timeout, std::string_view op,
                      const std::vector<std::string>& keys) {
    const std::vector<int> ranks = r.ints();
    std::vector<std::string> absent = r.strs();
    if (!r.complete()) return malformed(op);
    if (absent.empty()) absent = keys;
    if (type == Reply::kTimeout) {
      std::string message = absl::StrFormat("timed out after %s waiting for %s at %s",
                                            format_duration(timeout), format_keys(absent), where_);
      if (!ranks.empty()) {
        message += absl::StrFormat(
            "; %s never connected to the rendezvous: did %s start, with the same "
            "MASTER_ADDR/MASTER_PORT?",
            format_ranks(ranks), ranks.size() == 1 ? "it" : "they");
      }
      return absl::DeadlineExceededError(message);
    }
    const bool one = ranks.size() == 1;
    return absl::UnavailableError(absl::StrFormat(
        "%s lost %s connection to the rendezvous (%s process%s exited or %s killed) while rank "
        "%d waited for %s at %s",
        format_ranks(ranks), one ? "its" : "their", one ? "its" : "their", one ? "" : "es",
        one ? "was" : "were", options_.rank, format_keys(absent), where_));
  }

  // Checks the reply type; an error reply becomes its status.
  absl::StatusOr<FrameReader> expect(const std::string& body, Reply want, std::string_view op) {
    FrameReader r(body);
    const auto type = static_cast<Reply>(r.u8());
    if (type == want) return r;
    if (type == Reply::kError) {
      const auto code = static_cast<absl::StatusCode>(r.u32());
      std::string message = r.str();
      if (r.complete() && code != absl::StatusCode::kOk) return absl::Status(code, message);
    }
    return malformed(op);
  }

  absl::Status malformed(std::string_view op) {
    return absl::InternalError(absl::StrFormat(
        "rendezvous %s: the reply of rank 0's rendezvous at %s is malformed: run the same strata "
        "on every rank",
        op, where_));
  }

  absl::Status lost_server(int error) const {
    return absl::UnavailableError(absl::StrFormat(
        "lost the connection to the rendezvous at %s served by rank 0: rank 0 exited or was "
        "killed%s",
        where_, error == 0 ? "" : absl::StrFormat(" (%s)", std::strerror(error))));
  }

  const Options options_;
  const std::string where_;
  const std::string local_address_;
  absl::Mutex mu_;
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // once not ok, every call returns it
  bool skip_goodbye_ ABSL_GUARDED_BY(mu_) = false;
};

// One attempt to open a TCP connection to `ai` before `deadline`; -1 (errno set) on failure.
UniqueFd connect_once(const addrinfo* ai, Clock::time_point deadline) {
  UniqueFd fd(
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  if (!fd) return fd;
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return UniqueFd();
    pollfd p{fd.get(), POLLOUT, 0};
    int ready = 0;
    do {
      ready = ::poll(&p, 1, poll_timeout_ms(deadline));
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) {
      errno = ETIMEDOUT;
      return UniqueFd();
    }
    int error = 0;
    socklen_t length = sizeof error;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
      errno = error;
      return UniqueFd();
    }
  }
  if (!configure_socket(fd.get())) return UniqueFd();
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::connect(const Options& options) {
  const std::string where = endpoint(options.host, options.port);
  const milliseconds timeout = clamp_timeout(options.timeout);
  const Clock::time_point deadline = Clock::now() + timeout;
  const auto unreachable = [&](const std::string& why) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "could not reach the rendezvous at %s (rank 0) within %s: is rank 0 running, and are "
        "MASTER_ADDR/MASTER_PORT right? (last error: %s)",
        where, format_duration(timeout), why));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string service = absl::StrFormat("%u", options.port);
  milliseconds backoff = kFirstBackoff;
  std::string last_error = "none";
  for (;;) {
    addrinfo* raw = nullptr;
    const int rc = ::getaddrinfo(options.host.c_str(), service.c_str(), &hints, &raw);
    const AddrInfoList list(raw);
    if (rc != 0 && rc != EAI_AGAIN) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "MASTER_ADDR='%s' does not resolve (%s): set it to the host name or IP address of rank "
          "0's machine",
          options.host, rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc)));
    }
    if (rc == EAI_AGAIN && Clock::now() >= deadline) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "MASTER_ADDR='%s' did not resolve within %s (%s): set it to the host name or IP address "
          "of rank 0's machine",
          options.host, format_duration(timeout), gai_strerror(rc)));
    }
    for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
      UniqueFd fd = connect_once(ai, deadline);
      if (!fd) {
        last_error = std::strerror(errno);
        continue;
      }
      // Greet: the server checks rank and world size.
      const std::string hello = FrameWriter()
                                    .u8(static_cast<uint8_t>(Request::kHello))
                                    .u32(kMagic)
                                    .u32(kVersion)
                                    .i32(options.rank)
                                    .i32(options.world_size)
                                    .finish();
      const Clock::time_point hello_deadline = std::max(deadline, Clock::now()) + kBackstop;
      int error = 0;
      std::string body;
      Io io = send_all(fd.get(), hello, hello_deadline, error);
      if (io == Io::kOk) io = recv_frame(fd.get(), body, hello_deadline, error);
      if (io == Io::kTimeout) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "the process listening at %s accepted the connection but did not answer the "
            "rendezvous greeting within %s: is MASTER_PORT the port of rank 0's rendezvous?",
            where, format_duration(timeout + kBackstop)));
      }
      if (io == Io::kClosed) {
        return absl::UnavailableError(absl::StrFormat(
            "lost the connection to the rendezvous at %s served by rank 0 during the greeting: "
            "rank 0 exited or was killed, or something else listens on MASTER_PORT",
            where));
      }
      FrameReader r(body);
      const auto type = static_cast<Reply>(r.u8());
      if (type == Reply::kError) {
        const auto code = static_cast<absl::StatusCode>(r.u32());
        const std::string message = r.str();
        if (r.complete() && code != absl::StatusCode::kOk) return absl::Status(code, message);
      }
      if (type != Reply::kOk || !r.complete()) {
        return absl::InternalError(absl::StrFormat(
            "the rendezvous at %s answered the greeting with a malformed reply: run the same "
            "strata on every rank",
            where));
      }
      sockaddr_storage local{};
      socklen_t length = sizeof local;
      std::string address;
      if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length) == 0) {
        address = numeric_host(reinterpret_cast<const sockaddr*>(&local), length);
      }
      return std::unique_ptr<TcpStore>(
          std::make_unique<Client>(options, std::move(fd), std::move(address)));
    }
    const auto now = Clock::now();
    if (now >= deadline) return unreachable(last_error);
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

namespace testing {

void drop_without_goodbye(std::unique_ptr<TcpStore> store) {
  if (auto* client = dynamic_cast<Client*>(store.get())) client->drop_without_goodbye();
}

}  // namespace testing
}  // namespace strata
