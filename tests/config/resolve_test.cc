// resolve(), probe_machine() and load_configuration(): configuration against the machine.
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "fake_machine.h"
#include "strata/config/config.h"
#include "strata/config/machine_info.h"
#include "strata/runtime/swap_config.h"
#include "temp_dir.h"

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

// A fresh directory under the temp dir, removed at scope exit.
using testing::TempDir;

TEST_CASE("resolve: host defaults", "[config][resolve]") {
  const ResolvedConfig r = resolved_of(Config{}, fake_machine());
  CHECK(r.backend == Backend::kHost);
  CHECK(r.backend_reason == "test: host");
  CHECK(r.gpu_bytes == kGiB);       // 1GiB on host
  CHECK(r.cpu_bytes == 16 * kGiB);  // 25% of 64 GiB
  CHECK(r.nvme_paths.empty());
  CHECK(r.nvme_bytes == 0);
  CHECK(r.io_engine.kind == IoEngineKind::kIoUring);
  CHECK(r.io_depth == 32);
  CHECK(r.io_block == kMiB);
  CHECK(r.staging_bytes == 256 * kMiB);
  CHECK(r.verify);
  CHECK(r.log == LogLevel::kWarn);
  CHECK(r.warnings.empty());
}

TEST_CASE("resolve: GPU bytes on cuda are checked against free device memory",
          "[config][resolve]") {
  const MachineInfo m = fake_cuda_machine();
  CHECK(resolved_of(Config{}, m).gpu_bytes == 56 * kGiB);  // 80% of 70 GiB free
  Config c;
  c.gpu_bytes = SizeSetting::of_percent(50);
  CHECK(resolved_of(c, m).gpu_bytes == 35 * kGiB);
  c.gpu_bytes = SizeSetting::of_bytes(70 * kGiB);
  CHECK(resolved_of(c, m).gpu_bytes == 70 * kGiB);
  c.gpu_bytes = SizeSetting::of_bytes(75 * kGiB);
  absl::StatusOr<ResolvedConfig> r = resolve(c, m);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(r.status().message()) ==
        "STRATA_GPU_BYTES=75GiB (75.00 GiB) is more than the 70.00 GiB free on GPU 0 (Test GPU, "
        "80.00 GiB total): lower it or use a percentage such as 80%");
}

TEST_CASE("resolve: GPU bytes on host are a share of physical memory", "[config][resolve]") {
  Config c;
  c.gpu_bytes = SizeSetting::of_percent(50);
  c.cpu_bytes = SizeSetting::of_percent(10);
  CHECK(resolved_of(c, fake_machine()).gpu_bytes == 32 * kGiB);
  c.gpu_bytes = SizeSetting::of_bytes(65 * kGiB);
  CHECK(contains(resolve_error(c, fake_machine()),
                 "STRATA_GPU_BYTES=65GiB (65.00 GiB) is more than the 64.00 GiB of physical "
                 "memory (from test) that backs the host backend's arena"));
  // The arena and the CPU tier share the same memory on host (staging is carved from the tier).
  c.gpu_bytes = SizeSetting::of_percent(80);
  c.cpu_bytes = SizeSetting::of_percent(25);
  const std::string sum = resolve_error(c, fake_machine());
  CHECK(sum ==
        "STRATA_CPU_BYTES (16.00 GiB) + STRATA_GPU_BYTES (51.20 GiB, host memory on the host "
        "backend) exceed the 64.00 GiB of physical memory (from test): lower one of them");
  c.gpu_bytes = SizeSetting::of_percent(75);
  CHECK(resolved_of(c, fake_machine()).gpu_bytes == 48 * kGiB);  // 75% + 25%: fits exactly
}

TEST_CASE("resolve: CPU bytes against physical memory", "[config][resolve]") {
  Config c;
  c.cpu_bytes = SizeSetting::of_percent(40);
  CHECK(resolved_of(c, fake_machine()).cpu_bytes == 64 * kGiB * 2 / 5);
  c.cpu_bytes = SizeSetting::of_bytes(100 * kGiB);
  absl::StatusOr<ResolvedConfig> r = resolve(c, fake_machine());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(contains(std::string(r.status().message()),
                 "STRATA_CPU_BYTES=100GiB (100.00 GiB) is more than the 64.00 GiB of physical "
                 "memory (from test)"));
}

