// Launches as users start them (strata/comm/launch.h, strata/config/slurm.h,
// strata/comm/launcher_store.h): torchrun's variables, srun's standing in for torch's, and ranks
// that meet through a launcher's store while its agent holds MASTER_PORT. Ranks run on threads
// of this process (Gloo over loopback); the process-level launches (a real torch TCPStore,
// restarts, torch.distributed first) are CTest's launch.* entries (tests/python/launchers.py).
#include "strata/comm/launch.h"

#include <absl/synchronization/mutex.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous_address.h"
#include "strata/base/mutex.h"
#include "strata/base/unique_fd.h"
#include "strata/comm/communicator.h"
#include "strata/comm/launcher_store.h"
#include "strata/config/config.h"
#include "strata/config/slurm.h"

namespace strata {
namespace {

using Vars = std::map<std::string, std::string>;
using namespace std::chrono_literals;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string launch_error(const Vars& vars) {
  absl::StatusOr<LaunchInfo> info = LaunchInfo::from_variables(vars);
  REQUIRE_FALSE(info.ok());
  CHECK(info.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(info.status().message());
}

// What torchrun's agent exports to worker `rank` of `world` on one node.
Vars torchrun_variables(int rank, int world, int port, int attempt = 0) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"GROUP_RANK", "0"},
          {"GROUP_WORLD_SIZE", "1"},
          {"ROLE_RANK", std::to_string(rank)},
          {"ROLE_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
          {"TORCHELASTIC_RUN_ID", "none"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
}

TEST_CASE("Launch variables: torchrun's, all of them read", "[comm][launch]") {
  absl::StatusOr<LaunchInfo> info = LaunchInfo::from_variables(torchrun_variables(1, 2, 29511, 3));
  REQUIRE(info.ok());
  CHECK(info->rank == 1);
  CHECK(info->world_size == 2);
  CHECK(info->local_rank == 1);
  CHECK(info->local_world_size == 2);
  CHECK(info->node_rank == 0);
  CHECK(info->agent_store);
  CHECK(info->restart_count == 3);
  CHECK(info->run_id == "none");
  CHECK(info->source == "torchrun");
  CHECK(info->master_port == 29511);
  // Without the agent store (torch < 2.5's c10d rendezvous): rank 0 serves MASTER_PORT itself.
  Vars c10d = torchrun_variables(0, 2, 29512);
  c10d["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  CHECK_FALSE(LaunchInfo::from_variables(c10d)->agent_store);

  CHECK(contains(
      launch_error(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
      "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  CHECK(contains(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}}),
                 "LOCAL_WORLD_SIZE=4 is more than WORLD_SIZE=2"));
  CHECK(contains(
      launch_error(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "1"}}),
      "GROUP_RANK=1 is not below GROUP_WORLD_SIZE=1"));
  CHECK(contains(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"ROLE_RANK", "x"}}),
                 "ROLE_RANK='x'"));
  Vars bad = torchrun_variables(0, 2, 29513);
  bad["TORCHELASTIC_USE_AGENT_STORE"] = "maybe";
  CHECK(contains(launch_error(bad), "TORCHELASTIC_USE_AGENT_STORE='maybe' is not True or False"));
  bad = torchrun_variables(0, 2, 29513);
  bad["TORCHELASTIC_RESTART_COUNT"] = "-1";
  CHECK(contains(launch_error(bad), "TORCHELASTIC_RESTART_COUNT='-1'"));
  bad = torchrun_variables(0, 2, 29513);
  bad.erase("MASTER_PORT");
  CHECK(contains(launch_error(bad),
                 "TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR or "
                 "MASTER_PORT is unset"));
}

