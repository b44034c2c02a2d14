// CpuPool: the placement decision over fake topologies, pinning on this machine, and Adam
// results that do not depend on the pool.
#include "strata/optimizer/cpu_pool.h"

#include <sched.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "skip.h"
#include "strata/optimizer/cpu_adam.h"
#include "strata/optimizer/offload_optimizer.h"
#include "strata/runtime/runtime.h"

namespace strata {
namespace {

using V = std::vector<int>;

V range(int first, int last) {
  V out;
  for (int c = first; c <= last; ++c) out.push_back(c);
  return out;
}
V join(V a, const V& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}

// Two sockets as the kernel numbers them: node 0 = 0-3,8-11 and node 1 = 4-7,12-15 (the
// second half are hyperthreads), plus a memory-only node 2.
CpuTopology two_sockets() {
  CpuTopology t;
  t.nodes = {{0, join(range(0, 3), range(8, 11))}, {1, join(range(4, 7), range(12, 15))}, {2, {}}};
  t.from_sysfs = true;
  return t;
}

CpuPlacement decide(const CpuTopology& t, const V& allowed, CpuPoolSettings s, StatesNode n) {
  absl::StatusOr<CpuPlacement> p = decide_cpu_placement(t, allowed, s, n);
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  INFO(p->reason);
  return *p;
}

bool has(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("The pool goes to the node that holds the states", "[offload][cpu_pool]") {
  const CpuTopology t = two_sockets();
  const V all = range(0, 15);
  const CpuPlacement p = decide(t, all, {}, {1, ""});
  CHECK(p.node == 1);
  CHECK(p.cpus == join(range(4, 7), range(12, 15)));
  CHECK(p.pinned);
  CHECK(has(p.reason, "node 1 holds the states; CPUs 4-7,12-15 (8 threads)"));

  // Offline CPUs (not in the affinity mask) and CPUs a launcher took away are not used.
  const V some = join(range(0, 4), range(6, 15));  // 5 offline
  CHECK(decide(t, some, {}, {1, ""}).cpus == V{4, 6, 7, 12, 13, 14, 15});

  // Unknown node: the node with the most allowed CPUs, and why.
  const V fewer_on_0 = join(range(1, 7), range(8, 15));  // node 0 has 7, node 1 has 8
  const CpuPlacement unknown = decide(t, fewer_on_0, {}, {std::nullopt, "move_pages: EPERM"});
  CHECK(unknown.node == 1);
  CHECK(has(unknown.reason,
            "the states' node is unknown (move_pages: EPERM); node 1 has the "
            "most allowed CPUs (8)"));
  CHECK(decide(t, all, {}, {std::nullopt, "x"}).node == 0);  // a tie: the lower id

  // States on a memory-only node, or a node this process may not run on.
  const CpuPlacement memory_only = decide(t, fewer_on_0, {}, {2, ""});
  CHECK(memory_only.node == 1);
  CHECK(has(memory_only.reason, "node 2 holds the states but this process may run on none"));
  CHECK(decide(t, all, {}, {7, ""}).node == 0);

  // One node with allowed CPUs (a launcher bound the process to a socket): that node, whatever
  // holds the states.
  const CpuPlacement bound = decide(t, range(0, 3), {}, {1, ""});
  CHECK(bound.cpus == range(0, 3));
  CHECK_FALSE(bound.pinned);  // every allowed CPU: nothing to pin
  CHECK(has(bound.reason, "one NUMA node with allowed CPUs (node 0)"));
  CHECK(has(bound.reason, "not pinned: every allowed CPU"));
}

TEST_CASE("reserve_cores leaves CPUs to the data loader", "[offload][cpu_pool]") {
  CpuTopology one;
  one.nodes = {{0, range(0, 7)}};
  const V all = range(0, 7);
  const CpuPlacement p = decide(one, all, {0, 2, true}, {0, ""});
  CHECK(p.cpus == range(0, 5));
  CHECK(p.pinned);
  CHECK(has(p.reason, "2 left to the data loader (6-7)"));
  CHECK(decide(one, all, {0, 7, true}, {0, ""}).cpus == V{0});

  // Reserving every CPU is an error naming the setting and the count.
  for (uint32_t reserve : {8U, 9U, 1000U}) {
    absl::StatusOr<CpuPlacement> none = decide_cpu_placement(one, all, {0, reserve, true}, {0, ""});
    REQUIRE_FALSE(none.ok());
    CHECK(none.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(has(std::string(none.status().message()),
              "reserves every CPU this process may run on (8: 0-7), leaving none to the Adam pool: "
              "use at most 7"));
  }

  // With two nodes, the other node's CPUs already count as left free.
  const CpuTopology t = two_sockets();
  const CpuPlacement spare = decide(t, range(0, 15), {0, 4, true}, {0, ""});
  CHECK(spare.cpus == join(range(0, 3), range(8, 11)));
  CHECK(has(spare.reason, "the other nodes leave 8 CPUs free (reserve_cores 4)"));
  // Only what they do not leave is taken from the chosen node.
  const V allowed = join(range(0, 3), V{4, 8, 9, 10, 11, 12});  // node 1: 4 and 12
  const CpuPlacement taken = decide(t, allowed, {0, 5, true}, {0, ""});
  CHECK(taken.cpus == V{0, 1, 2, 3, 8});
  CHECK(has(taken.reason, "3 left to the data loader (9-11)"));
}

TEST_CASE("threads takes that many CPUs, spilling onto other nodes", "[offload][cpu_pool]") {
  const CpuTopology t = two_sockets();
  const V all = range(0, 15);
  CHECK(decide(t, all, {3, 0, true}, {1, ""}).cpus == V{4, 5, 6});
  const CpuPlacement spill = decide(t, all, {10, 0, true}, {1, ""});
  CHECK(spill.cpus == join(join(range(4, 7), range(12, 15)), V{0, 1}));
  CHECK(has(spill.reason, "threads 10 exceed the node's 8 CPUs: also 0-1 of other nodes"));
  CHECK_FALSE(decide(t, all, {16, 0, true}, {1, ""}).pinned);  // every CPU

  absl::StatusOr<CpuPlacement> too_many = decide_cpu_placement(t, all, {15, 2, true}, {1, ""});
  REQUIRE_FALSE(too_many.ok());
  CHECK(has(std::string(too_many.status().message()),
            "threads 15 is more than the 14 CPUs this process may run on (0-15) less "
            "reserve_cores 2: use at most 14"));

  const CpuPlacement unpinned = decide(t, all, {0, 0, false}, {1, ""});
  CHECK_FALSE(unpinned.pinned);
  CHECK(has(unpinned.reason, "not pinned (pin off)"));
}

TEST_CASE("A topology that disagrees with the affinity mask still gives CPUs",
          "[offload][cpu_pool]") {
  CpuTopology stale;  // lists CPUs this process may not use; not 8-9
  stale.nodes = {{0, range(0, 3)}, {1, range(4, 7)}};
  const CpuPlacement none_listed = decide(stale, V{8, 9}, {}, {1, ""});
  CHECK(none_listed.cpus == V{8, 9});
  CHECK_FALSE(none_listed.pinned);
  const CpuPlacement spill = decide(stale, V{0, 1, 4, 8}, {4, 0, true}, {0, ""});
  CHECK(spill.cpus == V{0, 1, 4, 8});  // node 0, then node 1, then the unlisted CPU
  CHECK(decide(CpuTopology{}, V{0, 1}, {1, 0, true}, {std::nullopt, "x"}).cpus == V{0});
  CHECK(decide_cpu_placement(stale, V{}, {}, {0, ""}).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("CpuPool::create checks its settings against this machine", "[offload][cpu_pool]") {
  const V allowed = *allowed_cpus();
  const auto n = static_cast<uint32_t>(allowed.size());
  absl::StatusOr<std::unique_ptr<CpuPool>> none = CpuPool::create({0, n, true});
  REQUIRE_FALSE(none.ok());
  CHECK(has(std::string(none.status().message()), "Adam pool: reserve_cores "));
  CHECK_FALSE(CpuPool::create({n + 1, 0, true}).ok());
  REQUIRE(CpuPool::create({n, 0, true}).ok());
  absl::StatusOr<CpuPlacement> here = cpu_placement_here({}, nullptr);
  REQUIRE(here.ok());
  CHECK(here->cpus.size() == allowed.size());  // one node here, or the most populated one
}

// Runs the pool over many indices and records, for each, the CPU it ran on and its thread's mask.
struct Seen {
  std::vector<int> cpu;
  std::vector<V> mask;
};
Seen run_and_record(CpuPool& pool, uint64_t n, const void* near) {
  Seen seen{std::vector<int>(n, -1), std::vector<V>(n)};
  pool.parallel_for(
      n,
      [&](uint64_t i) {
        seen.cpu[i] = sched_getcpu();
        seen.mask[i] = *thread_cpus();
        volatile double x = 0;  // a little work, so that several threads take part
        for (int k = 0; k < 20000; ++k) x = x + k;
      },
      near);
  return seen;
}

TEST_CASE("The pool's threads run on the chosen CPUs and give back their masks",
          "[offload][cpu_pool]") {
  const V allowed = *allowed_cpus();
  if (allowed.size() < 2) {
    testing::skip("one CPU allowed; nothing to choose from");
    return;
  }
  std::vector<int> caller_before = *thread_cpus();
  // Leave one CPU: the pool must stay on the others.
  auto pool = CpuPool::create({0, 1, true});
  REQUIRE(pool.ok());
  CHECK_FALSE((*pool)->placement().has_value());  // decided on the first run
  std::vector<float> memory(1 << 16, 1.0F);
  const Seen seen = run_and_record(**pool, 64, memory.data());
  const std::optional<CpuPlacement> placed = (*pool)->placement();
  REQUIRE(placed.has_value());
  INFO(placed->reason);
  CHECK(placed->pinned);
  CHECK(placed->cpus.size() == allowed.size() - 1);
  for (uint64_t i = 0; i < seen.cpu.size(); ++i) {
    INFO("index " << i << " ran on CPU " << seen.cpu[i]);
    CHECK(std::binary_search(placed->cpus.begin(), placed->cpus.end(), seen.cpu[i]));
    CHECK(seen.mask[i] == placed->cpus);
  }
  // The calling thread took part pinned and has its own mask back.
  CHECK(*thread_cpus() == caller_before);
  // So do oneTBB's workers when they serve other work afterwards.
  const Seen later = [&] {
    auto all = CpuPool::create({0, 0, false});
    REQUIRE(all.ok());
    return run_and_record(**all, 64, nullptr);
  }();
  for (const V& mask : later.mask) CHECK(mask == allowed);
}

// ---- Adam results do not depend on the pool -----------------------------------------------

struct State {
  std::vector<float> master, m, v;
  std::vector<uint16_t> grad, copy;
  std::vector<double> sums;  // every call's sum of squares, in order
  explicit State(uint64_t n) : master(n), m(n), v(n), grad(n), copy(n) {
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0F, 1.0F);
    for (uint64_t i = 0; i < n; ++i) {
      master[i] = d(rng);
      m[i] = d(rng) * 0.1F;
      v[i] = std::abs(d(rng)) * 0.01F;
      const float g = d(rng);
      std::memcpy(&grad[i], reinterpret_cast<const char*>(&g) + 2, 2);  // a bf16 gradient
    }
  }
  AdamTensors tensors() {
    AdamTensors t;
    t.master = master.data();
    t.exp_avg = m.data();
    t.exp_avg_sq = v.data();
    t.grad = grad.data();
    t.grad_type = GradType::kBF16;
    t.param_copy = copy.data();
    t.copy_type = ParamCopyType::kF16;
    t.count = master.size();
    return t;
  }
  bool operator==(const State& o) const {
    const auto same = [](const auto& a, const auto& b) {
      return std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return same(master, o.master) && same(m, o.m) && same(v, o.v) && same(copy, o.copy) &&
           same(grad, o.grad) && same(sums, o.sums);
  }
};

TEST_CASE("Adam, statistics and accumulation are bit-identical on any pool",
          "[offload][cpu_pool][adam]") {
  const uint64_t n = 16 * 1024 * 9 + 37;  // ten chunks, a ragged tail
  AdamParams p;
  p.lr = 1e-2F;
  p.weight_decay = 0.01F;
  p.grad_scale = 0.5F;
  const auto run = [&](CpuPool* pool) {
    State s(n);
    for (uint64_t step = 1; step <= 3; ++step) {
      p.step = step;
      absl::StatusOr<AdamResult> r = adam_step_with(CpuIsa::kAuto, s.tensors(), p, pool);
      REQUIRE(r.ok());
      absl::StatusOr<AdamResult> st =
          grad_stats_with(CpuIsa::kAuto, s.grad.data(), GradType::kBF16, n, 1.0F, pool);
      REQUIRE(st.ok());
      absl::StatusOr<AdamResult> acc = grad_accumulate_with(
          CpuIsa::kAuto, s.grad.data(), s.copy.data(), GradType::kBF16, n, pool);
      REQUIRE(acc.ok());
      s.sums.insert(s.sums.end(), {r->grad_sq_sum, st->grad_sq_sum, acc->grad_sq_sum});
    }
    return s;
  };
  const State unpooled = run(nullptr);
  const V allowed = *allowed_cpus();
  const auto cpus = static_cast<uint32_t>(allowed.size());
  std::vector<CpuPoolSettings> variants = {{1, 0, true}, {0, 0, true}, {0, 0, false}};
  if (cpus > 1) variants.push_back({0, cpus - 1, true});  // pinned to one CPU
  if (cpus > 2) variants.push_back({2, 1, true});
  for (const CpuPoolSettings& s : variants) {
    INFO("threads " << s.threads << " reserve " << s.reserve_cores << " pin " << s.pin);
    auto pool = CpuPool::create(s);
    REQUIRE(pool.ok());
    CHECK(run(pool->get()) == unpooled);
  }
}

TEST_CASE("Threads sharing a pool and pools running side by side", "[offload][cpu_pool][adam]") {
  const uint64_t n = 16 * 1024 * 4 + 5;
  AdamParams p;
  p.lr = 1e-2F;
  const State unpooled = [&] {
    State s(n);
    s.sums.push_back(adam_step_with(CpuIsa::kAuto, s.tensors(), p, nullptr)->grad_sq_sum);
    return s;
  }();
  const auto cpus = static_cast<uint32_t>(allowed_cpus()->size());
  // One fresh pool whose first runs come from four threads at once (its placement is decided
  // once), and a second pool, pinned elsewhere where the machine allows, running alongside.
  auto shared = CpuPool::create({0, 0, true});
  auto other = CpuPool::create({0, cpus > 1 ? cpus - 1 : 0, true});
  REQUIRE(shared.ok());
  REQUIRE(other.ok());
  std::vector<State> states(6, State(n));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < states.size(); ++i) {
    threads.emplace_back([&, i] {
      CpuPool* pool = i < 4 ? shared->get() : other->get();
      for (int round = 0; round < 2; ++round) {
        State& s = states[i];
        if (round == 1) s = State(n);  // the same step again, from the same start
        absl::StatusOr<AdamResult> r = adam_step_with(CpuIsa::kAuto, s.tensors(), p, pool);
        s.sums.assign(1, r.ok() ? r->grad_sq_sum : -1.0);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const State& s : states) CHECK(s == unpooled);
  const std::optional<CpuPlacement> a = (*shared)->placement();
  const std::optional<CpuPlacement> b = (*other)->placement();
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(a->cpus.size() == cpus);
  CHECK(b->cpus.size() == (cpus > 1 ? 1U : cpus));
}

TEST_CASE("The offload optimizer takes its pool from its options or STRATA_ADAM_*",
          "[offload][cpu_pool][optimizer]") {
  const auto runtime_with = [](std::map<std::string, std::string> vars) {
    vars.insert(
        {{"STRATA_BACKEND", "host"}, {"STRATA_GPU_BYTES", "2MiB"}, {"STRATA_CPU_BYTES", "16MiB"}});
    auto config = Config::from_variables(vars);
    REQUIRE(config.ok());
    return Runtime::create(*config);
  };
  const auto cpus = static_cast<uint32_t>(allowed_cpus()->size());
  auto runtime = runtime_with({{"STRATA_ADAM_THREADS", "1"}});
  REQUIRE(runtime.ok());
  CHECK((*runtime)->config().adam_pool.threads == 1);
  REQUIRE(OffloadOptimizer::create(**runtime).ok());
  OffloadOptimizerOptions o;
  o.adam_pool = CpuPoolSettings{0, cpus, true};
  absl::StatusOr<std::unique_ptr<OffloadOptimizer>> refused =
      OffloadOptimizer::create(**runtime, o);
  REQUIRE_FALSE(refused.ok());
  CHECK(has(std::string(refused.status().message()), "OffloadOptimizer: Adam pool: reserve_cores"));

  // The same through the environment is refused when the runtime is created.
  auto reserved_all = runtime_with({{"STRATA_ADAM_RESERVE", std::to_string(cpus)}});
  REQUIRE_FALSE(reserved_all.ok());
  CHECK(has(std::string(reserved_all.status().message()),
            "STRATA_ADAM_RESERVE=" + std::to_string(cpus) + " reserves every CPU"));
}

}  // namespace
}  // namespace strata
