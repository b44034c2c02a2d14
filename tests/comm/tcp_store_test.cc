// The rendezvous store: a server and several clients on threads of one process (port 0), their
// contents checked; waits that time out, ranks that vanish, a server that goes away, a port in
// use, nobody listening, a peer that never answers, a world size or rank that does not fit, and
// rank 0 serving until the others have left. Malformed bytes are in tcp_store_protocol_test.cc.
// No timed assertions: every test counts or compares, and each wait is bounded by its own
// timeout.
#include "strata/comm/tcp_store.h"

#include <absl/strings/str_format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/job_monitor.h"
#include "comm/rank_processes.h"
#include "strata/base/unique_fd.h"
#include "strata/testing/tcp_store_testing.h"
#include "tcp_store_fixture.h"

namespace strata {
namespace {

using Catch::Matchers::Contains;
using testing::connect;
using testing::options_for;
using testing::start_server;
using namespace std::chrono_literals;

std::string text(const absl::Status& s) { return std::string(s.message()); }

// Waits (a bounded number of short sleeps: a condition, not a timing) until the server has
// `n` waits parked.
void await_parked(const TcpStoreServer& server, int n) {
  for (int i = 0; i < 60000 && server.parked_waits() != n; ++i) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(server.parked_waits() == n);
}

// Rank `rank`'s value for round `round`: random bytes (NULs included), 0 to 4 KiB.
std::string value_for(int rank, int round) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 7919 + round));
  std::string v(rng() % 4097, '\0');
  for (char& c : v) c = static_cast<char>(rng() & 0xff);
  return v;
}

std::string key_for(int rank, int round) { return absl::StrFormat("value/%d/%d", rank, round); }

TEST_CASE("rendezvous: ranks exchange random values through set get wait check and add",
          "[tcp_store]") {
  constexpr int kRanks = 4;
  constexpr int kRounds = 25;
  auto server = start_server(kRanks);
  const uint16_t port = server->port();
  std::vector<std::vector<std::string>> errors(kRanks);
  std::vector<std::jthread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto& err = errors[static_cast<size_t>(rank)];
      auto connected = TcpStore::connect(options_for(port, rank, kRanks));
      if (!connected.ok()) {
        err.push_back(connected.status().ToString());
        return;
      }
      TcpStore& store = **connected;
      std::mt19937 rng(static_cast<uint32_t>(100 + rank));
      for (int round = 0; round < kRounds; ++round) {
        if (auto s = store.set(key_for(rank, round), value_for(rank, round)); !s.ok()) {
          err.push_back(s.ToString());
        }
        // Another rank's value of this round: blocks until that rank has set it.
        const int other = static_cast<int>(rng() % kRanks);
        auto got = store.get(key_for(other, round));
        if (!got.ok()) {
          err.push_back(got.status().ToString());
        } else if (*got != value_for(other, round)) {
          err.push_back(
              absl::StrFormat("rank %d round %d: wrong value from rank %d", rank, round, other));
        }
        if (auto sum = store.add(absl::StrFormat("count/%d", round), rank + 1); !sum.ok()) {
          err.push_back(sum.status().ToString());
        }
        std::vector<std::string> keys;
        for (int r = 0; r < kRanks; ++r) keys.push_back(key_for(r, round));
        if (auto s = store.wait(keys, 60s); !s.ok()) err.push_back(s.ToString());
        auto all = store.check(keys);
        if (!all.ok() || !*all) err.push_back("check after wait did not see every key");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    INFO("rank " << rank);
    CHECK(errors[static_cast<size_t>(rank)].empty());
    for (const auto& e : errors[static_cast<size_t>(rank)]) UNSCOPED_INFO(e);
  }
  // Every add arrived once: each round's counter is 1 + 2 + 3 + 4.
  auto store = connect(port, 0, kRanks);
  for (int round = 0; round < kRounds; ++round) {
    auto sum = store->add(absl::StrFormat("count/%d", round), 0);
    REQUIRE(sum.ok());
    CHECK(*sum == 10);
    auto v = store->get(key_for(3, round));
    REQUIRE(v.ok());
    CHECK(*v == value_for(3, round));
  }
  auto absent = store->check({key_for(0, 0), "never-set"});
  REQUIRE(absent.ok());
  CHECK_FALSE(*absent);
  auto empty = store->check({});
  REQUIRE(empty.ok());
  CHECK(*empty);
  // Values are bytes: an empty one, and one of 1 MiB.
  REQUIRE(store->set("empty", "").ok());
  CHECK(*store->get("empty") == "");
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 24);
  REQUIRE(store->set("big", big).ok());
  CHECK(*store->get("big") == big);
  // set overwrites.
  REQUIRE(store->set("big", "small").ok());
  CHECK(*store->get("big") == "small");
  CHECK(store->local_address() == "127.0.0.1");
  CHECK(store->options().rank == 0);
}