TEST_CASE("resolve: NVMe paths", "[config][resolve]") {
  MachineInfo m = fake_machine();
  m.paths = {fake_path("/nvme0", 100 * kGiB), fake_path("/nvme1", 40 * kGiB)};
  Config c;
  c.nvme_paths = {"/nvme0", "/nvme1"};
  ResolvedConfig r = resolved_of(c, m);
  CHECK(r.nvme_paths == c.nvme_paths);
  CHECK(r.nvme_bytes == 8 * kGiB);

  SECTION("a percentage is of each path's free space; the smallest, in whole I/O blocks") {
    c.nvme_bytes = SizeSetting::of_percent(10);
    CHECK(resolved_of(c, m).nvme_bytes == 4 * kGiB);
    c.nvme_bytes = SizeSetting::of_percent(33.3);
    CHECK(resolved_of(c, m).nvme_bytes == (40 * kGiB * 333 / 1000) / kMiB * kMiB);
  }
  SECTION("more than a path's free space names the path and its free space") {
    c.nvme_bytes = SizeSetting::of_bytes(50 * kGiB);
    absl::StatusOr<ResolvedConfig> e = resolve(c, m);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(std::string(e.status().message()) ==
          "STRATA_NVME_BYTES=50GiB (50.00 GiB per path) is more than the free space on "
          "'/nvme1': 40.00 GiB free of 160.00 GiB; lower it, use a percentage such as 50%, or "
          "free space");
  }
  SECTION("missing") {
    m.paths[1] = PathInfo{};
    m.paths[1].path = "/nvme1";
    m.paths[1].problem = "does not exist";
    const std::string e = resolve_error(c, m);
    CHECK(e ==
          "STRATA_NVME_PATHS entry '/nvme1' does not exist: create it (mkdir -p /nvme1) or "
          "remove it from STRATA_NVME_PATHS");
  }
  SECTION("not inspectable") {
    m.paths[1] = PathInfo{};
    m.paths[1].path = "/nvme1";
    m.paths[1].problem = "cannot be inspected: Permission denied (errno 13)";
    CHECK(contains(resolve_error(c, m),
                   "STRATA_NVME_PATHS entry '/nvme1' cannot be inspected: "
                   "Permission denied (errno 13): check the permissions"));
  }
  SECTION("not a directory") {
    m.paths[0].is_directory = false;
    CHECK(contains(resolve_error(c, m), "STRATA_NVME_PATHS entry '/nvme0' is not a directory"));
  }
  SECTION("not writable") {
    m.paths[0].writable = false;
    m.paths[0].problem = "is not writable: Read-only file system (errno 30)";
    absl::StatusOr<ResolvedConfig> e = resolve(c, m);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(contains(std::string(e.status().message()),
                   "STRATA_NVME_PATHS entry '/nvme0' is not writable: Read-only file system "
                   "(errno 30): fix its permissions or mount"));
  }
  SECTION("io_block must suit O_DIRECT on the device") {
    m.paths[1].logical_block_size = 8192;
    c.io_block = 4096;
    CHECK(contains(resolve_error(c, m),
                   "STRATA_IO_BLOCK=4KiB is not a multiple of the logical block size (8192 "
                   "bytes) of the device under '/nvme1'"));
  }
  SECTION("a path the machine was not probed for is a caller error") {
    c.nvme_paths.push_back("/nvme2");
    absl::StatusOr<ResolvedConfig> e = resolve(c, m);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(contains(std::string(e.status().message()), "'/nvme2'"));
  }
  SECTION("every path error is reported") {
    m.paths[0].exists = false;
    m.paths[1].writable = false;
    const std::string e = resolve_error(c, m);
    CHECK(contains(e, "2 configuration errors:"));
    CHECK(contains(e, "'/nvme0' does not exist"));
    CHECK(contains(e, "'/nvme1' is not writable"));
  }
}

