// One GPU per rank, checked before NCCL is asked (comm/gpu_assignment.h): the verdict from the
// ranks' identities, and their exchange through a real rendezvous by ranks on threads of this
// process with made-up identities (no GPU needed).
#include "comm/gpu_assignment.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm/tcp_store.h"

namespace strata {
namespace {

using comm_internal::GpuIdentity;
using namespace std::chrono_literals;

GpuIdentity gpu(const std::string& host, const std::string& bus, int ordinal) {
  GpuIdentity identity;
  identity.machine = host + "/boot-1";
  identity.host = host;
  identity.bus_id = bus;
  identity.ordinal = ordinal;
  return identity;
}

constexpr const char* kFix =
    ": NCCL needs one GPU per rank: give each rank its own (LOCAL_RANK picks it) or set "
    "STRATA_COMM_BACKEND=gloo";

TEST_CASE("One GPU per rank: ranks that share one are named, with the fix", "[comm][gpu]") {
  const GpuIdentity a0 = gpu("node7", "0000:3b:00.0", 0);
  const GpuIdentity a1 = gpu("node7", "0000:5e:00.0", 1);
  CHECK(comm_internal::check_one_gpu_per_rank({}).ok());
  CHECK(comm_internal::check_one_gpu_per_rank({a0}).ok());
  CHECK(comm_internal::check_one_gpu_per_rank({a0, a1}).ok());
  // The same bus id on another machine is another GPU; an unknown one is never shared.
  CHECK(comm_internal::check_one_gpu_per_rank({a0, gpu("node8", "0000:3b:00.0", 0)}).ok());
  CHECK(comm_internal::check_one_gpu_per_rank({gpu("node7", "", 0), gpu("node7", "", 0)}).ok());

  // Three ranks launched on a machine with one GPU (the first GPU run: NCCL said "invalid
  // usage ... check the network").
  const absl::Status three = comm_internal::check_one_gpu_per_rank({a0, a0, a0});
  REQUIRE_FALSE(three.ok());
  CHECK(three.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(three.message()) ==
        std::string("ranks 0, 1 and 2 share GPU 0 (PCI 0000:3b:00.0) on host node7") + kFix);

  // Two machines, each with a pair of ranks on one GPU; the others fine. In rank order.
  const GpuIdentity b0 = gpu("node8", "0000:3b:00.0", 0);
  const absl::Status pairs =
      comm_internal::check_one_gpu_per_rank({b0, a1, a0, b0, a1, gpu("node8", "0000:86:00.0", 2)});
  REQUIRE_FALSE(pairs.ok());
  CHECK(std::string(pairs.message()) ==
        std::string("ranks 0 and 3 share GPU 0 (PCI 0000:3b:00.0) on host node8; ranks 1 and 4 "
                    "share GPU 1 (PCI 0000:5e:00.0) on host node7") +
            kFix);
}

TEST_CASE("GPU identities travel as text, a malformed one names the build", "[comm][gpu]") {
  const GpuIdentity mine = GpuIdentity::on_this_machine("0000:3b:00.0", 3);
  CHECK_FALSE(mine.host.empty());
  CHECK(mine.machine.rfind(mine.host + "/", 0) == 0);
  const absl::StatusOr<GpuIdentity> back = GpuIdentity::decode(mine.encode());
  REQUIRE(back.ok());
  CHECK(back->machine == mine.machine);
  CHECK(back->host == mine.host);
  CHECK(back->bus_id == "0000:3b:00.0");
  CHECK(back->ordinal == 3);
  for (const char* bad : {"", "a\tb\tc", "a\tb\tc\tx", "a\tb\tc\t1\te"}) {
    const absl::StatusOr<GpuIdentity> decoded = GpuIdentity::decode(bad);
    REQUIRE_FALSE(decoded.ok());
    CHECK(std::string(decoded.status().message()).find("is every rank the same strata build") !=
          std::string::npos);
  }
}

struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;
  explicit Rendezvous(int world_size) {
    auto started = TcpStoreServer::start("127.0.0.1", 0, world_size);
    REQUIRE(started.ok());
    server = *std::move(started);
  }
  std::unique_ptr<TcpStore> connect(int rank, int world_size, std::chrono::milliseconds timeout) {
    TcpStore::Options options;
    options.port = server->port();
    options.rank = rank;
    options.world_size = world_size;
    options.timeout = timeout;
    auto store = TcpStore::connect(options);
    REQUIRE(store.ok());
    return *std::move(store);
  }
};

TEST_CASE("GPU identities: every rank reads the same table and reaches the same verdict",
          "[comm][gpu]") {
  constexpr int kWorld = 3;
  Rendezvous rendezvous(kWorld);
  // Ranks 0 and 2 on one GPU of node7, rank 1 on another.
  const std::vector<GpuIdentity> posted = {gpu("node7", "0000:3b:00.0", 0),
                                           gpu("node7", "0000:5e:00.0", 1),
                                           gpu("node7", "0000:3b:00.0", 0)};
  std::vector<std::unique_ptr<TcpStore>> stores;
  for (int r = 0; r < kWorld; ++r) stores.push_back(rendezvous.connect(r, kWorld, 30s));
  std::vector<absl::StatusOr<std::vector<GpuIdentity>>> tables;
  for (int r = 0; r < kWorld; ++r) tables.emplace_back(absl::UnknownError("not run"));
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < kWorld; ++r) {
      ranks.emplace_back([&, r] {
        tables[r] = comm_internal::exchange_gpu_identities(*stores[r], r, kWorld, posted[r]);
      });
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << tables[r].status());
    REQUIRE(tables[r].ok());
    REQUIRE(tables[r]->size() == kWorld);
    for (int q = 0; q < kWorld; ++q) {
      CHECK((*tables[r])[q].encode() == posted[q].encode());
    }
    const absl::Status verdict = comm_internal::check_one_gpu_per_rank(*tables[r]);
    CHECK(std::string(verdict.message()) ==
          std::string("ranks 0 and 2 share GPU 0 (PCI 0000:3b:00.0) on host node7") + kFix);
  }
}

TEST_CASE("GPU identities: a rank that never posts its GPU is a bounded error naming it",
          "[comm][gpu]") {
  Rendezvous rendezvous(2);
  auto rank0 = rendezvous.connect(0, 2, 300ms);
  auto rank1 = rendezvous.connect(1, 2, 300ms);  // connected, but never posts
  const absl::StatusOr<std::vector<GpuIdentity>> table =
      comm_internal::exchange_gpu_identities(*rank0, 0, 2, gpu("node7", "0000:3b:00.0", 0));
  REQUIRE_FALSE(table.ok());
  INFO(table.status());
  CHECK(table.status().code() == absl::StatusCode::kDeadlineExceeded);
  const std::string message(table.status().message());
  CHECK(message.find("rank 0 of 2: the ranks' GPUs were not all known before NCCL's set-up") !=
        std::string::npos);
  CHECK(message.find("strata/gpu/1") != std::string::npos);
}

}  // namespace
}  // namespace strata