TEST_CASE("rendezvous: concurrent adds from 4 threads (two sharing one store) sum correctly",
          "[tcp_store]") {
  constexpr int kThreads = 4;
  constexpr int kAdds = 400;
  auto server = start_server(3);
  const uint16_t port = server->port();
  auto shared = connect(port, 0, 3);
  auto own1 = connect(port, 1, 3);
  auto own2 = connect(port, 2, 3);
  TcpStore* stores[kThreads] = {shared.get(), shared.get(), own1.get(), own2.get()};
  std::vector<std::vector<int64_t>> tickets(kThreads);
  std::vector<int64_t> deltas(kThreads, 0);
  std::atomic<int> failures{0};
  std::vector<std::jthread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int i = 0; i < kAdds; ++i) {
        auto ticket = stores[t]->add("ticket", 1);
        const int64_t delta = static_cast<int64_t>(rng() % 2001) - 1000;
        auto sum = stores[t]->add("sum", delta);
        if (!ticket.ok() || !sum.ok()) {
          ++failures;
          continue;
        }
        tickets[static_cast<size_t>(t)].push_back(*ticket);
        deltas[static_cast<size_t>(t)] += delta;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  // Every ticket 1..N handed out exactly once.
  std::set<int64_t> all;
  for (const auto& list : tickets) all.insert(list.begin(), list.end());
  CHECK(all.size() == static_cast<size_t>(kThreads * kAdds));
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kThreads * kAdds);
  int64_t expected = 0;
  for (int64_t d : deltas) expected += d;
  auto sum = own1->add("sum", 0);
  REQUIRE(sum.ok());
  CHECK(*sum == expected);
  // add on a key holding text is an error naming the key; the store keeps serving.
  REQUIRE(own2->set("words", "not a number").ok());
  auto bad = own2->add("words", 1);
  CHECK(bad.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(text(bad.status()), Contains("'words'"));
  REQUIRE(own2->set("big", "9223372036854775807").ok());
  CHECK(own2->add("big", 1).status().code() == absl::StatusCode::kOutOfRange);
  CHECK(*own2->add("sum", 0) == expected);
}

TEST_CASE("rendezvous: get and wait block until another thread sets the keys", "[tcp_store]") {
  auto server = start_server(2);
  auto waiter = connect(server->port(), 0, 2);
  auto setter = connect(server->port(), 1, 2);
  for (int round = 0; round < 5; ++round) {
    const std::string key = absl::StrFormat("late/%d", round);
    absl::StatusOr<std::string> got = absl::UnknownError("not run");
    std::jthread t([&] { got = waiter->get(key, 60s); });
    await_parked(*server, 1);  // the get is parked on the server, its key absent
    CHECK_FALSE(*setter->check({key}));
    REQUIRE(setter->set(key, value_for(1, round)).ok());
    t.join();
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    CHECK(*got == value_for(1, round));
    await_parked(*server, 0);
  }
  // A wait for three keys stays parked while two are set, and ends with the third.
  absl::Status waited = absl::UnknownError("not run");
  std::jthread t([&] { waited = waiter->wait({"a", "b", "c"}, 60s); });
  await_parked(*server, 1);
  REQUIRE(setter->set("a", "1").ok());
  REQUIRE(setter->set("b", "2").ok());
  REQUIRE(setter->check({"a", "b"}).value());
  CHECK(server->parked_waits() == 1);
  REQUIRE(setter->set("c", "3").ok());
  t.join();
  CHECK(waited.ok());
  // Keys already present: no waiting at all, even with a zero timeout.
  CHECK(waiter->wait({"a", "b", "c"}, 0ms).ok());
  CHECK(*waiter->get("c", 0ms) == "3");
}

