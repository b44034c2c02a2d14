// resolve(): a Config checked against the machine, every size in bytes; load_configuration();
// render().
#include <absl/numeric/int128.h>
#include <absl/status/status.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config_internal.h"
#include "strata/base/text.h"
#include "strata/config/config.h"
#include "strata/config/nvme_settings.h"
#include "strata/device/backend.h"
#include "strata/nvme/io_engine.h"

namespace strata {

using namespace config_internal;  // NOLINT(build/namespaces): shared names of this module
using text::join;

absl::StatusOr<ResolvedConfig> resolve(const Config& config, const MachineInfo& machine) {
  // Caller errors first: without the machine's facts nothing else can be judged.
  for (const std::string& path : config.nvme_paths) {
    if (!path.empty() && machine.find_path(path) == nullptr) {
      return absl::FailedPreconditionError(
          cat("resolve() was given no facts for NVMe path '", path,
              "': probe it with probe_machine(config.nvme_paths), or call load_configuration()"));
    }
  }
  Errors errors;
  validate_values(config, errors);
  if (machine.backend == Backend::kAuto) {
    return absl::FailedPreconditionError(
        "resolve() needs MachineInfo::backend set to cuda or host: fill it from "
        "choose_backend(), or call load_configuration()");
  }
  if (machine.backend == Backend::kCuda && !machine.gpu) {
    return absl::FailedPreconditionError(
        "resolve() needs MachineInfo::gpu on the cuda backend: fill it from choose_backend()");
  }

  ResolvedConfig r;
  r.backend = machine.backend;
  r.backend_reason = machine.backend_reason;
  if (config.backend != Backend::kAuto && config.backend != machine.backend) {
    errors.add(absl::FailedPreconditionError(
        cat(kBackend, "=", to_string(config.backend), " but the device layer chose ",
            to_string(machine.backend), " (", machine.backend_reason,
            "): set STRATA_BACKEND=auto or make the requested backend available")));
  }
  r.device = config.device;
  r.io_depth = config.io_depth;
  r.io_block = config.io_block;
  r.staging_bytes = config.staging_bytes;
  r.verify = config.verify;
  r.log = config.log;
  r.comm = config.comm;
  r.nvme_paths = config.nvme_paths;

  const uint64_t physical = machine.physical_memory_bytes;
  const std::string physical_text = cat(format_bytes(physical), " of physical memory (from ",
                                        machine.physical_memory_source, ")");

  // GPU arena: on cuda out of free device memory; on host it is ordinary host memory.
  const bool cuda = machine.backend == Backend::kCuda;
  const SizeSetting gpu_setting = config.gpu_bytes.value_or(
      cuda ? SizeSetting::of_percent(80) : SizeSetting::of_bytes(uint64_t{1} << 30));
  const uint64_t gpu_total = cuda ? machine.gpu->free_bytes : physical;
  if (absl::StatusOr<uint64_t> gpu = gpu_setting.resolve(gpu_total, kGpuBytes); !gpu.ok()) {
    errors.add(gpu.status());
  } else if (*gpu > gpu_total) {
    const std::string has =
        cuda ? absl::StrFormat("the %s free on GPU %d (%s, %s total)", format_bytes(gpu_total),
                               machine.gpu->ordinal, machine.gpu->name,
                               format_bytes(machine.gpu->total_bytes))
             : cat("the ", physical_text, " that backs the host backend's arena");
    errors.add(absl::ResourceExhaustedError(cat(kGpuBytes, "=", gpu_setting.to_string(), " (",
                                                format_bytes(*gpu), ") is more than ", has,
                                                ": lower it or use a percentage such as 80%")));
  } else {
    r.gpu_bytes = *gpu;
  }

  if (absl::StatusOr<uint64_t> cpu = config.cpu_bytes.resolve(physical, kCpuBytes); !cpu.ok()) {
    errors.add(cpu.status());
  } else if (*cpu > physical) {
    errors.add(absl::ResourceExhaustedError(
        cat(kCpuBytes, "=", config.cpu_bytes.to_string(), " (", format_bytes(*cpu),
            ") is more than the ", physical_text, ": lower it or use a percentage such as 25%")));
  } else {
    r.cpu_bytes = *cpu;
  }

  // Pinned memory (and, on host, the arena) all come out of the same physical memory.
  if (r.cpu_bytes > 0 && (r.gpu_bytes > 0 || cuda) && errors.empty()) {
    const uint64_t host_arena = cuda ? 0 : r.gpu_bytes;
    const absl::uint128 wanted = absl::uint128(r.cpu_bytes) + host_arena + r.staging_bytes;
    if (wanted > physical) {
      errors.add(absl::ResourceExhaustedError(
          cat(kCpuBytes, " (", format_bytes(r.cpu_bytes), ") + ", kStagingBytes, " (",
              format_bytes(r.staging_bytes), ")",
              cuda ? ""
                   : cat(" + ", kGpuBytes, " (", format_bytes(host_arena),
                         ", host memory on the host backend)"),
              " exceed the ", physical_text, ": lower one of them")));
    }
  }

  // NVMe paths: each must be a writable directory with room for the swap files.
  std::optional<uint64_t> nvme_bytes;
  for (const std::string& path : config.nvme_paths) {
    if (path.empty()) continue;  // reported by validate_values
    const PathInfo* info = machine.find_path(path);
    const std::string entry = cat(kNvmePaths, " entry '", path, "'");
    if (!info->exists && (info->problem.empty() || info->problem == "does not exist")) {
      errors.add(absl::NotFoundError(cat(entry, " does not exist: create it (mkdir -p ", path,
                                         ") or remove it from ", kNvmePaths)));
      continue;
    }
    if (!info->exists) {
      errors.add(absl::PermissionDeniedError(
          cat(entry, " ", info->problem,
              ": check the permissions of its parent directories or choose another one")));
      continue;
    }
    if (!info->is_directory) {
      errors.add(absl::FailedPreconditionError(
          cat(entry,
              " is not a directory: give directories in which strata may create its swap "
              "files")));
      continue;
    }
    if (!info->writable) {
      errors.add(absl::PermissionDeniedError(
          cat(entry, " ", info->problem.empty() ? "is not writable" : info->problem,
              ": fix its permissions or mount, or choose another directory")));
      continue;
    }
    absl::StatusOr<uint64_t> bytes = config.nvme_bytes.resolve(info->free_bytes, kNvmeBytes);
    if (!bytes.ok()) {
      errors.add(bytes.status());
    } else if (*bytes > info->free_bytes) {
      errors.add(absl::ResourceExhaustedError(
          cat(kNvmeBytes, "=", config.nvme_bytes.to_string(), " (", format_bytes(*bytes),
              " per path) is more than the free space on '", path,
              "': ", format_bytes(info->free_bytes), " free of ", format_bytes(info->total_bytes),
              "; lower it, use a percentage such as 50%, or free space")));
    } else {
      nvme_bytes = std::min(nvme_bytes.value_or(*bytes), *bytes);
    }
    if (config.io_block % info->logical_block_size != 0) {
      errors.add(invalid(cat(kIoBlock, "=", size_text(config.io_block),
                             " is not a multiple of the logical block size (",
                             info->logical_block_size, " bytes) of the device under '", path,
                             "', which O_DIRECT needs: use a multiple of it")));
    }
  }
  if (nvme_bytes && config.io_block > 0) {
    // Whole I/O blocks only; equal on every path so that stripes line up.
    r.nvme_bytes = *nvme_bytes / config.io_block * config.io_block;
    if (r.nvme_bytes == 0) {
      errors.add(invalid(cat(kNvmeBytes, "=", config.nvme_bytes.to_string(), " (",
                             format_bytes(*nvme_bytes), ") is less than one ", kIoBlock, " (",
                             format_bytes(config.io_block), "): raise it")));
    }
  }

  // I/O engine: decided once, by the NVMe floor's decide_io_engine(), from the machine's probe;
  // the swap space starts what was decided here (and decides again only if io_uring then fails
  // under auto).
  r.io_engine_requested = config.io_engine;
  absl::StatusOr<IoEngineDecision> engine = decide_io_engine(
      config.io_engine, IoUringProbe{machine.io_uring_available, machine.io_uring_detail},
      io_setting_names());
  if (!engine.ok()) {
    errors.add(engine.status());
  } else {
    r.io_engine = engine->kind;
    r.io_engine_reason = engine->reason;
    if (!config.nvme_paths.empty()) {  // without an NVMe tier the fallback costs nothing
      r.io_engine_warning = engine->warning;
      if (!engine->warning.empty()) r.warnings.push_back(engine->warning);
    }
  }
  if (r.io_engine == IoEngineKind::kIoUring && !config.nvme_paths.empty() &&
      !memlock_allows(machine, config.staging_bytes)) {
    r.warnings.push_back(
        cat(kStagingBytes, "=", size_text(config.staging_bytes), " is above RLIMIT_MEMLOCK (",
            format_bytes(machine.memlock_limit_bytes),
            ") and the process lacks CAP_IPC_LOCK: staging buffers will not be registered with "
            "io_uring (reads cost about 4x more CPU per GB); raise the limit (ulimit -l unlimited, "
            "docker run --ulimit memlock=-1, LimitMEMLOCK=infinity in systemd)"));
  }

  if (!errors.empty()) return errors.status();
  return r;
}

absl::StatusOr<std::pair<ResolvedConfig, MachineInfo>> load_configuration(const Config& config) {
  absl::StatusOr<MachineInfo> machine = probe_machine(config.nvme_paths);
  if (!machine.ok()) return machine.status();
  absl::StatusOr<BackendChoice> choice = choose_backend(config.backend, config.device);
  if (!choice.ok()) return choice.status();
  machine->backend = choice->backend;
  machine->backend_reason = std::move(choice->reason);
  machine->gpu = std::move(choice->gpu);
  absl::StatusOr<ResolvedConfig> resolved = resolve(config, *machine);
  if (!resolved.ok()) return resolved.status();
  return std::make_pair(*std::move(resolved), *std::move(machine));
}

std::string render(const ResolvedConfig& c) {
  const auto bytes = [](uint64_t b) { return cat(format_bytes(b), " (", b, " bytes)"); };
  const std::vector<std::pair<std::string_view, std::string>> rows = {
      {kBackend, cat(to_string(c.backend), " (", c.backend_reason, ")")},
      {kDevice, c.backend == Backend::kCuda ? cat(c.device) : cat(c.device, " (unused on host)")},
      {kGpuBytes, bytes(c.gpu_bytes)},
      {kCpuBytes, bytes(c.cpu_bytes)},
      {kNvmePaths,
       c.nvme_paths.empty() ? std::string("(none: no NVMe tier)") : join(c.nvme_paths, ",")},
      {kNvmeBytes, c.nvme_paths.empty() ? std::string("0 (no NVMe tier)")
                                        : cat(bytes(c.nvme_bytes), " per path")},
      {kIoEngine, cat(to_string(c.io_engine), " (", c.io_engine_reason, ")")},
      {kIoDepth, cat(c.io_depth)},
      {kIoBlock, bytes(c.io_block)},
      {kStagingBytes, bytes(c.staging_bytes)},
      {kVerify, c.verify ? "on" : "off"},
      {kLog, std::string(to_string(c.log))},
      {kCommBackend, std::string(to_string(c.comm.backend))},
      {kCommTimeout, format_duration(c.comm.timeout)},
      {kCommDebug, c.comm.debug ? "on" : "off"},
  };
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  std::string out;
  for (const auto& [name, value] : rows) {
    out += cat(name, std::string(width - name.size(), ' '), " = ", value, "\n");
  }
  return out;
}

}  // namespace strata