// srun's variables for task `rank` of `world`, all on node `node`.
Vars srun_variables(int rank, int world, const std::string& tasks_per_node, int node = 0,
                    int local = -1) {
  return {{"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_NTASKS", std::to_string(world)},
          {"SLURM_LOCALID", std::to_string(local < 0 ? rank : local)},
          {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_TASKS_PER_NODE", tasks_per_node},
          {"SLURM_JOB_NODELIST", "node[1-3]"}};
}

TEST_CASE("Slurm: srun's variables stand in for torch's when those are absent",
          "[comm][launch][slurm]") {
  Vars vars = srun_variables(5, 7, "3(x2),1", 1, 2);
  vars["MASTER_ADDR"] = "node1";
  vars["MASTER_PORT"] = "29600";
  absl::StatusOr<LaunchInfo> info = LaunchInfo::from_variables(vars);
  INFO(info.status().ToString());
  REQUIRE(info.ok());
  CHECK(info->rank == 5);
  CHECK(info->world_size == 7);
  CHECK(info->local_rank == 2);
  CHECK(info->local_world_size == 3);  // node 1's entry of 3, 3, 1
  CHECK(info->node_rank == 1);
  CHECK(info->launched);
  CHECK(info->master_addr == "node1");
  CHECK(contains(info->source, "srun task SLURM_PROCID=5 of SLURM_NTASKS=7"));
  // The configuration's local ranks come from the same variables (the device, memory shares).
  absl::StatusOr<Config> config = Config::from_variables(vars);
  REQUIRE(config.ok());
  CHECK(config->local.rank == 2);
  CHECK(config->local.world_size == 3);
  // SLURM_NTASKS_PER_NODE wins over the per-node list; the step's task count over the job's.
  vars["SLURM_NTASKS_PER_NODE"] = "4";
  vars["SLURM_STEP_NUM_TASKS"] = "8";
  vars["SLURM_PROCID"] = "6";
  info = LaunchInfo::from_variables(vars);
  REQUIRE(info.ok());
  CHECK(info->local_world_size == 4);
  CHECK(info->world_size == 8);
  CHECK(Config::from_variables(vars)->local.world_size == 4);
}

TEST_CASE("Slurm: torch's variables, the batch script and a lone task are not srun's launch",
          "[comm][launch][slurm]") {
  // torchrun inside an srun step: torch's variables describe the launch.
  Vars both = srun_variables(1, 2, "2");
  both.insert({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "0"}});
  absl::StatusOr<LaunchInfo> info = LaunchInfo::from_variables(both);
  REQUIRE(info.ok());
  CHECK(info->rank == 3);
  CHECK(info->world_size == 8);
  CHECK(Config::from_variables(both)->local.rank == 0);
  // The batch script (no SLURM_STEP_ID, or the batch/extern/interactive step) is one process:
  // not rank 0 of SLURM_NTASKS ranks that never come.
  for (const char* step : {"", "batch", "extern", "4294967291", "4294967290"}) {
    Vars batch = srun_variables(0, 4, "4");
    if (std::string(step).empty()) {
      batch.erase("SLURM_STEP_ID");
    } else {
      batch["SLURM_STEP_ID"] = step;
    }
    INFO(step);
    info = LaunchInfo::from_variables(batch);
    REQUIRE(info.ok());
    CHECK(info->world_size == 1);
    CHECK_FALSE(info->launched);
    CHECK_FALSE(Config::from_variables(batch)->local.world_size.has_value());
  }
  // One task needs no MASTER_ADDR.
  info = LaunchInfo::from_variables(srun_variables(0, 1, "1"));
  REQUIRE(info.ok());
  CHECK(info->world_size == 1);
}

TEST_CASE("Slurm: errors name the variables and, for MASTER_*, how to set them",
          "[comm][launch][slurm]") {
  const std::string no_master = launch_error(srun_variables(1, 2, "2"));
  CHECK(contains(no_master, "srun task SLURM_PROCID=1 of SLURM_NTASKS=2"));
  CHECK(contains(no_master, "MASTER_ADDR and MASTER_PORT are not set"));
  CHECK(contains(no_master, "scontrol show hostnames \"$SLURM_JOB_NODELIST\""));
  Vars vars = srun_variables(1, 2, "2");
  vars["MASTER_ADDR"] = "node1";
  CHECK(contains(launch_error(vars), "MASTER_PORT is not set"));
  vars["MASTER_PORT"] = "29600";
  vars["SLURM_PROCID"] = "2";
  CHECK(contains(launch_error(vars), "SLURM_PROCID='2' is not a task rank below SLURM_NTASKS=2"));
  vars["SLURM_PROCID"] = "1";
  vars["SLURM_TASKS_PER_NODE"] = "2(x";
  CHECK(contains(launch_error(vars), "SLURM_TASKS_PER_NODE='2(x' is not a tasks-per-node list"));
  vars["SLURM_TASKS_PER_NODE"] = "2";
  vars["SLURM_NODEID"] = "1";
  CHECK(contains(launch_error(vars), "lists 1 node(s) but SLURM_NODEID=1"));
  vars["SLURM_NODEID"] = "0";
  vars["SLURM_LOCALID"] = "2";
  CHECK(contains(launch_error(vars), "SLURM_LOCALID=2 is not below this node's 2 task(s)"));
  absl::StatusOr<Config> config = Config::from_variables(vars);
  CHECK_FALSE(config.ok());
}

