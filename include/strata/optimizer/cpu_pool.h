// CpuPool: the threads the CPU Adam kernels run on, placed next to the memory they stream.
//
// The step is memory-bound, so where its threads run matters as much as how many there are: on
// a machine with several NUMA nodes, threads on the node that holds the optimizer states read
// them at local bandwidth, and cores the pool leaves free keep the data loader fed (DeepSpeed
// reports 1.3x from binding cores). A pool decides its CPUs once, on its first parallel run,
// from the memory that run touches:
//   1. the CPUs this process may run on (sched_getaffinity), grouped by NUMA node
//      (/sys/devices/system/node; without it, one node);
//   2. the node that holds the memory (move_pages); where that cannot be known (a page not yet
//      populated, the call refused), the node with the most allowed CPUs;
//   3. `reserve_cores` CPUs left free: taken off the chosen node's CPUs (the highest-numbered)
//      only as far as the other nodes' allowed CPUs do not already leave that many;
//   4. `threads` of those CPUs (0: all of them); more than the node has spill onto the other
//      nodes' CPUs, nearest ids first.
// Each thread is pinned to the chosen set while it works for the pool (and given back its own
// mask when it leaves), unless the set is every allowed CPU or `pin` is off. The result says
// which CPUs, which node and why (CpuPlacement::reason); strata-info prints it.
//
// Results do not depend on the placement: the kernels sum per fixed-size chunk in index order
// (cpu_adam.h), so any thread count or set of CPUs gives bit-identical states.
//
// Several pools in one process do not disturb each other: each pins only the threads while
// they run its work, and oneTBB shares its workers among the pools' arenas.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/base/cpu_topology.h"
#include "strata/config/cpu_pool_settings.h"

namespace strata {

struct CpuPlacement {
  std::vector<int> cpus;  // ascending; one pool thread each
  int node = 0;           // the NUMA node chosen
  bool pinned = false;    // threads are pinned to `cpus`
  // Why these CPUs: "node 1 holds the states; CPUs 16-31 of node 1 (2 left to the data loader:
  // 30-31)". One line.
  std::string reason;
};

// What the states' node is, as far as it is known: a node id, or why not ("move_pages:
// Operation not permitted").
struct StatesNode {
  std::optional<int> node;
  std::string unknown_why;
};

// Steps 1-4 above, with no system call: `topology` and `allowed` (ascending) as read by
// read_cpu_topology() and allowed_cpus(). InvalidArgument naming the setting for settings that
// no node choice can meet: reserve_cores >= the allowed CPUs, or threads > the allowed CPUs
// less reserve_cores.
absl::StatusOr<CpuPlacement> decide_cpu_placement(const CpuTopology& topology,
                                                  const std::vector<int>& allowed,
                                                  const CpuPoolSettings& settings,
                                                  const StatesNode& states);

// The placement this machine gives `settings` for memory at `near` (nullptr: not known yet), as
// strata-info prints it; reads sysfs and the affinity mask.
absl::StatusOr<CpuPlacement> cpu_placement_here(const CpuPoolSettings& settings, const void* near);

class CpuPool {
 public:
  // Reads the machine's topology and this process's CPUs, and checks `settings` against them
  // (the errors of decide_cpu_placement, prefixed "Adam pool: "). The CPUs themselves are chosen
  // on the first run.
  static absl::StatusOr<std::unique_ptr<CpuPool>> create(const CpuPoolSettings& settings);
  // The same over a given topology and CPU set (tests).
  static absl::StatusOr<std::unique_ptr<CpuPool>> create_for(const CpuPoolSettings& settings,
                                                             CpuTopology topology,
                                                             std::vector<int> allowed);
  ~CpuPool();
  CpuPool(const CpuPool&) = delete;
  CpuPool& operator=(const CpuPool&) = delete;

  // Runs body(i) for every i in [0, n) on the pool's threads, each thread taking one
  // contiguous run of indices (the same runs on every call), and returns when all are done.
  // `near`: memory the work touches, which places the pool on its first run (may be null).
  // Thread-safe; the calling thread takes part in the work (pinned while it does).
  void parallel_for(uint64_t n, const std::function<void(uint64_t)>& body, const void* near);

  // The placement, once the first run has decided it.
  std::optional<CpuPlacement> placement() const;
  const CpuPoolSettings& settings() const;

  struct Impl;
  explicit CpuPool(std::unique_ptr<Impl> impl);  // use create()

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
