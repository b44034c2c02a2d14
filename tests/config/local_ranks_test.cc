// Where a rank sits on its node: LOCAL_RANK picks the device, LOCAL_WORLD_SIZE divides the
// node's memory, and the io_uring registration is checked against RLIMIT_MEMLOCK as it is.
#include <stdlib.h>

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
using testing::fake_path;
using testing::kGiB;
using testing::kMiB;
using testing::resolve_error;
using testing::resolved_of;

Config config_of(const std::map<std::string, std::string>& vars) {
  absl::StatusOr<Config> c = Config::from_variables(vars);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  return *c;
}

std::string parse_error(const std::map<std::string, std::string>& vars) {
  absl::StatusOr<Config> c = Config::from_variables(vars);
  REQUIRE_FALSE(c.ok());
  return std::string(c.status().message());
}

// `count` visible GPUs of 80 GiB (all free), the facts of `selected` filled in.
MachineInfo gpus(int count, int selected = 0) {
  MachineInfo m = fake_cuda_machine();
  m.gpu_count = count;
  m.gpu = GpuInfo{selected, "Test GPU", 80 * kGiB, 80 * kGiB, 9, 0};
  return m;
}

TEST_CASE("LOCAL_RANK and LOCAL_WORLD_SIZE are read and checked", "[config][local]") {
  const Config c = config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  CHECK(c.local.rank == 1);
  CHECK(c.local.world_size == 4);
  CHECK(c.local.count() == 4);
  CHECK_FALSE(c.device.has_value());

  CHECK(parse_error({{"LOCAL_RANK", "one"}}) ==
        "LOCAL_RANK='one' is not a local rank: use an integer from 0 to LOCAL_WORLD_SIZE-1 "
        "(torchrun and strata-run set it)");
  CHECK(contains(parse_error({{"LOCAL_RANK", "-1"}}), "LOCAL_RANK='-1' is not a local rank"));
  CHECK(contains(parse_error({{"LOCAL_RANK", ""}}), "LOCAL_RANK='' is not a local rank"));
  CHECK(contains(parse_error({{"LOCAL_WORLD_SIZE", "0"}}),
                 "LOCAL_WORLD_SIZE='0' is not a rank count: use the number of ranks on this node"));
  CHECK(contains(parse_error({{"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}}),
                 "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4: local ranks run from 0 to "
                 "LOCAL_WORLD_SIZE-1"));
  // With the STRATA_* errors, after them (table order).
  const std::string both = parse_error({{"LOCAL_RANK", "x"}, {"STRATA_IO_DEPTH", "0"}});
  CHECK(both.find("STRATA_IO_DEPTH") < both.find("LOCAL_RANK"));

  // Set from C++: checked by resolve() with the same names.
  Config bad;
  bad.local.rank = 2;
  bad.local.world_size = 2;
  CHECK(
      contains(resolve_error(bad, fake_machine()), "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  bad.local.world_size = 0;
  CHECK(contains(resolve_error(bad, fake_machine()), "LOCAL_WORLD_SIZE=0 is out of range"));

  // The process environment's, with the STRATA_* variables.
  REQUIRE(setenv("LOCAL_RANK", "2", 1) == 0);
  REQUIRE(setenv("LOCAL_WORLD_SIZE", "3", 1) == 0);
  const std::map<std::string, std::string> env = Config::environment_variables();
  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
  CHECK(env.at("LOCAL_RANK") == "2");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "3");
}

TEST_CASE("LOCAL_RANK picks the device, STRATA_DEVICE set wins", "[config][local]") {
  // On host the number is unused, but chosen and explained the same way.
  ResolvedConfig r =
      resolved_of(config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}), fake_machine());
  CHECK(r.device == 1);
  CHECK(r.device_reason == "from LOCAL_RANK=1 (STRATA_DEVICE unset)");
  CHECK(contains(render(r),
                 "STRATA_DEVICE        = 1: from LOCAL_RANK=1 (STRATA_DEVICE unset); "
                 "unused on host\n"));
  CHECK(contains(render(r), "LOCAL_RANK           = 1\n"));
  CHECK(contains(render(r), "LOCAL_WORLD_SIZE     = 2 (ranks on this node"));

  r = resolved_of(
      config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"STRATA_DEVICE", "0"}}),
      fake_machine());
  CHECK(r.device == 0);
  CHECK(r.device_reason == "from STRATA_DEVICE=0");

  r = resolved_of(Config{}, fake_machine());
  CHECK(r.device == 0);
  CHECK(r.device_reason == "neither STRATA_DEVICE nor LOCAL_RANK is set");

  // Host: no device count to check against.
  CHECK(resolved_of(config_of({{"LOCAL_RANK", "7"}, {"LOCAL_WORLD_SIZE", "8"}}), fake_machine())
            .device == 7);

  // cuda: the facts given must be the chosen device's.
  r = resolved_of(config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}), gpus(2, 1));
  CHECK(r.device == 1);
  CHECK(r.gpu_sharing == 1);
  CHECK(r.gpu_bytes == 64 * kGiB);  // 80% of device 1's 80 GiB: one rank per device
  absl::StatusOr<ResolvedConfig> wrong =
      resolve(config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}), gpus(2, 0));
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(std::string(wrong.status().message()),
                 "given the facts of GPU 0 but device 1 is chosen (from LOCAL_RANK=1"));
  r = resolved_of(
      config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"STRATA_DEVICE", "0"}}),
      gpus(2, 0));
  CHECK(r.device == 0);
}