TEST_CASE("resolve: I/O engine", "[config][resolve]") {
  MachineInfo m = fake_machine();
  m.paths = {fake_path("/nvme0", 100 * kGiB)};
  Config c;
  c.nvme_paths = {"/nvme0"};
  CHECK(resolved_of(c, m).io_engine.kind == IoEngineKind::kIoUring);
  {
    // auto is settled here once; the swap space is handed the decision and what was asked, so
    // a later failure of io_uring is judged as auto, never as an explicit io_uring.
    const ResolvedConfig ok = resolved_of(c, m);
    CHECK(ok.io_engine.requested == IoEngineKind::kAuto);
    CHECK(ok.io_engine.reason == "auto: the io_uring probe passed (test ring)");
    const SwapSpaceOptions swap = swap_space_options(ok, nullptr);
    CHECK(swap.engine == IoEngineKind::kAuto);
    REQUIRE(swap.decided.has_value());
    CHECK(swap.decided->requested == IoEngineKind::kAuto);
    CHECK(swap.decided->kind == IoEngineKind::kIoUring);
    CHECK(swap.decided->reason == ok.io_engine.reason);
    CHECK(swap.names.depth == "STRATA_IO_DEPTH");
  }

  m.io_uring.available = false;
  m.io_uring.detail = "io_uring_queue_init failed: Operation not permitted (errno 1)";
  ResolvedConfig r = resolved_of(c, m);
  CHECK(r.io_engine.kind == IoEngineKind::kPsync);
  CHECK(contains(r.io_engine.reason, "Operation not permitted"));
  REQUIRE(r.warnings.size() == 1);
  CHECK(contains(r.warnings[0], "NVMe I/O uses psync"));
  CHECK(r.io_engine.warning == r.warnings[0]);
  CHECK(contains(render(r), "STRATA_IO_ENGINE     = psync (auto: io_uring refused ("));

  c.io_engine = IoEngineKind::kIoUring;
  absl::StatusOr<ResolvedConfig> e = resolve(c, m);
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(contains(std::string(e.status().message()),
                 "STRATA_IO_ENGINE is io_uring but io_uring is unavailable here: "
                 "io_uring_queue_init failed: Operation not permitted (errno 1); set it to psync"));

  c.io_engine = IoEngineKind::kPsync;
  r = resolved_of(c, m);
  CHECK(r.io_engine.kind == IoEngineKind::kPsync);
  CHECK(r.io_engine.requested == IoEngineKind::kPsync);
  CHECK(r.io_engine.reason == "asked for by STRATA_IO_ENGINE");
  CHECK(r.warnings.empty());

  // Without an NVMe tier auto's fallback costs nothing: the decision says why, warns of nothing.
  c.io_engine = IoEngineKind::kAuto;
  c.nvme_paths.clear();
  m.paths.clear();
  r = resolved_of(c, m);
  CHECK(r.io_engine.kind == IoEngineKind::kPsync);
  CHECK(contains(r.io_engine.reason, "auto: io_uring refused"));
  CHECK(r.io_engine.warning.empty());
  CHECK(r.warnings.empty());
}

TEST_CASE("resolve: a CPU tier above RLIMIT_MEMLOCK is a warning, not an error",
          "[config][resolve]") {
  MachineInfo m = fake_machine();
  m.paths = {fake_path("/nvme0", 100 * kGiB)};
  m.memlock_limit_bytes = 8 * kMiB;
  Config c;
  c.nvme_paths = {"/nvme0"};
  ResolvedConfig r = resolved_of(c, m);
  REQUIRE(r.warnings.size() == 1);
  CHECK(contains(r.warnings[0],
                 "the pinned CPU tier is registered with io_uring once per NVMe path: "
                 "STRATA_CPU_BYTES (16.00 GiB) is above RLIMIT_MEMLOCK (8.00 MiB) and the "
                 "process lacks CAP_IPC_LOCK"));
  m.has_cap_ipc_lock = true;
  CHECK(resolved_of(c, m).warnings.empty());
}

