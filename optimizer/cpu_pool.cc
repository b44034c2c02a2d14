// CpuPool: the placement decision and the pinned oneTBB arena the Adam kernels run in.
#include "strata/optimizer/cpu_pool.h"

#include <absl/status/status.h>
#include <absl/synchronization/mutex.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include <algorithm>
#include <thread>

#include "strata/base/log.h"
#include "strata/base/mutex.h"
#include "strata/base/text.h"

namespace strata {
namespace {

using text::cat;

std::vector<int> intersect(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// Pins every thread that enters the arena to the pool's CPUs and gives it back its own mask
// when it leaves: oneTBB's workers serve every arena of the process, and the thread that calls
// execute() is the caller's, so neither may keep the pool's mask afterwards.
class PinObserver final : public tbb::task_scheduler_observer {
 public:
  PinObserver(tbb::task_arena& arena, std::vector<int> cpus)
      : tbb::task_scheduler_observer(arena), cpus_(std::move(cpus)) {
    observe(true);
  }
  ~PinObserver() override { observe(false); }

  void on_scheduler_entry(bool /*is_worker*/) override {
    absl::StatusOr<std::vector<int>> own = thread_cpus();
    saved().push_back(own.ok() ? *std::move(own) : std::vector<int>{});
    if (absl::Status st = set_thread_cpus(cpus_); !st.ok()) {
      log::warn_once(cat("Adam pool: a thread could not be pinned (", st.message(),
                         "); it runs where the kernel puts it"));
    }
  }
  void on_scheduler_exit(bool /*is_worker*/) override {
    std::vector<std::vector<int>>& stack = saved();
    if (stack.empty()) return;
    std::vector<int> own = std::move(stack.back());
    stack.pop_back();
    if (!own.empty()) (void)set_thread_cpus(own);
  }

 private:
  // A stack, should a thread enter one pool's arena from inside another's.
  static std::vector<std::vector<int>>& saved() {
    thread_local std::vector<std::vector<int>> stack;
    return stack;
  }
  const std::vector<int> cpus_;
};

}  // namespace

absl::StatusOr<CpuPlacement> decide_cpu_placement(const CpuTopology& topology,
                                                  const std::vector<int>& allowed,
                                                  const CpuPoolSettings& settings,
                                                  const StatesNode& states) {
  const uint64_t n_allowed = allowed.size();
  if (n_allowed == 0) {
    return absl::FailedPreconditionError("this process may run on no CPU (empty affinity mask)");
  }
  if (settings.reserve_cores >= n_allowed) {
    return absl::InvalidArgumentError(cat(
        "reserve_cores ", settings.reserve_cores, " reserves every CPU this process may run on (",
        n_allowed, ": ", format_cpu_list(allowed), "), leaving none to the Adam pool: use at most ",
        n_allowed - 1));
  }
  const uint64_t usable = n_allowed - settings.reserve_cores;
  if (settings.threads > usable) {
    return absl::InvalidArgumentError(
        cat("threads ", settings.threads, " is more than the ", usable,
            " CPUs this process may run on (", format_cpu_list(allowed), ")",
            settings.reserve_cores > 0 ? cat(" less reserve_cores ", settings.reserve_cores) : "",
            ": use at most ", usable, ", or 0 for every CPU of the states' node"));
  }

  // The allowed CPUs of each node; the most populated node is the fallback. Allowed CPUs that
  // no node lists (a topology that disagrees with the affinity mask) are used last, when
  // threads spill; with no node listing any, they are one node.
  std::vector<std::vector<int>> local(topology.nodes.size());
  std::vector<int> listed;
  size_t most = 0;
  for (size_t i = 0; i < topology.nodes.size(); ++i) {
    local[i] = intersect(topology.nodes[i].cpus, allowed);
    listed.insert(listed.end(), local[i].begin(), local[i].end());
    if (local[i].size() > local[most].size()) most = i;
  }
  std::sort(listed.begin(), listed.end());
  std::vector<int> unlisted;
  std::set_difference(allowed.begin(), allowed.end(), listed.begin(), listed.end(),
                      std::back_inserter(unlisted));
  if (listed.empty()) {
    if (local.empty()) local.emplace_back();
    local[0] = allowed;
    unlisted.clear();
    most = 0;
  }
  const int most_id = topology.nodes.empty() ? 0 : topology.nodes[most].id;
  size_t with_cpus = 0;
  for (const auto& cpus : local) with_cpus += cpus.empty() ? 0 : 1;
  size_t chosen = most;
  std::string why;
  const auto most_text = [&] {
    return cat("node ", most_id, " has the most allowed CPUs (", local[most].size(), ")");
  };
  if (with_cpus <= 1) {
    why = cat("one NUMA node with allowed CPUs (node ", most_id, ")");
  } else if (!states.node) {
    why = cat("the states' node is unknown (", states.unknown_why, "); ", most_text());
  } else {
    const auto it = std::find_if(topology.nodes.begin(), topology.nodes.end(),
                                 [&](const NumaNode& n) { return n.id == *states.node; });
    const size_t index = static_cast<size_t>(it - topology.nodes.begin());
    if (it == topology.nodes.end() || local[index].empty()) {
      why = cat("node ", *states.node,
                " holds the states but this process may run on none of its CPUs; ", most_text());
    } else {
      chosen = index;
      why = cat("node ", *states.node, " holds the states");
    }
  }

  // Leave reserve_cores free: other nodes' allowed CPUs count first.
  std::vector<int> cpus = local[chosen];
  const uint64_t elsewhere = n_allowed - cpus.size();
  const uint64_t take = settings.reserve_cores > elsewhere ? settings.reserve_cores - elsewhere : 0;
  const std::vector<int> reserved(cpus.end() - static_cast<ptrdiff_t>(take), cpus.end());
  cpus.resize(cpus.size() - take);
  std::string notes;
  if (take > 0) {
    notes += cat("; ", take, " left to the data loader (", format_cpu_list(reserved), ")");
  } else if (settings.reserve_cores > 0) {
    notes += cat("; the other nodes leave ", elsewhere, " CPUs free (reserve_cores ",
                 settings.reserve_cores, ")");
  }
  if (settings.threads > 0 && settings.threads < cpus.size()) {
    cpus.resize(settings.threads);
  } else if (settings.threads > cpus.size()) {
    // Spill onto the other nodes, in node order, then onto CPUs no node lists.
    std::vector<int> spill;
    local.push_back(unlisted);
    for (size_t i = 0; i < local.size() && cpus.size() + spill.size() < settings.threads; ++i) {
      if (i == chosen) continue;
      for (int cpu : local[i]) {
        if (cpus.size() + spill.size() == settings.threads) break;
        spill.push_back(cpu);
      }
    }
    notes += cat("; threads ", settings.threads, " exceed the node's ", cpus.size(), " CPUs: also ",
                 format_cpu_list(spill), " of other nodes");
    cpus.insert(cpus.end(), spill.begin(), spill.end());
    std::sort(cpus.begin(), cpus.end());
  }

  CpuPlacement out;
  out.node = chosen < topology.nodes.size() ? topology.nodes[chosen].id : 0;
  out.pinned = settings.pin && cpus != allowed;
  out.reason = cat(why, "; CPUs ", format_cpu_list(cpus), " (", cpus.size(),
                   cpus.size() == 1 ? " thread)" : " threads)", notes,
                   out.pinned     ? "; pinned"
                   : settings.pin ? "; not pinned: every allowed CPU"
                                  : "; not pinned (pin off)");
  out.cpus = std::move(cpus);
  return out;
}

namespace {

StatesNode states_node(const CpuTopology& topology, const void* near) {
  if (topology.nodes.size() <= 1) return {topology.nodes.front().id, ""};
  if (near == nullptr) return {std::nullopt, "no states yet"};
  absl::StatusOr<int> node = numa_node_of(near);
  if (!node.ok()) return {std::nullopt, std::string(node.status().message())};
  return {*node, ""};
}

// A sysfs that cannot be read costs the placement, never the optimizer: one node is assumed,
// and said (strata-info's source, one warning).
absl::StatusOr<std::pair<CpuTopology, std::vector<int>>> read_machine() {
  absl::StatusOr<std::vector<int>> allowed = allowed_cpus();
  if (!allowed.ok()) return allowed.status();
  CpuTopology topology = read_cpu_topology_or_one_node(*allowed);
  if (!topology.read_error.empty()) log::warn_once(cat("Adam pool: ", topology.source));
  return std::make_pair(std::move(topology), *std::move(allowed));
}

}  // namespace

absl::StatusOr<CpuPlacement> cpu_placement_here(const CpuPoolSettings& settings, const void* near) {
  auto machine = read_machine();
  if (!machine.ok()) return machine.status();
  return decide_cpu_placement(machine->first, machine->second, settings,
                              states_node(machine->first, near));
}

struct CpuPool::Impl {
  CpuPoolSettings settings;
  CpuTopology topology;
  std::vector<int> allowed;

