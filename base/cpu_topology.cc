#include "strata/base/cpu_topology.h"

#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "strata/base/system.h"
#include "strata/base/text.h"

namespace strata {
namespace {

using text::cat;
using text::to_absl;

// Upper bound for CPU masks: the kernel refuses a mask shorter than its own (EINVAL), so the
// mask grows until it fits.
constexpr int kMaxCpus = 1 << 16;

struct CpuMask {
  explicit CpuMask(int cpus) : count(cpus), set(CPU_ALLOC(cpus)), bytes(CPU_ALLOC_SIZE(cpus)) {
    CPU_ZERO_S(bytes, set.get());
  }
  struct Free {
    void operator()(cpu_set_t* s) const { CPU_FREE(s); }
  };
  std::vector<int> list() const {
    std::vector<int> out;
    for (int cpu = 0; cpu < count; ++cpu) {
      if (CPU_ISSET_S(cpu, bytes, set.get())) out.push_back(cpu);
    }
    return out;
  }
  int count;
  std::unique_ptr<cpu_set_t, Free> set;
  size_t bytes;
};

// Calls get(mask) with masks of growing size until the kernel accepts one.
template <typename Get>
absl::StatusOr<std::vector<int>> read_mask(std::string_view what, const Get& get) {
  for (int cpus = 1024; cpus <= kMaxCpus; cpus *= 2) {
    CpuMask mask(cpus);
    const int err = get(mask);
    if (err == 0) return mask.list();
    if (err != EINVAL) return absl::InternalError(cat(what, " failed: ", sys::errno_text(err)));
  }
  return absl::InternalError(cat(what, " failed: more than ", kMaxCpus, " CPUs"));
}

}  // namespace

int CpuTopology::node_of_cpu(int cpu) const {
  for (const NumaNode& node : nodes) {
    if (std::binary_search(node.cpus.begin(), node.cpus.end(), cpu)) return node.id;
  }
  return -1;
}

absl::StatusOr<std::vector<int>> parse_cpu_list(std::string_view text) {
  std::string trimmed(text::to_std(absl::StripAsciiWhitespace(to_absl(text))));
  std::vector<int> cpus;
  if (trimmed.empty()) return cpus;
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        cat("'", text::to_std(absl::StripAsciiWhitespace(to_absl(text))), "' is not a CPU list (",
            why, "): use numbers and ranges such as 0-3,8-11"));
  };
  for (absl::string_view part : absl::StrSplit(trimmed, ',')) {
    part = absl::StripAsciiWhitespace(part);
    const size_t dash = part.find('-');
    int first = 0;
    int last = 0;
    if (dash == absl::string_view::npos) {
      if (!absl::SimpleAtoi(part, &first)) return bad(cat("'", text::to_std(part), "'"));
      last = first;
    } else if (!absl::SimpleAtoi(part.substr(0, dash), &first) ||
               !absl::SimpleAtoi(part.substr(dash + 1), &last)) {
      return bad(cat("'", text::to_std(part), "'"));
    }
    if (first < 0 || last < first || last >= kMaxCpus) {
      return bad(
          cat("'", text::to_std(part), "' is not an ascending range of CPUs below ", kMaxCpus));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  if (cpus.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? cat(cpus[i]) : cat(cpus[i], "-", cpus[j]);
    i = j + 1;
  }
  return out;
}

absl::StatusOr<CpuTopology> read_cpu_topology(const std::vector<int>& all_cpus,
                                              const std::string& node_dir) {
  namespace fs = std::filesystem;
  CpuTopology topology;
  std::error_code ec;
  std::vector<std::pair<int, fs::path>> entries;
  for (fs::directory_iterator it(node_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int id = 0;
    if (name.size() > 4 && name.starts_with("node") &&
        absl::SimpleAtoi(to_absl(std::string_view(name).substr(4)), &id) && id >= 0) {
      entries.emplace_back(id, it->path());
    }
  }
  if (entries.empty()) {
    topology.nodes.push_back(NumaNode{0, all_cpus});
    topology.source =
        cat(node_dir,
            ec ? cat(" cannot be read (", ec.message(), ")") : std::string(" has no nodeN entries"),
            ": one node assumed");
    return topology;
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& [id, path] : entries) {
    const fs::path list = path / "cpulist";
    std::ifstream in(list);
    if (!in) return absl::NotFoundError(cat(list.string(), " cannot be read"));
    std::stringstream content;
    content << in.rdbuf();
    absl::StatusOr<std::vector<int>> cpus = parse_cpu_list(content.str());
    if (!cpus.ok()) {
      return absl::InvalidArgumentError(cat(list.string(), ": ", cpus.status().message()));
    }
    topology.nodes.push_back(NumaNode{id, *std::move(cpus)});
  }
  topology.source = node_dir;
  topology.from_sysfs = true;
  return topology;
}

CpuTopology read_cpu_topology_or_one_node(const std::vector<int>& all_cpus,
                                          const std::string& node_dir) {
  absl::StatusOr<CpuTopology> topology = read_cpu_topology(all_cpus, node_dir);
  if (topology.ok()) return *std::move(topology);
  CpuTopology one;
  one.nodes.push_back(NumaNode{0, all_cpus});
  one.read_error = std::string(topology.status().message());
  one.source = cat(one.read_error, ": one node assumed");
  return one;
}

absl::StatusOr<std::vector<int>> allowed_cpus() {
  return read_mask("sched_getaffinity", [](CpuMask& m) {
    return sched_getaffinity(0, m.bytes, m.set.get()) == 0 ? 0 : errno;
  });
}

absl::StatusOr<std::vector<int>> thread_cpus() {
  return read_mask("pthread_getaffinity_np", [](CpuMask& m) {
    return pthread_getaffinity_np(pthread_self(), m.bytes, m.set.get());
  });
}

absl::Status set_thread_cpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::InvalidArgumentError("set_thread_cpus: no CPU given");
  CpuMask mask(std::max(1024, cpus.back() + 1));
  for (int cpu : cpus) CPU_SET_S(cpu, mask.bytes, mask.set.get());
  const int err = pthread_setaffinity_np(pthread_self(), mask.bytes, mask.set.get());
  if (err != 0) {
    return absl::InternalError(
        cat("pthread_setaffinity_np(", format_cpu_list(cpus), ") failed: ", sys::errno_text(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> numa_node_of(const void* address) {
  const long page = sysconf(_SC_PAGESIZE);
  void* pages[1] = {reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(address) &
                                            ~static_cast<uintptr_t>(page - 1))};
  int status[1] = {-1};
  // glibc has no wrapper (libnuma does): the raw system call, nodes == nullptr to query.
  if (syscall(SYS_move_pages, 0, 1UL, pages, nullptr, status, 0) != 0) {
    return absl::UnavailableError(cat("move_pages: ", sys::errno_text(errno)));
  }
  if (status[0] < 0) {
    return absl::UnavailableError(
        cat("move_pages: ", status[0] == -ENOENT ? std::string("the page is not populated yet")
                                                 : sys::errno_text(-status[0])));
  }
  return status[0];
}

}  // namespace strata