TEST_CASE("resolve: values set from C++ are validated and named by their variable",
          "[config][resolve]") {
  const auto error_for = [](auto change) {
    Config c;
    change(c);
    return resolve_error(c, fake_machine());
  };
  CHECK(contains(error_for([](Config& c) { c.io_depth = 0; }),
                 "STRATA_IO_DEPTH=0 is out of range: use an integer from 1 to 4096"));
  CHECK(contains(error_for([](Config& c) { c.io_depth = 5000; }), "STRATA_IO_DEPTH=5000"));
  CHECK(contains(error_for([](Config& c) { c.io_block = 1000; }), "STRATA_IO_BLOCK=1000"));
  CHECK(contains(error_for([](Config& c) { c.io_block = 0; }), "STRATA_IO_BLOCK=0"));
  CHECK(contains(error_for([](Config& c) { c.staging_bytes = 4096; }),
                 "STRATA_STAGING_BYTES=4KiB is smaller than STRATA_IO_BLOCK=1MiB"));
  CHECK(contains(error_for([](Config& c) { c.staging_bytes = 0; }), "STRATA_STAGING_BYTES=0"));
  CHECK(contains(error_for([](Config& c) { c.device = -2; }), "STRATA_DEVICE=-2 is negative"));
  CHECK(contains(error_for([](Config& c) { c.gpu_bytes = SizeSetting::of_bytes(0); }),
                 "STRATA_GPU_BYTES=0 is zero"));
  CHECK(contains(error_for([](Config& c) { c.cpu_bytes = SizeSetting::of_percent(0); }),
                 "STRATA_CPU_BYTES='0%' is out of range"));

  MachineInfo with_path = fake_machine();
  with_path.paths = {fake_path("/a", 100 * kGiB)};
  Config paths;
  paths.nvme_paths = {"/a", ""};
  CHECK(contains(resolve_error(paths, with_path), "STRATA_NVME_PATHS='/a,' has an empty entry"));
  paths.nvme_paths = {"/a", "/a"};
  CHECK(contains(resolve_error(paths, with_path), "STRATA_NVME_PATHS='/a,/a' lists '/a' twice"));

  // Overrides take effect.
  absl::StatusOr<Config> from_env = Config::from_variables({{"STRATA_IO_DEPTH", "8"}});
  REQUIRE(from_env.ok());
  Config c = *from_env;
  c.io_depth = 128;
  c.verify = false;
  c.log = LogLevel::kDebug;
  c.cpu_bytes = SizeSetting::of_bytes(3 * kGiB);
  const ResolvedConfig r = resolved_of(c, fake_machine());
  CHECK(r.io_depth == 128);
  CHECK_FALSE(r.verify);
  CHECK(r.log == LogLevel::kDebug);
  CHECK(r.cpu_bytes == 3 * kGiB);
}