TEST_CASE("A device out of range names LOCAL_RANK, STRATA_DEVICE and the count",
          "[config][local]") {
  absl::StatusOr<ResolvedConfig> r =
      resolve(config_of({{"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"}}), gpus(2));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(r.status().message()) ==
        "LOCAL_RANK=3 picks CUDA device 3 (STRATA_DEVICE is unset), but 2 CUDA devices are "
        "visible (CUDA_VISIBLE_DEVICES unset): run at most 2 ranks per node, show each rank its "
        "own device with CUDA_VISIBLE_DEVICES, or set STRATA_DEVICE to share one (its memory is "
        "then divided among the ranks)");

  MachineInfo listed = gpus(2);
  listed.cuda_visible_devices = "4,5";
  CHECK(contains(resolve_error(config_of({{"STRATA_DEVICE", "2"}}), listed),
                 "STRATA_DEVICE=2 but 2 CUDA devices are visible (CUDA_VISIBLE_DEVICES=4,5): use "
                 "0..1"));

  // One device and no CUDA_VISIBLE_DEVICES: LOCAL_RANK=1 has no device of its own.
  CHECK(
      contains(resolve_error(config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}}), gpus(1)),
               "LOCAL_RANK=1 picks CUDA device 1 (STRATA_DEVICE is unset), but 1 CUDA device "
               "is visible"));

  // A CUDA_VISIBLE_DEVICES that shows one device (Slurm's --gpus-per-task=1): it is this
  // rank's own, whatever its LOCAL_RANK.
  MachineInfo own = gpus(1);
  own.cuda_visible_devices = "3";
  const ResolvedConfig mine =
      resolved_of(config_of({{"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"}}), own);
  CHECK(mine.device == 0);
  CHECK(mine.device_reason ==
        "the one device CUDA_VISIBLE_DEVICES=3 shows this rank (LOCAL_RANK=3, STRATA_DEVICE "
        "unset)");
  CHECK(mine.gpu_sharing == 1);
  CHECK(mine.gpu_bytes == 64 * kGiB);
}

TEST_CASE("Percentages of RAM are of this rank's share: RAM / LOCAL_WORLD_SIZE",
          "[config][local]") {
  // 64 GiB over 4 ranks: 25% of the 16 GiB share.
  ResolvedConfig r =
      resolved_of(config_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}}), fake_cuda_machine());
  CHECK(r.local_ranks == 4);
  CHECK(r.cpu_bytes == 4 * kGiB);
  CHECK(r.cpu_bytes_basis ==
        "25% of this rank's share of RAM (64.00 GiB / LOCAL_WORLD_SIZE=4 = 16.00 GiB)");
  CHECK(contains(render(r),
                 "STRATA_CPU_BYTES     = 4.00 GiB (4294967296 bytes): 25% of this "
                 "rank's share of RAM (64.00 GiB / LOCAL_WORLD_SIZE=4 = 16.00 GiB)\n"));
  // One rank: the whole machine, as before.
  CHECK(resolved_of(Config{}, fake_cuda_machine()).cpu_bytes_basis ==
        "25% of the 64.00 GiB of physical memory (from test)");
  CHECK(resolved_of(Config{}, fake_cuda_machine()).cpu_bytes == 16 * kGiB);

  // The host backend's arena is host memory: its percentage too.
  Config host = config_of({{"LOCAL_RANK", "0"},
                           {"LOCAL_WORLD_SIZE", "4"},
                           {"STRATA_GPU_BYTES", "50%"},
                           {"STRATA_CPU_BYTES", "50%"}});
  r = resolved_of(host, fake_machine());
  CHECK(r.gpu_bytes == 8 * kGiB);
  CHECK(r.cpu_bytes == 8 * kGiB);
  CHECK(contains(r.gpu_bytes_basis, "50% of this rank's share of RAM"));
}

