// One GPU shared by several local ranks: a CUDA_VISIBLE_DEVICES or STRATA_DEVICE inherited from
// the launch (the parent process has the same value) puts every local rank on one device, whose
// budget they divide; set per rank, the device is the rank's own. Machines of one simulated GPU,
// each launcher case with two local ranks; and the parent environment as probed from /proc.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "fake_machine.h"
#include "strata/config/config.h"
#include "strata/config/machine_info.h"

namespace strata {
namespace {

using testing::contains;
using testing::fake_cuda_machine;
using testing::fake_machine;
using testing::kGiB;
using testing::resolved_of;

Config config_of(const std::map<std::string, std::string>& vars) {
  absl::StatusOr<Config> c = Config::from_variables(vars);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return *c;
}

// `count` visible GPUs of 80 GiB, all free; the process that started this rank (pid 4242)
// has `parent` (nullopt: its environment could not be read).
MachineInfo machine(int count, std::optional<std::string> visible,
                    std::optional<std::map<std::string, std::string>> parent) {
  MachineInfo m = fake_cuda_machine();
  m.gpu_count = count;
  m.gpu->free_bytes = m.gpu->total_bytes;  // 80 GiB
  m.cuda_visible_devices = std::move(visible);
  m.parent.pid = 4242;
  if (!parent) {
    m.parent.problem = "/proc/4242/environ: Permission denied";
    return m;
  }
  m.parent.readable = true;
  if (parent->count("CUDA_VISIBLE_DEVICES")) {
    m.parent.cuda_visible_devices = parent->at("CUDA_VISIBLE_DEVICES");
  }
  if (parent->count("STRATA_DEVICE")) m.parent.strata_device = parent->at("STRATA_DEVICE");
  return m;
}

constexpr uint64_t kWhole = 64 * kGiB;  // 80% of the 80 GiB GPU: one rank on it
constexpr uint64_t kHalf = 32 * kGiB;   // 80% of half of it: two ranks on it

TEST_CASE("CUDA_VISIBLE_DEVICES=0 inherited from the launch: two ranks halve one GPU",
          "[config][local][gpu-sharing]") {
  // CUDA_VISIBLE_DEVICES=0 torchrun --nproc-per-node=2 ...: the agent has it, so do both ranks.
  const MachineInfo m =
      machine(1, "0", std::map<std::string, std::string>{{"CUDA_VISIBLE_DEVICES", "0"}});
  for (const char* rank : {"0", "1"}) {
    INFO("LOCAL_RANK=" << rank);
    const ResolvedConfig r =
        resolved_of(config_of({{"LOCAL_RANK", rank}, {"LOCAL_WORLD_SIZE", "2"}}), m);
    CHECK(r.device == 0);
    CHECK(r.gpu_sharing == 2);
    CHECK(r.gpu_budget_sharing == 2);
    CHECK(r.gpu_bytes == kHalf);
    CHECK(r.gpu_sharing_reason ==
          "CUDA_VISIBLE_DEVICES=0 is inherited from the launch (process 4242, which started this "
          "one, has it too), so it shows all LOCAL_WORLD_SIZE=2 ranks the same one device");
    CHECK(contains(render(r), "shared by 2 local ranks (CUDA_VISIBLE_DEVICES=0 is inherited"));
  }
  // LOCAL_RANK=1 has no device 1: it is on the one shown to every rank.
  CHECK(resolved_of(config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}), m).device_reason ==
        "the one device CUDA_VISIBLE_DEVICES=0 shows every local rank (LOCAL_RANK=1, "
        "STRATA_DEVICE unset)");
  // Four ranks: a quarter each.
  const ResolvedConfig four =
      resolved_of(config_of({{"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"}}), m);
  CHECK(four.gpu_sharing == 4);
  CHECK(four.gpu_bytes == 16 * kGiB);
  // One rank: nothing to share.
  CHECK(resolved_of(config_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}}), m).gpu_bytes ==
        kWhole);
}

TEST_CASE("CUDA_VISIBLE_DEVICES set per rank: the device is the rank's own",
          "[config][local][gpu-sharing]") {
  // Slurm's --gpus-per-task=1 or a wrapper that sets it from LOCAL_RANK: the parent has another
  // value, or none.
  for (const auto& parent : {std::map<std::string, std::string>{},
                             std::map<std::string, std::string>{{"CUDA_VISIBLE_DEVICES", "0,1"}}}) {
    const MachineInfo m = machine(1, "1", parent);
    const ResolvedConfig r =
        resolved_of(config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}), m);
    CHECK(r.device == 0);
    CHECK(r.device_reason ==
          "the one device CUDA_VISIBLE_DEVICES=1 shows this rank (LOCAL_RANK=1, STRATA_DEVICE "
          "unset)");
    CHECK(r.gpu_sharing == 1);
    CHECK(r.gpu_budget_sharing == 1);
    CHECK(r.gpu_bytes == kWhole);
    CHECK(contains(r.gpu_sharing_reason,
                   "CUDA_VISIBLE_DEVICES=1 shows this rank one device of its own (set for this "
                   "rank: process 4242, which started this one, has CUDA_VISIBLE_DEVICES"));
  }
  // The parent's environment unreadable (Slurm's slurmstepd runs as root): taken as its own, as
  // Slurm's per-task binding sets it; the communicator's check catches a shared one.
  const ResolvedConfig unknown = resolved_of(
      config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}), machine(1, "0", std::nullopt));
  CHECK(unknown.gpu_sharing == 1);
  CHECK(unknown.gpu_bytes == kWhole);
  CHECK(unknown.gpu_sharing_reason ==
        "CUDA_VISIBLE_DEVICES=0 shows this rank one device, taken as its own (whether the "
        "launcher set it per rank is unknown: /proc/4242/environ: Permission denied)");
  // Inherited but showing two devices: LOCAL_RANK picks one each.
  const MachineInfo two =
      machine(2, "0,1", std::map<std::string, std::string>{{"CUDA_VISIBLE_DEVICES", "0,1"}});
  CHECK(resolved_of(config_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}}), two).gpu_sharing ==
        1);
}

