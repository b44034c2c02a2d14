// The rendezvous store's test rig: a server on 127.0.0.1 (port 0: the system picks a free one)
// and clients of it, for tcp_store_test.cc and tcp_store_protocol_test.cc.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <memory>

#include "strata/comm/tcp_store.h"

namespace strata::testing {

inline std::unique_ptr<TcpStoreServer> start_server(int world_size) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, world_size);
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  REQUIRE((*server)->port() != 0);
  return std::move(*server);
}

inline TcpStore::Options options_for(uint16_t port, int rank, int world_size,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  TcpStore::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  o.rank = rank;
  o.world_size = world_size;
  o.timeout = timeout;
  return o;
}

inline std::unique_ptr<TcpStore> connect(
    uint16_t port, int rank, int world_size,
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = TcpStore::connect(options_for(port, rank, world_size, timeout));
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  return std::move(*store);
}

}  // namespace strata::testing
