// The rendezvous wire format and the socket helpers its server and client share (private to
// comm/).
//
// A frame is a 4-byte little-endian body length, then the body: one type byte and the fields of
// that type. Integers are little-endian; a string is a u32 length and its bytes; a list is a u32
// count and its items. A client has one request in flight at a time; the server answers each
// request with exactly one reply, in order (a goodbye gets none).
//
//   request           fields                                   replies
//   kHello            u32 magic, u32 version, i32 rank, i32 world_size   kOk | kError
//   kSet              key, value                               kOk
//   kGet              key, i64 timeout_ms                      kValue | kTimeout | kLost
//   kWait             keys, i64 timeout_ms                     kOk | kTimeout | kLost
//   kCheck            keys                                     kBool
//   kAdd              key, i64 delta                           kInt | kError
//   kLostRanks        -                                        kRanks
//   kGoodbye          -                                        (none: the client closes)
//
//   kTimeout carries the ranks that never connected and the keys still missing; kLost the lost
//   ranks and the keys still missing; kError a u32 absl::StatusCode and a message.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tcp_store {

using Clock = std::chrono::steady_clock;

inline constexpr uint32_t kMagic = 0x53525453;  // "STRS"
inline constexpr uint32_t kVersion = 1;
// Bodies above this are malformed (rendezvous values are ids and addresses, not tensors).
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
inline constexpr size_t kHeaderBytes = 4;
// A timeout is clamped to this, so that deadlines never overflow.
inline constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 365);

enum class Request : uint8_t {
  kHello = 1,
  kSet,
  kGet,
  kWait,
  kCheck,
  kAdd,
  kLostRanks,
  kGoodbye,
};

enum class Reply : uint8_t {
  kOk = 1,
  kValue,
  kBool,
  kInt,
  kRanks,
  kTimeout,
  kLost,
  kError,
};

// Builds one frame.
class FrameWriter {
 public:
  FrameWriter() : bytes_(kHeaderBytes, '\0') {}
  FrameWriter& u8(uint8_t v);
  FrameWriter& u32(uint32_t v);
  FrameWriter& i32(int32_t v) { return u32(static_cast<uint32_t>(v)); }
  FrameWriter& i64(int64_t v);
  FrameWriter& str(std::string_view s);
  FrameWriter& strs(const std::vector<std::string>& list);
  FrameWriter& ints(const std::vector<int>& list);
  // The frame, its length header filled in (the writer is spent).
  std::string finish();

 private:
  std::string bytes_;
};

// Reads the fields of one body; any read past the end (or a count that cannot fit) makes it
// fail, and every later read returns zero values.
class FrameReader {
 public:
  explicit FrameReader(std::string_view body) : body_(body) {}
  uint8_t u8();
  uint32_t u32();
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64();
  std::string str();
  std::vector<std::string> strs();
  std::vector<int> ints();
  // True when every read so far fit and the whole body was read.
  bool complete() const { return ok_ && pos_ == body_.size(); }
  bool ok() const { return ok_; }

 private:
  bool take(size_t n, const char** out);
  std::string_view body_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// The body length announced by a frame header (its first 4 bytes).
uint32_t frame_length(std::string_view header);

// getaddrinfo's list, freed on destruction.
struct AddrInfoDeleter {
  void operator()(addrinfo* list) const { freeaddrinfo(list); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// "host:port", or "[host]:port" for an IPv6 address.
std::string endpoint(std::string_view host, uint16_t port);
// The numeric text of a socket address ("127.0.0.1", "::1"); empty when it has none.
std::string numeric_host(const sockaddr* addr, socklen_t length);
// "300 ms", "5 s", "1.5 s".
std::string format_duration(std::chrono::milliseconds d);
// "rank 2", "ranks 2, 3".
std::string format_ranks(const std::vector<int>& ranks);
// "key 'x'", "keys 'x', 'y'".
std::string format_keys(const std::vector<std::string>& keys);
// Clamps a timeout to [0, kMaxTimeout].
std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds timeout);
// Milliseconds to `deadline` for poll(): 0 once passed, rounded up otherwise, at most INT_MAX.
int poll_timeout_ms(Clock::time_point deadline);
// Sets O_NONBLOCK and TCP_NODELAY; false with errno on failure.
bool configure_socket(int fd);

}  // namespace strata::tcp_store