TEST_CASE("rendezvous: a wait that times out names its keys and the ranks that never connected",
          "[tcp_store]") {
  auto server = start_server(4);
  const uint16_t port = server->port();
  const std::string where = absl::StrFormat("127.0.0.1:%u", port);
  auto a = connect(port, 0, 4, 1s);
  auto b = connect(port, 1, 4);

  absl::Status s = a->wait({"x"}, 200ms);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(text(s), Contains("timed out after 200 ms waiting for key 'x' at " + where));
  CHECK_THAT(text(s), Contains("; ranks 2, 3 never connected to the rendezvous: did they start, "
                               "with the same MASTER_ADDR/MASTER_PORT?"));
  // Only the missing keys are named; a get without its own timeout uses the store's.
  REQUIRE(b->set("y", "1").ok());
  s = a->wait({"y", "x", "z"}, 100ms);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(text(s), Contains("waiting for keys 'x', 'z' at"));
  auto got = a->get("x");
  CHECK(got.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(text(got.status()), Contains("timed out after 1 s waiting for key 'x'"));
  got = a->get("x", 0ms);
  CHECK(got.status().code() == absl::StatusCode::kDeadlineExceeded);
  // The connection survives a timeout.
  CHECK(*a->get("y") == "1");

  auto c = connect(port, 2, 4);
  s = a->wait({"x"}, 10ms);
  CHECK_THAT(text(s), Contains("rank 3 never connected"));
  CHECK_THAT(text(s), Contains("did it start"));
  auto d = connect(port, 3, 4);
  s = a->wait({"x"}, 10ms);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(text(s), !Contains("never connected"));
}

TEST_CASE("rendezvous: a rank whose connection drops without a goodbye is lost", "[tcp_store]") {
  auto server = start_server(4);
  const uint16_t port = server->port();
  auto rank0 = connect(port, 0, 4);
  auto rank1 = connect(port, 1, 4);
  auto rank2 = connect(port, 2, 4);
  auto rank2_watcher = connect(port, 2, 4);  // a rank may hold several connections
  auto rank3 = connect(port, 3, 4);
  REQUIRE(rank1->set("before", "ok").ok());
  // A clean exit (the destructor's goodbye) is not a loss.
  rank3.reset();

  absl::Status waited = absl::UnknownError("not run");
  std::jthread t([&] { waited = rank0->wait({"never"}, 60s); });
  await_parked(*server, 1);
  testing::drop_without_goodbye(std::move(rank2));
  t.join();
  CHECK(waited.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(text(waited), Contains("rank 2 lost its connection to the rendezvous (its process "
                                    "exited or was killed)"));
  CHECK_THAT(text(waited), Contains("key 'never'"));
  auto lost = rank1->lost_ranks();
  REQUIRE(lost.ok());
  CHECK(*lost == std::vector<int>{2});
  // Later waits fail at once; keys already set can still be read.
  auto got = rank1->get("never-either", 60s);
  CHECK(got.status().code() == absl::StatusCode::kUnavailable);
  CHECK(*rank1->get("before") == "ok");
  // The rank's other connection still works (its own calls are not refused).
  CHECK(*rank2_watcher->get("before") == "ok");
  // A second rank lost: both named, in rank order.
  testing::drop_without_goodbye(std::move(rank1));
  for (int i = 0; i < 60000; ++i) {
    lost = rank0->lost_ranks();
    if (!lost.ok() || lost->size() == 2) break;
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(lost.ok());
  CHECK(*lost == std::vector<int>{1, 2});
  const absl::Status s = rank0->wait({"never"}, 60s);
  CHECK_THAT(text(s), Contains("ranks 1, 2 lost their connection to the rendezvous (their "
                               "processes exited or were killed)"));
}

TEST_CASE("rendezvous: when the server goes away every call fails naming rank 0", "[tcp_store]") {
  auto server = start_server(2);
  const uint16_t port = server->port();
  const std::string message = absl::StrFormat(
      "lost the connection to the rendezvous at 127.0.0.1:%u served by rank 0: rank 0 exited or "
      "was killed",
      port);
  auto idle = connect(port, 0, 2);
  auto waiting = connect(port, 1, 2);
  REQUIRE(idle->set("k", "v").ok());
  absl::Status waited = absl::UnknownError("not run");
  std::jthread t([&] { waited = waiting->wait({"never"}, 60s); });
  await_parked(*server, 1);
  server.reset();
  t.join();
  CHECK(waited.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(text(waited), Contains(message));
  // A store that was idle finds out on its next call, and every call after.
  for (int i = 0; i < 3; ++i) {
    const absl::Status s = idle->set("k", "v2");
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(text(s), Contains(message));
  }
  CHECK(idle->get("k").status().code() == absl::StatusCode::kUnavailable);
  CHECK(waiting->add("n", 1).status().code() == absl::StatusCode::kUnavailable);
  CHECK(waiting->lost_ranks().status().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("rendezvous: a port in use is refused and a freed port can be served again",
          "[tcp_store]") {
  auto first = start_server(1);
  const uint16_t port = first->port();
  auto second = TcpStoreServer::start("127.0.0.1", port, 1);
  CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(text(second.status()),
             Contains(absl::StrFormat("MASTER_PORT=%u is in use on 127.0.0.1: choose a free port "
                                      "(strata-run picks one) or stop the process holding it",
                                      port)));
  {
    auto store = connect(port, 0, 1);
    REQUIRE(store->set("k", "v").ok());
  }
  first.reset();  // its connections close (TIME_WAIT): SO_REUSEADDR lets the port serve again
  auto again = TcpStoreServer::start("127.0.0.1", port, 1);
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  auto store = connect(port, 0, 1);
  CHECK_FALSE(*store->check({"k"}));  // a fresh store
  CHECK(TcpStoreServer::start("127.0.0.1", 0, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("rendezvous: connect gives up with DeadlineExceeded when nobody listens", "[tcp_store]") {
  uint16_t port = 0;
  {
    auto server = start_server(1);
    port = server->port();
  }
  auto store = TcpStore::connect(options_for(port, 1, 2, 300ms));
  CHECK(store.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(text(store.status()),
             Contains(absl::StrFormat("could not reach the rendezvous at 127.0.0.1:%u (rank 0) "
                                      "within 300 ms: is rank 0 running, and are "
                                      "MASTER_ADDR/MASTER_PORT right?",
                                      port)));
  // A host name that does not resolve names MASTER_ADDR.
  TcpStore::Options o = options_for(port, 1, 2, 300ms);
  o.host = "no-such-host.invalid";
  store = TcpStore::connect(o);
  CHECK(store.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(text(store.status()), Contains("MASTER_ADDR='no-such-host.invalid'"));
  CHECK(TcpStoreServer::start("no-such-host.invalid", 0, 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("rendezvous: connect waits for a server that starts late", "[tcp_store]") {
  uint16_t port = 0;
  {
    auto probe = start_server(1);
    port = probe->port();
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> store = absl::UnknownError("not run");
  std::atomic<bool> started{false};
  std::jthread t([&] {
    started = true;
    store = TcpStore::connect(options_for(port, 1, 2, 60s));
  });
  while (!started) std::this_thread::yield();
  auto server = TcpStoreServer::start("127.0.0.1", port, 2);
  INFO(server.status().ToString());
  REQUIRE(server.ok());
  t.join();
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  REQUIRE((*store)->set("k", "v").ok());
}

TEST_CASE("rendezvous: a peer that accepts but never answers cannot hang connect", "[tcp_store]") {
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(listener);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener.get(), 8) == 0);  // the kernel completes connections; nobody reads
  socklen_t length = sizeof addr;
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  auto store = TcpStore::connect(options_for(ntohs(addr.sin_port), 0, 1, 200ms));
  CHECK(store.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(text(store.status()), Contains("did not answer the rendezvous greeting"));
}

TEST_CASE("rendezvous: a world size or rank that does not fit is refused by name", "[tcp_store]") {
  auto server = start_server(2);
  auto mismatch = TcpStore::connect(options_for(server->port(), 1, 3));
  CHECK(mismatch.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(text(mismatch.status()), Contains("WORLD_SIZE=3"));
  CHECK_THAT(text(mismatch.status()), Contains("WORLD_SIZE=2"));
  auto out_of_range = TcpStore::connect(options_for(server->port(), 2, 2));
  CHECK(out_of_range.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(text(out_of_range.status()), Contains("RANK=2 is out of range for WORLD_SIZE=2"));
  // Neither counts as a rank connecting (or lost).
  auto store = connect(server->port(), 0, 2);
  const absl::Status s = store->wait({"x"}, 10ms);
  CHECK_THAT(text(s), Contains("rank 1 never connected"));
  CHECK(store->lost_ranks()->empty());
}

TEST_CASE("rendezvous: IPv6 and host names", "[tcp_store]") {
  {
    auto server = start_server(1);
    TcpStore::Options o = options_for(server->port(), 0, 1);
    o.host = "localhost";  // may resolve to ::1 first, where nobody listens: the next address
    auto store = TcpStore::connect(o);
    INFO(store.status().ToString());
    REQUIRE(store.ok());
    CHECK((*store)->local_address() == "127.0.0.1");
  }
  auto server = TcpStoreServer::start("::1", 0, 1);
  if (!server.ok()) {
    WARN("no IPv6 loopback here: " << server.status().ToString());
    return;
  }
  TcpStore::Options o = options_for((*server)->port(), 0, 1);
  o.host = "::1";
  auto store = TcpStore::connect(o);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  CHECK((*store)->local_address() == "::1");
  REQUIRE((*store)->set("k6", "v6").ok());
  CHECK(*(*store)->get("k6") == "v6");
  // An error message puts an IPv6 address in brackets.
  CHECK_THAT(text((*store)->wait({"x"}, 0ms)),
             Contains(absl::StrFormat("[::1]:%u", (*server)->port())));
}

LaunchInfo launch_of(int rank, int world_size, uint16_t port) {
  LaunchInfo launch;
  launch.rank = rank;
  launch.world_size = world_size;
  launch.master_port = port;
  launch.launched = true;
  return launch;
}

// After a failure rank 0 exits while the others are still in their post-mortems, reading the
// store to learn who died. Rank 0 must serve until they have left, or the slowest would find the
// server gone and blame rank 0 (a fresh-clone CI run failed on exactly that race).
TEST_CASE("rendezvous: after a rank is lost, rank 0 serves until every other rank has left",
          "[tcp_store]") {
  using comm_internal::JobMonitor;
  const uint16_t port = testing::free_port();
  CommSettings settings;
  settings.timeout = 20s;  // bounds rank 0's wait should a check below fail first
  absl::StatusOr<std::unique_ptr<JobMonitor>> rank0 = absl::UnknownError("not run");
  absl::StatusOr<std::unique_ptr<JobMonitor>> rank2 = absl::UnknownError("not run");
  absl::StatusOr<std::unique_ptr<TcpStore>> rank1 = absl::UnknownError("not run");
  {
    std::jthread t0([&] { rank0 = JobMonitor::join(launch_of(0, 3, port), settings); });
    std::jthread t1([&] { rank1 = TcpStore::connect(options_for(port, 1, 3, 60s)); });
    std::jthread t2([&] { rank2 = JobMonitor::join(launch_of(2, 3, port), settings); });
  }
  INFO(rank0.status().ToString() << " / " << rank1.status().ToString() << " / "
                                 << rank2.status().ToString());
  REQUIRE(rank0.ok());
  REQUIRE(rank1.ok());
  REQUIRE(rank2.ok());
  TcpStore& survivor = (*rank2)->store();

  testing::drop_without_goodbye(*std::move(rank1));
  absl::StatusOr<std::vector<int>> lost = survivor.lost_ranks();
  for (int i = 0; i < 60000 && lost.ok() && lost->empty(); ++i) {
    std::this_thread::sleep_for(1ms);
    lost = survivor.lost_ranks();
  }
  REQUIRE(lost.ok());
  REQUIRE(*lost == std::vector<int>{1});

  // Rank 0 leaves (on a thread: it waits for rank 2) once it has marked itself left.
  std::atomic<bool> rank0_gone{false};
  std::jthread leaving([&] {
    rank0->reset();
    rank0_gone = true;
  });
  absl::StatusOr<int64_t> left = survivor.add("strata/left", 0);
  for (int i = 0; i < 60000 && left.ok() && *left < 1; ++i) {
    std::this_thread::sleep_for(1ms);
    left = survivor.add("strata/left", 0);
  }
  REQUIRE(left.ok());
  REQUIRE(*left == 1);
  // Given the time to stop serving (it stopped at once before the fix), it must not have.
  for (int i = 0; i < 500 && !rank0_gone; ++i) std::this_thread::sleep_for(1ms);
  CHECK_FALSE(rank0_gone);
  lost = survivor.lost_ranks();
  INFO(lost.status().ToString());
  REQUIRE(lost.ok());
  CHECK(*lost == std::vector<int>{1});
  // The survivor leaves: rank 0 is free to go.
  rank2->reset();
  leaving.join();
  CHECK(rank0_gone);
}

}  // namespace
}  // namespace strata
