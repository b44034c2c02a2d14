#include "strata/config/machine_info.h"

#include <absl/status/status.h>
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "strata/base/system.h"
#include "strata/base/text.h"
#include "strata/nvme/io_engine.h"

namespace strata {
namespace {

using namespace text;  // std::string_view helpers (Debian's Abseil has its own string_view)

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::optional<uint64_t> read_number(const std::string& path) {
  std::optional<std::string> text = read_text(path);
  uint64_t value = 0;
  if (!text || !absl::SimpleAtoi(to_absl(trim(*text)), &value)) return std::nullopt;
  return value;
}

// "Name: value" lines of /proc files.
std::optional<std::string> proc_field(const std::string& text, std::string_view name) {
  for (absl::string_view piece : absl::StrSplit(text, '\n')) {
    const std::string_view line = to_std(piece);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    if (trim(line.substr(0, colon)) == name) {
      return std::string(trim(line.substr(colon + 1)));
    }
  }
  return std::nullopt;
}

using sys::errno_text;

// The cgroup memory limit and usage files that apply to this process, v2 first, then v1.
struct CgroupMemory {
  std::string limit_file;
  uint64_t limit = std::numeric_limits<uint64_t>::max();
  std::optional<uint64_t> usage;
};

CgroupMemory cgroup_memory() {
  CgroupMemory result;
  const std::optional<std::string> self = read_text("/proc/self/cgroup");
  if (!self) return result;
  for (absl::string_view line : absl::StrSplit(*self, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    std::vector<std::pair<std::string, std::string>> candidates;  // limit file, usage file
    if (parts[0] == "0" && parts[1].empty()) {
      for (const std::string& dir :
           {cat("/sys/fs/cgroup", parts[2]), std::string("/sys/fs/cgroup")}) {
        candidates.emplace_back(dir + "/memory.max", dir + "/memory.current");
      }
    } else if (parts[1].find("memory") != std::string::npos) {
      for (const std::string& dir :
           {cat("/sys/fs/cgroup/memory", parts[2]), std::string("/sys/fs/cgroup/memory")}) {
        candidates.emplace_back(dir + "/memory.limit_in_bytes", dir + "/memory.usage_in_bytes");
      }
    }
    for (const auto& [limit_file, usage_file] : candidates) {
      // memory.max reads "max" when unlimited; v1 reads a huge number, ignored below.
      const std::optional<uint64_t> limit = read_number(limit_file);
      if (limit && *limit < result.limit) {
        result.limit = *limit;
        result.limit_file = limit_file;
        result.usage = read_number(usage_file);
        break;
      }
    }
  }
  return result;
}

void probe_memory(MachineInfo& m) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  m.physical_memory_bytes = pages > 0 && page_size > 0
                                ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
                                : 0;
  m.physical_memory_source = "sysconf(_SC_PHYS_PAGES)";
  m.available_memory_bytes = m.physical_memory_bytes;
  if (std::optional<std::string> meminfo = read_text("/proc/meminfo")) {
    uint64_t kib = 0;
    std::optional<std::string> field = proc_field(*meminfo, "MemAvailable");
    if (field && absl::SimpleAtoi(absl::StripSuffix(*field, " kB"), &kib)) {
      m.available_memory_bytes = std::min(m.physical_memory_bytes, kib * 1024);
    }
  }
  // In a container the machine's memory is not what the process may use.
  const CgroupMemory cgroup = cgroup_memory();
  if (cgroup.limit < m.physical_memory_bytes) {
    m.physical_memory_bytes = cgroup.limit;
    m.physical_memory_source = cgroup.limit_file;
    const uint64_t used = std::min(cgroup.usage.value_or(0), cgroup.limit);
    m.available_memory_bytes = std::min(m.available_memory_bytes, cgroup.limit - used);
  }
}

void probe_cpu(MachineInfo& m) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    m.cpu_count = static_cast<uint32_t>(CPU_COUNT(&set));
  } else {
    m.cpu_count = static_cast<uint32_t>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  }
  m.cpu_model = "unknown";
  if (std::optional<std::string> cpuinfo = read_text("/proc/cpuinfo")) {
    for (std::string_view name : {"model name", "Model", "cpu model"}) {
      if (std::optional<std::string> field = proc_field(*cpuinfo, name)) {
        m.cpu_model = *field;
        break;
      }
    }
  }
}

void probe_memlock(MachineInfo& m) {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
    m.memlock_limit_bytes = limit.rlim_cur == RLIM_INFINITY ? std::numeric_limits<uint64_t>::max()
                                                            : static_cast<uint64_t>(limit.rlim_cur);
  }
  // CAP_IPC_LOCK is bit 14 of the effective capability set.
  if (std::optional<std::string> status = read_text("/proc/self/status")) {
    uint64_t caps = 0;
    std::optional<std::string> field = proc_field(*status, "CapEff");
    if (field && absl::SimpleHexAtoi(*field, &caps)) m.has_cap_ipc_lock = (caps >> 14) & 1;
  }
}