TEST_CASE("Slurm: tasks per node as srun writes them", "[comm][launch][slurm]") {
  CHECK(*parse_slurm_tasks_per_node("4") == std::vector<int>{4});
  CHECK(*parse_slurm_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(*parse_slurm_tasks_per_node(" 1,3(x2) ") == std::vector<int>{1, 3, 3});
  for (const char* bad : {"", "x", "2(3)", "2(x0)", "0", "2(x3", "2,,1", "-1"}) {
    INFO(bad);
    CHECK_FALSE(parse_slurm_tasks_per_node(bad).ok());
  }
}

// A launcher's store in this process: what torchrun's agent store is to its workers.
class MemoryStore final : public LauncherStore {
 public:
  absl::Status set(const std::string& key, const std::string& value) override {
    MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }
  // Polls (strata::MutexLock keeps the TSan build's view of the lock; a test's store need not
  // wake at once).
  absl::StatusOr<std::string> get(const std::string& key,
                                  std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      {
        MutexLock lock(&mu_);
        if (const auto it = values_.find(key); it != values_.end()) {
          ++gets_;
          return it->second;
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError("wait timeout");
      }
      std::this_thread::sleep_for(2ms);
    }
  }
  std::string description() const override { return "a test's store"; }
  std::map<std::string, std::string> values() {
    MutexLock lock(&mu_);
    return values_;
  }
  int gets() {
    MutexLock lock(&mu_);
    return gets_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  int gets_ ABSL_GUARDED_BY(mu_) = 0;
};

// A listening socket on a free loopback port: the agent's MASTER_PORT, which nobody else may
// bind.
struct AgentPort {
  UniqueFd fd;
  int port = 0;
  AgentPort() : fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(::listen(fd.get(), 16) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port = ntohs(address.sin_port);
  }
};

// Creates rank r's communicator of a `world`-rank torchrun job meeting through `store`, and
// all-reduces (rank + 1): every rank must see world × (world + 1) / 2.
absl::Status torchrun_rank(int rank, int world, int port, int attempt, const std::string& run,
                           LauncherStore* store, std::chrono::milliseconds timeout = 20s) {
  Vars vars = torchrun_variables(rank, world, port, attempt);
  vars["TORCHELASTIC_RUN_ID"] = run;
  absl::StatusOr<LaunchInfo> launch = LaunchInfo::from_variables(vars);
  if (!launch.ok()) return launch.status();
  CommOptions options;
  options.launch = *launch;
  options.settings.backend = CommBackendKind::kGloo;
  options.settings.timeout = timeout;
  options.launcher_store = store;
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::create(options);
  if (!comm.ok()) return comm.status();
  float value = static_cast<float>(rank + 1);
  absl::StatusOr<std::unique_ptr<CollectiveWork>> work =
      (*comm)->all_reduce(&value, &value, 1, DataType::kFloat32, ReduceOp::kSum);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->wait(); !s.ok()) return s;
  if (value != static_cast<float>(world * (world + 1) / 2)) {
    return absl::InternalError("wrong sum " + std::to_string(value));
  }
  if (contains((*comm)->description(), ":" + std::to_string(port) + ",")) {
    return absl::InternalError("served on the agent's port: " + (*comm)->description());
  }
  return absl::OkStatus();
}

std::vector<absl::Status> run_job(int world, int port, int attempt, const std::string& run,
                                  LauncherStore* store) {
  std::vector<std::future<absl::Status>> ranks;
  for (int r = world - 1; r >= 0; --r) {  // rank 0 last: the others look for it first
    ranks.push_back(std::async(std::launch::async,
                               [=] { return torchrun_rank(r, world, port, attempt, run, store); }));
  }
  std::vector<absl::Status> results;
  for (auto& f : ranks) results.push_back(f.get());
  return results;
}

TEST_CASE("torchrun: the ranks meet through the agent's store, never binding its port",
          "[comm][launch][torchrun]") {
  AgentPort agent;  // held for the job's life, as torchrun's agent holds its TCPStore
  MemoryStore store;
  for (int world : {2, 3}) {
    for (const absl::Status& s :
         run_job(world, agent.port, 0, "meet" + std::to_string(world), &store)) {
      INFO(s.ToString());
      CHECK(s.ok());
    }
  }
  // Two communicators, one after the other, in the same attempt: the second has a key of its
  // own (a rank must never read the first's address).
  for (const absl::Status& s : run_job(2, agent.port, 0, "meet2", &store)) CHECK(s.ok());
  const auto values = store.values();
  CHECK(values.count("strata/rendezvous/meet2/attempt_0/0") == 1);
  CHECK(values.count("strata/rendezvous/meet2/attempt_0/1") == 1);
  CHECK(values.count("strata/rendezvous/meet3/attempt_0/0") == 1);
  CHECK(store.gets() == 1 + 2 + 1);  // the ranks other than 0 read the address
}

TEST_CASE("torchrun: a restarted attempt never reads an earlier attempt's address",
          "[comm][launch][torchrun]") {
  AgentPort agent;
  MemoryStore store;
  // Attempt 0's rank 0 announced an address and died (port 1: nothing listens there); a rank
  // that read it would retry it until the timeout.
  REQUIRE(store.set("strata/rendezvous/restart/attempt_0/0", "127.0.0.1 1").ok());
  for (const absl::Status& s : run_job(2, agent.port, 1, "restart", &store)) {
    INFO(s.ToString());
    CHECK(s.ok());
  }
  CHECK(store.values().count("strata/rendezvous/restart/attempt_1/0") == 1);
}

TEST_CASE("torchrun: a rank whose rank 0 never announces fails within the timeout, naming it",
          "[comm][launch][torchrun]") {
  AgentPort agent;
  MemoryStore store;
  const absl::Status s = torchrun_rank(1, 2, agent.port, 0, "lonely", &store, 300ms);
  INFO(s.ToString());
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(contains(std::string(s.message()),
                 "rank 1 of 2: rank 0 did not announce strata's "
                 "rendezvous in a test's store under "
                 "'strata/rendezvous/lonely/attempt_0/0'"));
  CHECK(contains(std::string(s.message()), "STRATA_COMM_TIMEOUT (300 ms)"));
}

TEST_CASE("torchrun from C++ without a launcher's store: an error naming the variable and the fix",
          "[comm][launch][torchrun]") {
  absl::StatusOr<LaunchInfo> launch = LaunchInfo::from_variables(torchrun_variables(0, 2, 29533));
  REQUIRE(launch.ok());
  CommOptions options;
  options.launch = *launch;
  options.settings.backend = CommBackendKind::kGloo;
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::create(options);
  REQUIRE_FALSE(comm.ok());
  const std::string message(comm.status().message());
  CHECK(comm.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(message, "TORCHELASTIC_USE_AGENT_STORE=True"));
  CHECK(contains(message, "127.0.0.1:29533"));
  CHECK(contains(message, "strata-run -n N"));
  CHECK(contains(message, "strata.Communicator.from_environment()"));
  // A job of one rank (torchrun --nproc-per-node=1) has nobody to meet: it starts, on a free
  // port, not on the agent's.
  AgentPort agent;
  absl::StatusOr<LaunchInfo> one = LaunchInfo::from_variables(torchrun_variables(0, 1, agent.port));
  REQUIRE(one.ok());
  options.launch = *one;
  absl::StatusOr<std::unique_ptr<Communicator>> alone = Communicator::create(options);
  INFO(alone.status().ToString());
  REQUIRE(alone.ok());
  CHECK_FALSE(contains((*alone)->description(), ":" + std::to_string(agent.port) + ","));
}

TEST_CASE("The address towards MASTER_ADDR is this machine's", "[comm][launch]") {
  absl::StatusOr<std::string> local = comm_internal::local_address_towards("127.0.0.1");
  REQUIRE(local.ok());
  CHECK(*local == "127.0.0.1");
  absl::StatusOr<std::string> bad = comm_internal::local_address_towards("no-such-host.invalid");
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(std::string(bad.status().message()), "MASTER_ADDR='no-such-host.invalid'"));
  CHECK(comm_internal::decode_rendezvous_point("10.0.0.1 29500")->port == 29500);
  CHECK_FALSE(comm_internal::decode_rendezvous_point("10.0.0.1").ok());
  CHECK_FALSE(comm_internal::decode_rendezvous_point("10.0.0.1 0").ok());
}

}  // namespace
}  // namespace strata
