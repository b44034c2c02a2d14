// The comm floor's pieces that need no peer: launch variables, the call record (descriptions,
// signatures, byte counts, mismatch messages) and the host reductions.
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "comm/collective_call.h"
#include "comm/host_reduce.h"
#include "strata/comm/communicator.h"
#include "strata/comm/launch.h"

namespace strata {
namespace {

using comm_internal::CollectiveCall;
using Vars = std::map<std::string, std::string>;

std::string launch_error(const Vars& vars) {
  absl::StatusOr<LaunchInfo> info = LaunchInfo::from_variables(vars);
  REQUIRE_FALSE(info.ok());
  CHECK(info.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(info.status().message());
}

TEST_CASE("Launch variables: torchrun's names, defaults for a lone process", "[comm][launch]") {
  absl::StatusOr<LaunchInfo> alone = LaunchInfo::from_variables({});
  REQUIRE(alone.ok());
  CHECK(alone->rank == 0);
  CHECK(alone->world_size == 1);
  CHECK_FALSE(alone->launched);
  CHECK(alone->master_addr == "127.0.0.1");
  CHECK(alone->master_port == 0);  // a free port: lone trainers must not collide

  // Launched without a port: torchrun's default.
  absl::StatusOr<LaunchInfo> pair =
      LaunchInfo::from_variables({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  REQUIRE(pair.ok());
  CHECK(pair->master_port == 29500);

  absl::StatusOr<LaunchInfo> launched = LaunchInfo::from_variables({{"RANK", "5"},
                                                                    {"WORLD_SIZE", "8"},
                                                                    {"LOCAL_RANK", "1"},
                                                                    {"MASTER_ADDR", " node7 "},
                                                                    {"MASTER_PORT", "23456"},
                                                                    {"OTHER", "x"}});
  REQUIRE(launched.ok());
  CHECK(launched->rank == 5);
  CHECK(launched->world_size == 8);
  CHECK(launched->local_rank == 1);
  CHECK(launched->master_addr == "node7");
  CHECK(launched->master_port == 23456);
  CHECK(launched->launched);
  // LOCAL_RANK defaults to RANK.
  CHECK(LaunchInfo::from_variables({{"RANK", "2"}, {"WORLD_SIZE", "4"}})->local_rank == 2);
}

TEST_CASE("Launch variables: which a copied environment keeps, which strata-run replaces",
          "[comm][launch]") {
  // Read by from_variables(): torch's and srun's.
  for (const char* name :
       {"RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS"}) {
    INFO(name);
    CHECK(is_launch_variable(name));
  }
  // Replaced by a launcher that starts the ranks itself: torch's and torchrun's, not srun's.
  for (const char* name : {"RANK", "GROUP_RANK", "ROLE_NAME", "TORCHELASTIC_MAX_RESTARTS",
                           "TORCHELASTIC_RUN_ID", "MASTER_ADDR"}) {
    INFO(name);
    CHECK(is_torch_launch_variable(name));
  }
  CHECK_FALSE(is_launch_variable("ROLE_NAME"));  // set by torchrun, not read
  CHECK_FALSE(is_launch_variable("TORCHELASTIC_MAX_RESTARTS"));
  CHECK_FALSE(is_torch_launch_variable("SLURM_PROCID"));
  CHECK_FALSE(is_torch_launch_variable("SLURM_LOCALID"));
  for (const char* name : {"STRATA_BACKEND", "RANKS", "", "rank", "PATH"}) {
    INFO(name);
    CHECK_FALSE(is_launch_variable(name));
    CHECK_FALSE(is_torch_launch_variable(name));
  }
}

TEST_CASE("Launch variables: bad values name the variable and the fix", "[comm][launch]") {
  CHECK(launch_error({{"RANK", "two"}, {"WORLD_SIZE", "4"}}).find("RANK='two'") !=
        std::string::npos);
  CHECK(launch_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("not below WORLD_SIZE=4") !=
        std::string::npos);
  CHECK(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE='0'") !=
        std::string::npos);
  CHECK(launch_error({{"RANK", "1"}}).find("WORLD_SIZE is not") != std::string::npos);
  CHECK(launch_error({{"WORLD_SIZE", "2"}}).find("RANK is not") != std::string::npos);
  CHECK(launch_error({{"MASTER_PORT", "70000"}}).find("MASTER_PORT='70000'") != std::string::npos);
  CHECK(launch_error({{"MASTER_ADDR", ""}}).find("MASTER_ADDR is set but empty") !=
        std::string::npos);
  const std::string both =
      launch_error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "x"}});
  CHECK(both.find("2 launch variable errors") != std::string::npos);
}

CollectiveCall call_of(CollectiveKind kind, std::vector<uint64_t> counts,
                       DataType type = DataType::kFloat32) {
  CollectiveCall call;
  call.kind = kind;
  call.type = type;
  call.sequence = 17;
  call.counts = std::move(counts);
  return call;
}

TEST_CASE("Collective calls: descriptions, byte counts, signatures", "[comm]") {
  CollectiveCall reduce = call_of(CollectiveKind::kAllReduce, {1024});
  CHECK(reduce.describe() == "all_reduce #17 (float32 sum, 1024 elements)");
  CHECK(reduce.stat_bytes() == 4096);
  CHECK(reduce.wire_bytes(4, 0) == 4096 * 2 * 3 / 4);

  CollectiveCall gather = call_of(CollectiveKind::kAllGather, {3, 0, 5}, DataType::kFloat16);
  CHECK(gather.describe() == "all_gather #17 (float16, 8 elements, per rank 3/0/5)");
  CHECK(gather.stat_bytes() == 16);
  CHECK(gather.wire_bytes(3, 1) == 16 * 2 / 3);

  CollectiveCall broadcast = call_of(CollectiveKind::kBroadcast, {10}, DataType::kInt64);
  broadcast.root = 2;
  CHECK(broadcast.describe() == "broadcast #17 (int64, 10 elements, root 2)");
  CHECK(broadcast.wire_bytes(3, 2) == 80);
  CHECK(broadcast.wire_bytes(3, 0) == 0);

  // Signatures round-trip what an error needs and differ whenever the calls do.
  for (const CollectiveCall& c : {reduce, gather, broadcast}) {
    const CollectiveCall back = CollectiveCall::from_signature(c.signature());
    CHECK(back.kind == c.kind);
    CHECK(back.type == c.type);
    CHECK(back.sequence == c.sequence);
    CHECK(back.total_count() == c.total_count());
  }
  CHECK(CollectiveCall::from_signature(reduce.signature()).describe() == reduce.describe());
  CollectiveCall other_counts = call_of(CollectiveKind::kAllGather, {5, 0, 3}, DataType::kFloat16);
  CHECK(other_counts.signature() != gather.signature());  // same total, different shards
  CollectiveCall other_op = reduce;
  other_op.op = ReduceOp::kMax;
  CHECK(other_op.signature() != reduce.signature());
}

TEST_CASE("Collective calls: argument checks and the mismatch message", "[comm]") {
  CHECK(comm_internal::check_counts(call_of(CollectiveKind::kAllGather, {1, 2}), 3)
            .message()
            .find("give one count per rank (3)") != absl::string_view::npos);
  CollectiveCall bad_root = call_of(CollectiveKind::kBroadcast, {4});
  bad_root.root = 3;
  CHECK(comm_internal::check_counts(bad_root, 3).message().find("use a rank from 0 to 2") !=
        absl::string_view::npos);

  const CollectiveCall agreed = call_of(CollectiveKind::kAllReduce, {1024});
  CollectiveCall odd = call_of(CollectiveKind::kBroadcast, {2048});
  odd.root = 0;
  const std::string message = comm_internal::mismatch_message(
      {agreed.signature(), agreed.signature(), odd.signature(), agreed.signature()}, 0);
  INFO(message);
  CHECK(message.find("3 of 4 ranks issued all_reduce #17 (float32 sum, 1024 elements)") !=
        std::string::npos);
  CHECK(message.find("rank 2 issued broadcast #17 (float32, 2048 elements, root 0)") !=
        std::string::npos);
  CHECK(message.find("Rank(s) at fault: 2") != std::string::npos);
}

TEST_CASE("Host reductions: every type and operation, 16-bit floats rounded to nearest even",
          "[comm]") {
  using comm_internal::combine_function;
  std::vector<float> a = {1.5f, -2.0f, 3.25f}, b = {0.5f, 4.0f, -1.0f};
  combine_function(DataType::kFloat32, ReduceOp::kSum)(a.data(), b.data(), 3);
  CHECK(a == std::vector<float>{2.0f, 2.0f, 2.25f});
  std::vector<int64_t> x = {5, -7}, y = {3, 9};
  combine_function(DataType::kInt64, ReduceOp::kMax)(x.data(), y.data(), 2);
  CHECK(x == std::vector<int64_t>{5, 9});
  combine_function(DataType::kInt64, ReduceOp::kMin)(x.data(), y.data(), 2);
  CHECK(x == std::vector<int64_t>{3, 9});
  std::vector<int32_t> avg = {9, 10};
  comm_internal::divide_in_place(avg.data(), 2, DataType::kInt32, 3);
  CHECK(avg == std::vector<int32_t>{3, 3});

  // Every finite float16 survives a round trip through float exactly.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const comm_internal::Float16Bits h{static_cast<uint16_t>(bits)};
    const float f = comm_internal::to_float(h);
    if (std::isnan(f)) continue;
    REQUIRE(comm_internal::to_float16(f).bits == h.bits);
  }
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const comm_internal::BFloat16Bits h{static_cast<uint16_t>(bits)};
    const float f = comm_internal::to_float(h);
    if (std::isnan(f)) continue;
    REQUIRE(comm_internal::to_bfloat16(f).bits == h.bits);
  }
  CHECK(comm_internal::to_float(comm_internal::to_float16(1.0f + 1.0f / 2048)) ==
        1.0f);  // tie → even
  CHECK(comm_internal::to_float(comm_internal::to_float16(1.0f + 3.0f / 2048)) ==
        1.0f + 2.0f / 1024);
  CHECK(std::isinf(comm_internal::to_float(comm_internal::to_float16(70000.0f))));
  CHECK(comm_internal::to_float(comm_internal::to_bfloat16(1.0f + 1.0f / 256)) == 1.0f);
  std::vector<comm_internal::Float16Bits> h1 = {comm_internal::to_float16(1.5f)},
                                          h2 = {comm_internal::to_float16(2.25f)};
  combine_function(DataType::kFloat16, ReduceOp::kSum)(h1.data(), h2.data(), 1);
  CHECK(comm_internal::to_float(h1[0]) == 3.75f);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST_CASE("Two lone processes' communicators do not collide on a port", "[comm][launch]") {
  absl::StatusOr<LaunchInfo> alone = LaunchInfo::from_variables({});
  REQUIRE(alone.ok());
  CommOptions options;
  options.launch = *alone;
  options.settings.backend = CommBackendKind::kGloo;
  // As two trainers on one machine would, each a job of one rank, at the same time.
  auto first = Communicator::create(options);
  REQUIRE(first.ok());
  auto second = Communicator::create(options);
  INFO(second.status().ToString());
  REQUIRE(second.ok());
  CHECK((*first)->description().find(":0,") == std::string::npos);
  CHECK((*first)->description() != (*second)->description());
}

TEST_CASE("A Gloo communicator keeps a dead peer's socket from killing the process",
          "[comm][gloo]") {
  // Gloo's TCP transport writes without MSG_NOSIGNAL: with SIGPIPE's default action, a write
  // to a dead rank's connection killed the survivors (CI: ranks 0 and 2 died of signal 13).
  absl::StatusOr<LaunchInfo> alone = LaunchInfo::from_variables({});
  REQUIRE(alone.ok());
  CommOptions options;
  options.launch = *alone;
  options.settings.backend = CommBackendKind::kGloo;
  auto comm = Communicator::create(options);
  REQUIRE(comm.ok());
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  close(fds[1]);  // the peer is gone
  const ssize_t n = write(fds[0], "x", 1);
  const int error = errno;
  close(fds[0]);
  CHECK(n == -1);  // without the handler the process would have died here
  CHECK(error == EPIPE);
}

}  // namespace
}  // namespace strata