TEST_CASE("Absolute sizes: the sum over LOCAL_WORLD_SIZE ranks must fit RAM", "[config][local]") {
  Config c = config_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}});
  c.cpu_bytes = SizeSetting::of_bytes(16 * kGiB);  // 4 × 16 GiB = all 64 GiB: fits
  CHECK(resolved_of(c, fake_cuda_machine()).cpu_bytes == 16 * kGiB);
  CHECK(resolved_of(c, fake_cuda_machine()).cpu_bytes_basis.empty());

  c.cpu_bytes = SizeSetting::of_bytes(20 * kGiB);  // fits the machine, not four times
  absl::StatusOr<ResolvedConfig> r = resolve(c, fake_cuda_machine());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(r.status().message()) ==
        "STRATA_CPU_BYTES (20.00 GiB) per rank × LOCAL_WORLD_SIZE=4 ranks on this node = "
        "80.00 GiB exceed the 64.00 GiB of physical memory (from test): every local rank pins "
        "its own; lower them, or use percentages, which are of this rank's share of RAM "
        "(64.00 GiB / LOCAL_WORLD_SIZE=4 = 16.00 GiB)");

  // On host the arena counts too.
  c.cpu_bytes = SizeSetting::of_bytes(8 * kGiB);
  c.gpu_bytes = SizeSetting::of_bytes(9 * kGiB);
  CHECK(contains(resolve_error(c, fake_machine()),
                 "STRATA_CPU_BYTES (8.00 GiB) + STRATA_GPU_BYTES (9.00 GiB, host memory on the "
                 "host backend) per rank × LOCAL_WORLD_SIZE=4 ranks on this node = 68.00 GiB "
                 "exceed"));
  c.gpu_bytes = SizeSetting::of_bytes(8 * kGiB);
  CHECK(resolved_of(c, fake_machine()).gpu_bytes == 8 * kGiB);
}

TEST_CASE("Ranks sharing a GPU divide it", "[config][local]") {
  // Two ranks told to share device 0: 80% of half the GPU each, 40% of it.
  Config two = config_of({{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"STRATA_DEVICE", "0"}});
  ResolvedConfig r = resolved_of(two, gpus(1));
  CHECK(r.gpu_sharing == 2);
  CHECK(r.gpu_bytes == 32 * kGiB);  // 40% of 80 GiB
  CHECK(r.gpu_sharing_reason ==
        "STRATA_DEVICE is set and LOCAL_WORLD_SIZE=2 ranks share 1 visible CUDA device: at least "
        "2 per device");
  CHECK(r.gpu_bytes_basis ==
        "80% of this rank's share of GPU 0 (80.00 GiB / 2 ranks sharing it = 40.00 GiB, at most "
        "the 80.00 GiB free; STRATA_DEVICE is set and LOCAL_WORLD_SIZE=2 ranks share 1 visible "
        "CUDA device: at least 2 per device)");
  CHECK(contains(render(r),
                 "STRATA_DEVICE        = 0: from STRATA_DEVICE=0; shared by 2 local "
                 "ranks ("));

  // The share is at most what is free: another rank may have taken its arena already.
  MachineInfo busy = gpus(1);
  busy.gpu->free_bytes = 30 * kGiB;
  CHECK(resolved_of(two, busy).gpu_bytes == 24 * kGiB);  // 80% of 30 GiB

  // An absolute size, times the ranks sharing the device, must fit it.
  two.gpu_bytes = SizeSetting::of_bytes(50 * kGiB);
  CHECK(resolve_error(two, gpus(1)) ==
        "STRATA_GPU_BYTES=50GiB (50.00 GiB) × 2 ranks sharing the device = 100.00 GiB is more "
        "than the 80.00 GiB of GPU 0 (Test GPU; STRATA_DEVICE is set and LOCAL_WORLD_SIZE=2 "
        "ranks share 1 visible CUDA device: at least 2 per device): lower it, or use a "
        "percentage such as 80%, which is of this rank's share");
  two.gpu_bytes = SizeSetting::of_bytes(40 * kGiB);
  CHECK(resolved_of(two, gpus(1)).gpu_bytes == 40 * kGiB);

  // Four ranks over two devices by STRATA_DEVICE: two per device.
  r = resolved_of(
      config_of({{"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"}, {"STRATA_DEVICE", "1"}}),
      gpus(2, 1));
  CHECK(r.gpu_sharing == 2);
  CHECK(r.gpu_bytes == 32 * kGiB);
  // Neither set: every local rank uses device 0.
  r = resolved_of(config_of({{"LOCAL_WORLD_SIZE", "4"}}), gpus(2));
  CHECK(r.gpu_sharing == 4);
  CHECK(r.gpu_sharing_reason ==
        "LOCAL_RANK is unset, so all LOCAL_WORLD_SIZE=4 ranks use device 0");
  CHECK(r.gpu_bytes == 16 * kGiB);
  // LOCAL_RANK picks: one device per rank.
  r = resolved_of(config_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}}), gpus(2));
  CHECK(r.gpu_sharing == 1);
  CHECK(r.gpu_bytes == 64 * kGiB);
}

