// Which CPUs this process may run on and how they group into NUMA nodes, without libnuma or
// hwloc: the kernel's sysfs lists (/sys/devices/system/node/nodeN/cpulist), sched_getaffinity,
// and the move_pages query for the node of a page. Used to place a thread pool next to the
// memory it works on (offload/cpu_pool.h) and by strata-info.
#pragma once

#include <absl/status/statusor.h>

#include <string>
#include <string_view>
#include <vector>

namespace strata {

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // ascending; may be empty (a memory-only node)
};

struct CpuTopology {
  std::vector<NumaNode> nodes;  // ascending id; never empty
  // "/sys/devices/system/node" when read from there, or why one node was assumed
  // ("/sys/devices/system/node has no nodeN entries: one node assumed").
  std::string source;
  bool from_sysfs = false;
  std::string read_error;  // read_cpu_topology_or_one_node: why sysfs could not be used
  // The node holding `cpu`, or -1.
  int node_of_cpu(int cpu) const;
};

// The kernel's CPU list format: "0-3,8-11", "5", "" (none); spaces and a trailing newline are
// ignored. InvalidArgument quoting the text for anything else (a reversed range, a letter).
absl::StatusOr<std::vector<int>> parse_cpu_list(std::string_view text);
// The same format from an ascending list: {0,1,2,3,8} -> "0-3,8"; "none" when empty.
std::string format_cpu_list(const std::vector<int>& cpus);

// Reads nodeN/cpulist under `node_dir`. A missing directory, or one without nodeN entries
// (kernels built without NUMA, some containers), gives one node 0 holding `all_cpus`; an
// unreadable or malformed cpulist is an error naming the file.
absl::StatusOr<CpuTopology> read_cpu_topology(
    const std::vector<int>& all_cpus, const std::string& node_dir = "/sys/devices/system/node");

// read_cpu_topology, or where that fails (an unreadable or malformed cpulist) one node 0
// holding `all_cpus`, with the error in `read_error` and `source` ("...: one node assumed").
CpuTopology read_cpu_topology_or_one_node(const std::vector<int>& all_cpus,
                                          const std::string& node_dir = "/sys/devices/system/node");

// The CPUs this process may run on (sched_getaffinity of the calling thread), ascending.
absl::StatusOr<std::vector<int>> allowed_cpus();

// The CPUs the calling thread may run on, and setting them (pthread_{get,set}affinity_np).
absl::StatusOr<std::vector<int>> thread_cpus();
absl::Status set_thread_cpus(const std::vector<int>& cpus);

// The NUMA node of the page holding `address` (move_pages with no target nodes: a query that
// moves nothing and allocates nothing). An error says why it cannot be known: the page is not
// populated yet, or the call is refused (seccomp profiles refuse it without CAP_SYS_NICE).
absl::StatusOr<int> numa_node_of(const void* address);

}  // namespace strata
