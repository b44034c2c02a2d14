#include "tcp_store_protocol.h"

#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <climits>
#include <cstring>

namespace strata::tcp_store {

FrameWriter& FrameWriter::u8(uint8_t v) {
  bytes_.push_back(static_cast<char>(v));
  return *this;
}

FrameWriter& FrameWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}

FrameWriter& FrameWriter::i64(int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}

FrameWriter& FrameWriter::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  bytes_.append(s);
  return *this;
}

FrameWriter& FrameWriter::strs(const std::vector<std::string>& list) {
  u32(static_cast<uint32_t>(list.size()));
  for (const std::string& s : list) str(s);
  return *this;
}

FrameWriter& FrameWriter::ints(const std::vector<int>& list) {
  u32(static_cast<uint32_t>(list.size()));
  for (int v : list) i32(v);
  return *this;
}

std::string FrameWriter::finish() {
  const auto length = static_cast<uint32_t>(bytes_.size() - kHeaderBytes);
  for (size_t i = 0; i < kHeaderBytes; ++i) {
    bytes_[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  }
  return std::move(bytes_);
}

bool FrameReader::take(size_t n, const char** out) {
  if (!ok_ || body_.size() - pos_ < n) {
    ok_ = false;
    return false;
  }
  *out = body_.data() + pos_;
  pos_ += n;
  return true;
}

uint8_t FrameReader::u8() {
  const char* p = nullptr;
  return take(1, &p) ? static_cast<uint8_t>(*p) : 0;
}

uint32_t FrameReader::u32() {
  const char* p = nullptr;
  if (!take(4, &p)) return 0;
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

int64_t FrameReader::i64() {
  const char* p = nullptr;
  if (!take(8, &p)) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return static_cast<int64_t>(v);
}

std::string FrameReader::str() {
  const uint32_t n = u32();
  const char* p = nullptr;
  if (!take(n, &p)) return {};
  return std::string(p, n);
}

std::vector<std::string> FrameReader::strs() {
  const uint32_t n = u32();
  std::vector<std::string> out;
  // Each string needs at least its 4-byte length: a larger count is malformed, not a huge
  // allocation.
  if (!ok_ || n > (body_.size() - pos_) / 4) {
    ok_ = false;
    return out;
  }
  out.reserve(n);
  for (uint32_t i = 0; i < n && ok_; ++i) out.push_back(str());
  return out;
}

std::vector<int> FrameReader::ints() {
  const uint32_t n = u32();
  std::vector<int> out;
  if (!ok_ || n > (body_.size() - pos_) / 4) {
    ok_ = false;
    return out;
  }
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(i32());
  return out;
}

uint32_t frame_length(std::string_view header) {
  uint32_t v = 0;
  for (size_t i = 0; i < kHeaderBytes; ++i) {
    v |= static_cast<uint32_t>(static_cast<uint8_t>(header[i])) << (8 * i);
  }
  return v;
}

std::string endpoint(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos) return absl::StrFormat("[%s]:%u", host, port);
  return absl::StrFormat("%s:%u", host, port);
}

std::string numeric_host(const sockaddr* addr, socklen_t length) {
  char text[NI_MAXHOST] = {};
  if (getnameinfo(addr, length, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return text;
}

std::string format_duration(std::chrono::milliseconds d) {
  const int64_t ms = d.count();
  if (ms < 1000) return absl::StrFormat("%d ms", ms);
  if (ms % 1000 == 0) return absl::StrFormat("%d s", ms / 1000);
  std::string s = absl::StrFormat("%.3f", static_cast<double>(ms) / 1000.0);
  while (s.back() == '0') s.pop_back();
  return s + " s";
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += absl::StrFormat("%d", ranks[i]);
  }
  return out;
}

std::string format_keys(const std::vector<std::string>& keys) {
  std::string out = keys.size() == 1 ? "key " : "keys ";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) out += ", ";
    out += absl::StrFormat("'%s'", keys[i]);
  }
  return out;
}

std::chrono::milliseconds clamp_timeout(std::chrono::milliseconds timeout) {
  if (timeout < std::chrono::milliseconds(0)) return std::chrono::milliseconds(0);
  return timeout > kMaxTimeout ? kMaxTimeout : timeout;
}

int poll_timeout_ms(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (deadline <= now) return 0;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

bool configure_socket(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return false;
  const int one = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0;
}

}  // namespace strata::tcp_store