TEST_CASE("LOCAL_RANK without LOCAL_WORLD_SIZE is a warning", "[config][local]") {
  const ResolvedConfig r = resolved_of(config_of({{"LOCAL_RANK", "2"}}), fake_machine());
  REQUIRE(r.warnings.size() == 1);
  CHECK(contains(r.warnings[0], "LOCAL_RANK=2 is set but LOCAL_WORLD_SIZE is not"));
  CHECK(r.cpu_bytes == 16 * kGiB);  // the whole node's 25%, as the warning says
}

TEST_CASE("The memlock check compares what io_uring registers", "[config][local]") {
  MachineInfo m = fake_machine();
  m.paths = {fake_path("/nvme0", 100 * kGiB), fake_path("/nvme1", 100 * kGiB)};
  Config c = config_of({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}});
  c.nvme_paths = {"/nvme0", "/nvme1"};
  c.cpu_bytes = SizeSetting::of_bytes(kGiB);

  ResolvedConfig r = resolved_of(c, m);
  // The whole CPU tier, once per path's ring; the kernel charges both ranks to the one user.
  CHECK(io_uring_registered_bytes(r) == 2 * kGiB);
  CHECK(io_uring_registered_bytes_per_user(r) == 4 * kGiB);
  CHECK(r.warnings.empty());  // unlimited

  // Staging (256 MiB) fits this limit; the registration does not.
  m.memlock_limit_bytes = 3 * kGiB;
  r = resolved_of(c, m);
  REQUIRE(r.warnings.size() == 1);
  CHECK(r.warnings[0] ==
        "the pinned CPU tier is registered with io_uring once per NVMe path, and the kernel "
        "charges every local rank's registration to the one user: STRATA_CPU_BYTES (1.00 GiB) "
        "× 2 NVMe paths × LOCAL_WORLD_SIZE=2 ranks = 4.00 GiB is above RLIMIT_MEMLOCK "
        "(3.00 GiB) and the process lacks CAP_IPC_LOCK: the tier will not all be registered "
        "(NVMe reads cost about 4x more CPU per GB); raise the limit (ulimit -l unlimited, "
        "docker run --ulimit memlock=-1, LimitMEMLOCK=infinity in systemd)");
  m.memlock_limit_bytes = 4 * kGiB;
  CHECK(resolved_of(c, m).warnings.empty());

  // Nothing is registered with psync, or without an NVMe tier.
  m.memlock_limit_bytes = kMiB;
  c.io_engine = IoEngineKind::kPsync;
  r = resolved_of(c, m);
  CHECK(io_uring_registered_bytes(r) == 0);
  CHECK(r.warnings.empty());
  c.io_engine = IoEngineKind::kAuto;
  c.nvme_paths.clear();
  r = resolved_of(c, m);
  CHECK(io_uring_registered_bytes(r) == 0);
  CHECK(r.warnings.empty());
}

}  // namespace
}  // namespace strata