TEST_CASE("STRATA_DEVICE inherited from the launch: every local rank on that device",
          "[config][local][gpu-sharing]") {
  // Two visible GPUs, STRATA_DEVICE=0 for the whole launch: both ranks on device 0. The counts
  // alone (2 ranks over 2 devices) would have said one each.
  const Config rank1 =
      config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"STRATA_DEVICE", "0"}});
  const MachineInfo inherited =
      machine(2, std::nullopt, std::map<std::string, std::string>{{"STRATA_DEVICE", " 0 "}});
  ResolvedConfig r = resolved_of(rank1, inherited);
  CHECK(r.device == 0);
  CHECK(r.gpu_sharing == 2);
  CHECK(r.gpu_budget_sharing == 2);
  CHECK(r.gpu_bytes == kHalf);
  CHECK(r.gpu_sharing_reason ==
        "STRATA_DEVICE=0 is inherited from the launch (process 4242, which started this one, has "
        "it too), so all LOCAL_WORLD_SIZE=2 ranks use device 0");

  // Set per rank (the parent has another value, or none), or unknown: the fewest per device the
  // counts allow, as before.
  for (const MachineInfo& m :
       {machine(2, std::nullopt, std::map<std::string, std::string>{}),
        machine(2, std::nullopt, std::map<std::string, std::string>{{"STRATA_DEVICE", "1"}}),
        machine(2, std::nullopt, std::nullopt)}) {
    r = resolved_of(rank1, m);
    CHECK(r.gpu_sharing == 1);
    CHECK(r.gpu_bytes == kWhole);
  }
  // One visible GPU: shared by the counts alone, inherited or not.
  r = resolved_of(rank1, machine(1, std::nullopt, std::map<std::string, std::string>{}));
  CHECK(r.gpu_sharing == 2);
  CHECK(r.gpu_bytes == kHalf);
}

TEST_CASE("The arena's assumed sharing is told only for a share of a GPU",
          "[config][local][gpu-sharing]") {
  const MachineInfo m =
      machine(1, "0", std::map<std::string, std::string>{{"CUDA_VISIBLE_DEVICES", "0"}});
  Config c =
      config_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"STRATA_GPU_BYTES", "50%"}});
  CHECK(resolved_of(c, m).gpu_budget_sharing == 2);
  CHECK(resolved_of(c, m).gpu_bytes == 20 * kGiB);
  // A size is the user's own figure: nothing assumed (it still must fit twice).
  c.gpu_bytes = SizeSetting::of_bytes(30 * kGiB);
  CHECK(resolved_of(c, m).gpu_sharing == 2);
  CHECK(resolved_of(c, m).gpu_budget_sharing == 0);
  // The host backend's arena is host memory.
  CHECK(
      resolved_of(
          config_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}, {"STRATA_GPU_BYTES", "10%"}}),
          fake_machine())
          .gpu_budget_sharing == 0);
}

TEST_CASE("The parent's environment is read from /proc", "[config][local][gpu-sharing]") {
  // A child started with a known environment, read while it sleeps.
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(ready[0]);
    char arg0[] = "sleep";
    char arg1[] = "30";
    char* argv[] = {arg0, arg1, nullptr};
    char e1[] = "CUDA_VISIBLE_DEVICES=2,3";
    char e2[] = "STRATA_DEVICE= 1";
    char e3[] = "OTHER=x=y";
    char* envp[] = {e1, e2, e3, nullptr};
    // Closed on exec: the parent's read returns once the new image (its environment) is in place.
    fcntl(ready[1], F_SETFD, FD_CLOEXEC);
    execve("/bin/sleep", argv, envp);
    _exit(127);
  }
  close(ready[1]);
  char byte = 0;
  (void)read(ready[0], &byte, 1);
  close(ready[0]);
  const ParentEnvironment env = probe_parent_environment(child);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  INFO(env.problem);
  REQUIRE(env.readable);
  CHECK(env.pid == child);
  CHECK(env.cuda_visible_devices == "2,3");
  CHECK(env.strata_device == " 1");

  // Gone (just reaped): unreadable, with the reason.
  const ParentEnvironment gone = probe_parent_environment(child);
  CHECK_FALSE(gone.readable);
  CHECK(contains(gone.problem, "/proc/" + std::to_string(child) + "/environ"));
  CHECK_FALSE(gone.cuda_visible_devices.has_value());

  // probe_machine reads this process's parent.
  absl::StatusOr<MachineInfo> probed = probe_machine({});
  REQUIRE(probed.ok());
  CHECK(probed->parent.pid == static_cast<int>(getppid()));
}

}  // namespace
}  // namespace strata
