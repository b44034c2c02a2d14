// CPU lists, the NUMA topology from a fake sysfs directory, affinity and the node of a page.
#include "strata/base/cpu_topology.h"

#include <sched.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "temp_dir.h"

namespace strata {
namespace {

using V = std::vector<int>;

// A sysfs-like node directory: nodeN/cpulist for each entry, plus the files the kernel has
// beside them (which must be ignored).
void write_nodes(const std::string& dir, const std::vector<std::pair<int, std::string>>& nodes) {
  namespace fs = std::filesystem;
  std::ofstream(fs::path(dir) / "online") << "0-" << nodes.size() - 1 << "\n";
  fs::create_directories(fs::path(dir) / "power");
  for (const auto& [id, list] : nodes) {
    const fs::path node = fs::path(dir) / ("node" + std::to_string(id));
    fs::create_directories(node);
    std::ofstream(node / "cpulist") << list << "\n";
    std::ofstream(node / "cpumap") << "ff\n";
  }
}

TEST_CASE("parse_cpu_list reads the kernel's list format", "[base][cpu]") {
  CHECK(*parse_cpu_list("0-3,8-11\n") == V{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(*parse_cpu_list("5") == V{5});
  CHECK(parse_cpu_list("")->empty());
  CHECK(parse_cpu_list("\n")->empty());
  CHECK(*parse_cpu_list(" 7, 1-2 ,2") == V{1, 2, 7});  // sorted, duplicates once
  for (const char* bad : {"3-1", "a", "1-", "-1", "0-3;8", "1,,2", "99999999"}) {
    INFO(bad);
    absl::StatusOr<V> cpus = parse_cpu_list(bad);
    REQUIRE_FALSE(cpus.ok());
    CHECK(cpus.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(cpus.status().message()).find(std::string("'") + bad) == 0);
  }
}

TEST_CASE("format_cpu_list writes ranges", "[base][cpu]") {
  CHECK(format_cpu_list({0, 1, 2, 3, 8, 9, 10, 11}) == "0-3,8-11");
  CHECK(format_cpu_list({4}) == "4");
  CHECK(format_cpu_list({0, 2, 3}) == "0,2-3");
  CHECK(format_cpu_list({}) == "none");
  for (const char* list : {"0-3,8-11", "0,2-5,7", "1"})
    CHECK(format_cpu_list(*parse_cpu_list(list)) == list);
}

TEST_CASE("read_cpu_topology reads nodes from a sysfs directory", "[base][cpu]") {
  testing::TempDir dir;
  // Node 1 lists ranges; node 2 has no CPU (memory only); node ids need not be contiguous.
  write_nodes(dir.path(), {{0, "0-3,8-11"}, {1, "4-7,12-15"}, {2, ""}, {10, "16"}});
  absl::StatusOr<CpuTopology> t = read_cpu_topology({0, 1}, dir.path());
  REQUIRE(t.ok());
  CHECK(t->from_sysfs);
  CHECK(t->source == dir.path());
  REQUIRE(t->nodes.size() == 4);
  CHECK(t->nodes[0].id == 0);
  CHECK(t->nodes[0].cpus == V{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(t->nodes[1].cpus == V{4, 5, 6, 7, 12, 13, 14, 15});
  CHECK(t->nodes[2].cpus.empty());
  CHECK(t->nodes[3].id == 10);
  CHECK(t->node_of_cpu(12) == 1);
  CHECK(t->node_of_cpu(16) == 10);
  CHECK(t->node_of_cpu(17) == -1);
}

TEST_CASE("read_cpu_topology without NUMA information assumes one node", "[base][cpu]") {
  testing::TempDir dir;
  absl::StatusOr<CpuTopology> missing = read_cpu_topology({0, 2}, dir.path() + "/absent");
  REQUIRE(missing.ok());
  CHECK_FALSE(missing->from_sysfs);
  REQUIRE(missing->nodes.size() == 1);
  CHECK(missing->nodes[0].cpus == V{0, 2});
  CHECK(missing->source.find("one node assumed") != std::string::npos);

  absl::StatusOr<CpuTopology> empty = read_cpu_topology({3}, dir.path());
  REQUIRE(empty.ok());
  CHECK(empty->nodes[0].cpus == V{3});
  CHECK(empty->source.find("no nodeN entries") != std::string::npos);
}

TEST_CASE("read_cpu_topology names a malformed cpulist", "[base][cpu]") {
  testing::TempDir dir;
  write_nodes(dir.path(), {{0, "0-3"}, {1, "7-4"}});
  absl::StatusOr<CpuTopology> t = read_cpu_topology({0}, dir.path());
  REQUIRE_FALSE(t.ok());
  CHECK(std::string(t.status().message()).find("node1/cpulist: '7-4'") != std::string::npos);

  // Where a placement only needs a best effort: one node, and why.
  const CpuTopology one = read_cpu_topology_or_one_node({0, 1}, dir.path());
  REQUIRE(one.nodes.size() == 1);
  CHECK(one.nodes[0].cpus == V{0, 1});
  CHECK(one.read_error.find("node1/cpulist: '7-4'") != std::string::npos);
  CHECK(one.source.find("one node assumed") != std::string::npos);
  CHECK(read_cpu_topology_or_one_node({0}, dir.path() + "/absent").read_error.empty());
}

TEST_CASE("This machine: allowed CPUs, thread affinity and the node of a page", "[base][cpu]") {
  absl::StatusOr<V> allowed = allowed_cpus();
  REQUIRE(allowed.ok());
  REQUIRE_FALSE(allowed->empty());
  CHECK(std::is_sorted(allowed->begin(), allowed->end()));
  CHECK(static_cast<int>(allowed->size()) == [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
    return CPU_COUNT(&set);
  }());
  absl::StatusOr<CpuTopology> topology = read_cpu_topology(*allowed);
  REQUIRE(topology.ok());
  for (int cpu : *allowed) CHECK(topology->node_of_cpu(cpu) >= 0);

  // Pinning this thread to one CPU and back; on a thread of its own, so the test runner's
  // mask is never touched.
  std::thread([&] {
    const V one{allowed->back()};
    REQUIRE(set_thread_cpus(one).ok());
    CHECK(*thread_cpus() == one);
    CHECK(sched_getcpu() == one[0]);
    REQUIRE(set_thread_cpus(*allowed).ok());
    CHECK(*thread_cpus() == *allowed);
  }).join();
  CHECK_FALSE(set_thread_cpus({}).ok());

  // A touched page has a node (where move_pages is allowed); a never-touched one does not.
  std::vector<char> touched(1 << 16, 1);
  absl::StatusOr<int> node = numa_node_of(touched.data());
  if (node.ok()) {
    CHECK(*node >= 0);
  } else {
    WARN("move_pages refused here: " << node.status().message());
  }
}

}  // namespace
}  // namespace strata
