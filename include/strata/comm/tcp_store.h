// The rendezvous: a small key-value store served over TCP by rank 0 (MASTER_ADDR:MASTER_PORT),
// like torchrun's TCPStore. Ranks exchange addresses and ids through it (Gloo's pair addresses,
// NCCL's unique id), and it is the side channel that turns a failure into one clear error on
// every rank: the server knows which ranks connected and which connections closed without a
// goodbye (a dead process), and any rank can post a failure for the others to read.
//
// Every call is bounded by a timeout; waits also end early, with an error naming the rank, when
// a rank's connection is lost. Values are bytes; keys are text.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class TcpStoreServer {
 public:
  // Listens on `host`:`port` (port 0: a free port, see port()) for `world_size` ranks. A port in
  // use is a FailedPrecondition error naming it and the fix.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> start(const std::string& host,
                                                               uint16_t port, int world_size);
  virtual ~TcpStoreServer() = default;  // stops serving and closes every connection
  virtual uint16_t port() const = 0;
  // Waits (get, wait) parked now, answered neither by their keys, their deadline nor a lost
  // rank yet: lets a test see that a get is blocked before it sets the key. Thread-safe.
  virtual int parked_waits() const = 0;
};

// One connection to the rendezvous. Thread-safe: calls from several threads take turns (one
// request in flight per TcpStore); a rank that needs a second, independent waiter (a watcher for
// failures) connects a second TcpStore with the same rank.
class TcpStore {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    uint16_t port = 0;
    int rank = 0;
    int world_size = 1;
    // Bounds connect (retried while the server is not up yet) and every wait without its own.
    std::chrono::milliseconds timeout = std::chrono::seconds(300);
  };

  static absl::StatusOr<std::unique_ptr<TcpStore>> connect(const Options& options);
  // Says goodbye (a clean exit, not a lost rank) and closes the connection.
  virtual ~TcpStore() = default;

  virtual absl::Status set(std::string_view key, std::string_view value) = 0;
  // Waits until `key` is set, then returns its value. DeadlineExceeded after the timeout (naming
  // the key and the ranks that never connected, if any); Unavailable as soon as a rank is lost.
  virtual absl::StatusOr<std::string> get(std::string_view key) = 0;
  virtual absl::StatusOr<std::string> get(std::string_view key,
                                          std::chrono::milliseconds timeout) = 0;
  virtual absl::Status wait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) = 0;
  // Whether every key is set, without waiting.
  virtual absl::StatusOr<bool> check(const std::vector<std::string>& keys) = 0;
  // Adds `delta` to the integer at `key` (0 when unset) and returns the sum.
  virtual absl::StatusOr<int64_t> add(std::string_view key, int64_t delta) = 0;
  // Ranks whose connection closed without a goodbye (their process died or was killed), in
  // rank order.
  virtual absl::StatusOr<std::vector<int>> lost_ranks() = 0;
  // This end's IP address: the interface that reaches the server, which peers can reach too.
  virtual std::string local_address() const = 0;
  virtual const Options& options() const = 0;
};

}  // namespace strata