std::string filesystem_name(int64_t type) {
  switch (static_cast<uint64_t>(type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0xF2F52010:
      return "f2fs";
    case 0x2FC12FC1:
      return "zfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlayfs";
    case 0x6969:
      return "nfs";
    case 0x65735546:
      return "fuse";
    case 0x01021997:
      return "9p";
    case 0x9FA0:
      return "proc";
    case 0x62656572:
      return "sysfs";
    case 0x858458F6:
      return "ramfs";
    default:
      return absl::StrFormat("unknown (0x%x)", static_cast<uint64_t>(type));
  }
}

// The logical block size of the block device under `st_dev`; partitions inherit their disk's.
std::optional<uint32_t> logical_block_size(dev_t device) {
  const std::string sys = cat("/sys/dev/block/", major(device), ":", minor(device));
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(sys, ec);
  if (ec) return std::nullopt;
  for (const std::filesystem::path& dir : {real, real.parent_path()}) {
    if (std::optional<uint64_t> size = read_number(dir / "queue/logical_block_size")) {
      if (*size > 0 && *size <= (1u << 16)) return static_cast<uint32_t>(*size);
    }
  }
  return std::nullopt;
}

}  // namespace

ParentEnvironment probe_parent_environment(int pid) {
  ParentEnvironment parent;
  parent.pid = pid;
  const std::string path = cat("/proc/", pid, "/environ");
  // NUL-separated NAME=value entries; another user's process (and a gone one) is refused.
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    parent.problem = cat(path, ": ", errno_text(errno));
    return parent;
  }
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string_view name(entry.data(), eq);
    if (name == "CUDA_VISIBLE_DEVICES") parent.cuda_visible_devices = entry.substr(eq + 1);
    if (name == "STRATA_DEVICE") parent.strata_device = entry.substr(eq + 1);
  }
  if (in.bad()) {
    parent.problem = cat(path, ": ", errno_text(errno));
    parent.cuda_visible_devices.reset();
    parent.strata_device.reset();
    return parent;
  }
  parent.readable = true;
  return parent;
}

const PathInfo* MachineInfo::find_path(std::string_view path) const {
  for (const PathInfo& info : paths) {
    if (info.path == path) return &info;
  }
  return nullptr;
}

PathInfo probe_path(const std::string& path) {
  PathInfo info;
  info.path = path;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    info.problem =
        errno == ENOENT ? "does not exist" : cat("cannot be inspected: ", errno_text(errno));
    return info;
  }
  info.exists = true;
  info.is_directory = S_ISDIR(st.st_mode);
  if (!info.is_directory) {
    info.problem = "is not a directory";
    return info;
  }
  if (struct statvfs vfs{}; statvfs(path.c_str(), &vfs) == 0) {
    info.free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    info.total_bytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  }
  if (struct statfs fs{}; statfs(path.c_str(), &fs) == 0) {
    info.filesystem = filesystem_name(static_cast<int64_t>(fs.f_type));
  }
  if (std::optional<uint32_t> size = logical_block_size(st.st_dev)) {
    info.logical_block_size = *size;
    info.block_size_known = true;
  }
  if (access(path.c_str(), W_OK) != 0) {
    info.problem = cat("is not writable: ", errno_text(errno));
    return info;
  }
  // access() trusts permission bits; root passes it where creating a file still fails
  // (read-only mounts seen through some layers, /proc, FUSE), so try for real.
  std::string name = cat(path, "/.strata-probe-XXXXXX");
  const int fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) {
    info.problem = cat("is not writable: no file can be created in it: ", errno_text(errno));
    return info;
  }
  close(fd);
  unlink(name.c_str());
  info.writable = true;
  return info;
}

absl::StatusOr<MachineInfo> probe_machine(const std::vector<std::string>& nvme_paths) {
  MachineInfo m;
  probe_memory(m);
  if (m.physical_memory_bytes == 0) {
    return absl::InternalError(
        "could not read the physical memory size (sysconf(_SC_PHYS_PAGES) failed); is /proc "
        "mounted?");
  }
  probe_cpu(m);
  probe_memlock(m);
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    m.cuda_visible_devices = visible;
  }
  m.parent = probe_parent_environment(static_cast<int>(getppid()));
  // The NVMe floor's own probe (a ring set up and a READ through it, once per process), so that
  // the facts shown here are the ones decide_io_engine() judges by.
  m.io_uring = probe_io_uring();
  for (const std::string& path : nvme_paths) m.paths.push_back(probe_path(path));
  return m;
}

}  // namespace strata