TEST_CASE("resolve: backend", "[config][resolve]") {
  Config c;
  c.backend = Backend::kCuda;
  const std::string e = resolve_error(c, fake_machine());
  CHECK(contains(e, "STRATA_BACKEND=cuda but the device layer chose host (test: host)"));
  c.backend = Backend::kHost;
  CHECK(resolved_of(c, fake_machine()).backend == Backend::kHost);

  MachineInfo unset = fake_machine();
  unset.backend = Backend::kAuto;
  absl::StatusOr<ResolvedConfig> r = resolve(Config{}, unset);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  MachineInfo no_gpu = fake_cuda_machine();
  no_gpu.gpu.reset();
  CHECK(resolve(Config{}, no_gpu).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("resolve: the Adam pool's settings against the CPUs this process may run on",
          "[config][resolve][cpu_pool]") {
  MachineInfo m = fake_machine();  // 8 CPUs
  Config c;
  c.adam_pool = {6, 2, false};
  CHECK(resolved_of(c, m).adam_pool == CpuPoolSettings{6, 2, false});
  c.adam_pool = {0, 8, true};
  CHECK(contains(resolve_error(c, m),
                 "STRATA_ADAM_RESERVE=8 reserves every CPU this process may "
                 "run on (8), leaving none to the Adam pool: use at most 7"));
  c.adam_pool = {7, 2, true};
  CHECK(contains(resolve_error(c, m),
                 "STRATA_ADAM_THREADS=7 is more than the 6 CPUs this process "
                 "may run on less STRATA_ADAM_RESERVE=2"));
  c.adam_pool = {9, 0, true};
  CHECK(contains(resolve_error(c, m), "STRATA_ADAM_THREADS=9 is more than the 8 CPUs"));
}

TEST_CASE("render lists every variable, aligned", "[config]") {
  MachineInfo m = fake_machine();
  m.paths = {fake_path("/nvme0", 100 * kGiB)};
  Config c;
  c.nvme_paths = {"/nvme0"};
  const std::string text = render(resolved_of(c, m));
  INFO(text);
  size_t column = std::string::npos;
  size_t lines = 0;
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    REQUIRE(end != std::string::npos);
    const std::string line = text.substr(start, end - start);
    const size_t equals = line.find(" = ");
    REQUIRE(equals != std::string::npos);
    if (column == std::string::npos) column = equals;
    CHECK(equals == column);
    start = end + 1;
    ++lines;
  }
  CHECK(lines == known_variables().size() + 2);  // and LOCAL_RANK, LOCAL_WORLD_SIZE
  for (std::string_view name : known_variables()) CHECK(contains(text, name));
  CHECK(contains(text, "\nLOCAL_RANK           = unset\n"));
  CHECK(contains(text, "STRATA_BACKEND       = host (test: host)\n"));
  CHECK(contains(text, "STRATA_NVME_BYTES    = 8.00 GiB (8589934592 bytes) per path\n"));
}

TEST_CASE("probe_path on real paths", "[config][machine]") {
  TempDir dir;
  PathInfo p = probe_path(dir.path());
  CHECK(p.exists);
  CHECK(p.is_directory);
  CHECK(p.writable);
  CHECK(p.problem.empty());
  CHECK(p.total_bytes > 0);
  CHECK(p.total_bytes >= p.free_bytes);
  CHECK_FALSE(p.filesystem.empty());
  CHECK(p.logical_block_size >= 512);
  // The write probe leaves nothing behind.
  CHECK(std::filesystem::is_empty(dir.path()));

  const std::string file = dir.path() + "/plain-file";
  std::ofstream(file) << "x";
  p = probe_path(file);
  CHECK(p.exists);
  CHECK_FALSE(p.is_directory);
  CHECK(p.problem == "is not a directory");

  p = probe_path(dir.path() + "/missing");
  CHECK_FALSE(p.exists);
  CHECK(p.problem == "does not exist");

  // Not writable, even for root: chmod does not stop root, but no file can be created in /proc
  // (access(W_OK) passes there for root, so this exercises the create-a-file probe).
  p = probe_path("/proc");
  CHECK(p.exists);
  CHECK(p.is_directory);
  CHECK_FALSE(p.writable);
  CHECK_FALSE(p.problem.empty());
  CHECK(p.filesystem == "proc");
}

TEST_CASE("probe_machine reports host facts", "[config][machine]") {
  TempDir dir;
  absl::StatusOr<MachineInfo> m = probe_machine({dir.path(), "/nonexistent/strata"});
  REQUIRE(m.ok());
  CHECK(m->physical_memory_bytes > 0);
  CHECK(m->available_memory_bytes <= m->physical_memory_bytes);
  CHECK(m->cpu_count >= 1);
  CHECK(m->memlock_limit_bytes > 0);
  CHECK_FALSE(m->io_uring.detail.empty());  // either what worked or why not
  CHECK(m->backend == Backend::kAuto);      // left for the device layer
  REQUIRE(m->paths.size() == 2);
  CHECK(m->paths[0].writable);
  CHECK_FALSE(m->paths[1].exists);

  // Resolving against the real probe names the variable and the missing path.
  m->backend = Backend::kHost;
  m->backend_reason = "test";
  Config c;
  c.nvme_paths = {dir.path(), "/nonexistent/strata"};
  c.nvme_bytes = SizeSetting::of_bytes(kMiB);
  c.cpu_bytes = SizeSetting::of_bytes(kMiB);
  c.gpu_bytes = SizeSetting::of_bytes(kMiB);
  c.staging_bytes = kMiB;
  c.io_engine = IoEngineKind::kPsync;
  CHECK(resolve_error(c, *m) ==
        "STRATA_NVME_PATHS entry '/nonexistent/strata' does not exist: create it (mkdir -p "
        "/nonexistent/strata) or remove it from STRATA_NVME_PATHS");
}

TEST_CASE("load_configuration on the host backend", "[config][machine]") {
  TempDir dir;
  Config c;
  c.backend = Backend::kHost;
  c.nvme_paths = {dir.path()};
  c.nvme_bytes = SizeSetting::of_bytes(16 * kMiB);
  c.cpu_bytes = SizeSetting::of_bytes(64 * kMiB);
  c.gpu_bytes = SizeSetting::of_bytes(64 * kMiB);
  c.staging_bytes = 16 * kMiB;
  absl::StatusOr<std::pair<ResolvedConfig, MachineInfo>> loaded = load_configuration(c);
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  const auto& [resolved, machine] = *loaded;
  CHECK(resolved.backend == Backend::kHost);
  CHECK(machine.backend == Backend::kHost);
  CHECK_FALSE(machine.backend_reason.empty());
  CHECK(resolved.nvme_bytes == 16 * kMiB);
  CHECK(resolved.io_engine.kind ==
        (machine.io_uring.available ? IoEngineKind::kIoUring : IoEngineKind::kPsync));

  c.nvme_paths = {dir.path() + "/missing"};
  loaded = load_configuration(c);
  REQUIRE_FALSE(loaded.ok());
  CHECK(contains(std::string(loaded.status().message()), "STRATA_NVME_PATHS entry"));
}

}  // namespace
}  // namespace strata