  mutable absl::Mutex mu;
  std::optional<CpuPlacement> placement ABSL_GUARDED_BY(mu);
  // Declared before the observer, which must stop observing before the arena goes.
  std::unique_ptr<tbb::task_arena> arena;
  std::unique_ptr<PinObserver> observer;

  // Decides the placement and builds the arena on the first run; later runs only read them.
  const CpuPlacement& place(const void* near) ABSL_LOCKS_EXCLUDED(mu) {
    MutexLock lock(&mu);
    if (!placement) {
      // Cannot fail: create() checked the settings, and no node choice changes the verdict.
      absl::StatusOr<CpuPlacement> decided =
          decide_cpu_placement(topology, allowed, settings, states_node(topology, near));
      placement = decided.ok() ? *std::move(decided)
                               : CpuPlacement{allowed, topology.nodes.front().id, false,
                                              std::string(decided.status().message())};
      const int threads = static_cast<int>(placement->cpus.size());
      arena = std::make_unique<tbb::task_arena>(threads);
      arena->initialize();
      if (placement->pinned) observer = std::make_unique<PinObserver>(*arena, placement->cpus);
      STRATA_LOG(kInfo, "Adam pool: %s", placement->reason);
    }
    return *placement;
  }
};

CpuPool::CpuPool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuPool::~CpuPool() = default;

absl::StatusOr<std::unique_ptr<CpuPool>> CpuPool::create(const CpuPoolSettings& settings) {
  auto machine = read_machine();
  if (!machine.ok()) {
    return absl::Status(machine.status().code(), cat("Adam pool: ", machine.status().message()));
  }
  return create_for(settings, std::move(machine->first), std::move(machine->second));
}

absl::StatusOr<std::unique_ptr<CpuPool>> CpuPool::create_for(const CpuPoolSettings& settings,
                                                             CpuTopology topology,
                                                             std::vector<int> allowed) {
  if (topology.nodes.empty()) topology.nodes.push_back(NumaNode{0, allowed});
  absl::StatusOr<CpuPlacement> check =
      decide_cpu_placement(topology, allowed, settings, StatesNode{std::nullopt, "not yet"});
  if (!check.ok()) {
    return absl::Status(check.status().code(), cat("Adam pool: ", check.status().message()));
  }
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  impl->topology = std::move(topology);
  impl->allowed = std::move(allowed);
  return std::make_unique<CpuPool>(std::move(impl));
}

void CpuPool::parallel_for(uint64_t n, const std::function<void(uint64_t)>& body,
                           const void* near) {
  const CpuPlacement& placed = impl_->place(near);
  if (n == 0) return;
#if defined(STRATA_TSAN)
  // Debian's oneTBB is not built with ThreadSanitizer (see cpu_adam.cc): plain threads, pinned
  // the same way, each taking one contiguous run. At least two, so that races still show.
  const uint64_t threads = std::min<uint64_t>(n, std::max<size_t>(2, placed.cpus.size()));
  std::vector<std::thread> workers;
  for (uint64_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      if (placed.pinned) (void)set_thread_cpus(placed.cpus);
      for (uint64_t i = n * t / threads; i < n * (t + 1) / threads; ++i) body(i);
    });
  }
  for (auto& worker : workers) worker.join();
#else
  (void)placed;
  impl_->arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<uint64_t>(0, n),
        [&](const tbb::blocked_range<uint64_t>& r) {
          for (uint64_t i = r.begin(); i != r.end(); ++i) body(i);
        },
        tbb::static_partitioner());
  });
#endif
}

std::optional<CpuPlacement> CpuPool::placement() const {
  MutexLock lock(&impl_->mu);
  return impl_->placement;
}

const CpuPoolSettings& CpuPool::settings() const { return impl_->settings; }

}  // namespace strata
