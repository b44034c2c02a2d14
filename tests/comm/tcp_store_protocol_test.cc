// The rendezvous store's wire protocol under bad input: raw sockets send bytes that are not
// strata's (foreign greetings, unknown types, lengths out of range, random garbage, requests cut
// short); the server closes that connection, loses a greeted rank that misbehaved, and keeps
// serving the others. No timed assertions: each read is bounded by its own timeout.
#include "comm/tcp_store_protocol.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "config/log_capture.h"
#include "strata/base/unique_fd.h"
#include "strata/comm/tcp_store.h"
#include "tcp_store_fixture.h"

namespace strata {
namespace {

using testing::connect;
using testing::start_server;

UniqueFd raw_connect(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  return fd;
}

void send_raw(int fd, const std::string& bytes) {
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(bytes.size()));
}

// Reads until the server closes the connection; false if it is still open after 60 s.
bool closed_by_server(int fd, std::string* received = nullptr) {
  char buffer[4096];
  for (int i = 0; i < 600; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) return true;
    if (received != nullptr) received->append(buffer, static_cast<size_t>(n));
  }
  return false;
}

std::string hello(int rank, int world_size, uint32_t magic = tcp_store::kMagic) {
  return tcp_store::FrameWriter()
      .u8(static_cast<uint8_t>(tcp_store::Request::kHello))
      .u32(magic)
      .u32(tcp_store::kVersion)
      .i32(rank)
      .i32(world_size)
      .finish();
}

TEST_CASE("rendezvous: malformed bytes close that connection and the server keeps serving",
          "[tcp_store]") {
  using tcp_store::FrameWriter;
  using tcp_store::Request;
  testing::LogCapture log;
  auto server = start_server(2);
  const uint16_t port = server->port();
  auto good = connect(port, 0, 2);
  REQUIRE(good->set("k", "v").ok());
  int closed_by_protocol_error = 0;

  const std::vector<std::string> before_hello = {
      "GET / HTTP/1.0\r\n\r\n",         // a 542 MB length
      std::string("\0\0\0\0", 4),       // an empty message
      FrameWriter().u8(0x7f).finish(),  // unknown type
      FrameWriter().u8(static_cast<uint8_t>(Request::kSet)).str("k").str("x").finish(),  // no hello
      hello(1, 2, 0x12345678),  // not strata's greeting
  };
  for (const std::string& bytes : before_hello) {
    UniqueFd fd = raw_connect(port);
    send_raw(fd.get(), bytes);
    CHECK(closed_by_server(fd.get()));
    ++closed_by_protocol_error;
  }
  // A greeting cut short, then end of stream: closed, without a complaint (nothing malformed
  // arrived).
  {
    UniqueFd fd = raw_connect(port);
    send_raw(fd.get(), hello(1, 2).substr(0, 9));
    ::shutdown(fd.get(), SHUT_WR);
    CHECK(closed_by_server(fd.get()));
  }
  // Random garbage, then end of stream. The server complains when a whole message arrived or
  // its length is out of range (1 byte to 64 MiB); a partial one just ends with the stream.
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    std::string bytes(1 + rng() % 300, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
    if (i % 2 == 0 && bytes.size() > 4) {  // a plausible length for half of them
      const uint32_t length = static_cast<uint32_t>(rng() % (2 * (bytes.size() - 4)) + 1);
      for (int b = 0; b < 4; ++b)
        bytes[static_cast<size_t>(b)] = static_cast<char>(length >> (8 * b));
    }
    UniqueFd fd = raw_connect(port);
    send_raw(fd.get(), bytes);
    ::shutdown(fd.get(), SHUT_WR);
    CHECK(closed_by_server(fd.get()));
    if (bytes.size() >= 4) {
      const uint32_t length = tcp_store::frame_length(bytes);
      if (length == 0 || length > tcp_store::kMaxFrameBytes || bytes.size() >= 4 + length) {
        ++closed_by_protocol_error;
      }
    }
  }
  CHECK(*good->get("k") == "v");
  CHECK(good->lost_ranks()->empty());  // none of them had greeted

  // A greeted rank 1 that then sends a malformed request: closed, and its rank lost.
  {
    UniqueFd fd = raw_connect(port);
    send_raw(fd.get(), hello(1, 2));
    std::string reply;
    // A string claiming 100 bytes that are not there, then a list claiming 4 billion keys.
    send_raw(fd.get(), FrameWriter().u8(static_cast<uint8_t>(Request::kSet)).u32(100).finish());
    CHECK(closed_by_server(fd.get(), &reply));
    CHECK(reply.size() == 5);  // the greeting's kOk, nothing more
    ++closed_by_protocol_error;
  }
  {
    UniqueFd fd = raw_connect(port);
    send_raw(fd.get(), hello(1, 2));
    send_raw(
        fd.get(),
        FrameWriter().u8(static_cast<uint8_t>(Request::kWait)).u32(0xffffffffu).i64(1000).finish());
    CHECK(closed_by_server(fd.get()));
    ++closed_by_protocol_error;
  }
  CHECK(*good->lost_ranks() == std::vector<int>{1});
  CHECK(*good->get("k") == "v");
  REQUIRE(good->set("k2", "v2").ok());
  CHECK(*good->get("k2") == "v2");

  server.reset();  // joins the server thread: its log lines are all written
  CHECK(static_cast<int>(log.matching("closing the connection from").size()) ==
        closed_by_protocol_error);
  CHECK(log.matching("rank 1 lost its connection").size() == 1);
}

}  // namespace
}  // namespace strata
