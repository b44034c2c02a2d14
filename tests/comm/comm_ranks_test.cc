// The conformance suite every backend must pass, run by each rank of a job (CTest starts it
// under strata-run with 2, 3 and 4 ranks over loopback). Every rank draws the same random
// sequence of collectives (same seed), so all can compute every expected byte: each operation,
// each type, uneven and empty shards, in place and out of place, several in flight at once.
//
// The backend is the one STRATA_COMM_BACKEND names, and the buffers are that backend's: Gloo on
// the host backend's device memory, NCCL on GPU LOCAL_RANK's (each rank its own GPU). Where NCCL
// cannot run (fewer GPUs than ranks, or a build without NCCL) every test prints "SKIPPED: ..."
// and CTest reports the job as skipped.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "comm/device_copier.h"
#include "comm/host_reduce.h"
#include "skip.h"
#include "strata/comm/communicator.h"
#include "strata/config/config.h"
#include "strata/device/backend.h"
#include "strata/device/host_device.h"

namespace strata {
namespace {

struct Job {
  std::unique_ptr<Device> device;  // outlives what it made
  std::unique_ptr<testing::DeviceCopier> copier;
  std::unique_ptr<Communicator> comm;
};

std::unique_ptr<Job> start_job() {
  absl::StatusOr<LaunchInfo> launch = LaunchInfo::from_environment();
  absl::StatusOr<Config> config = Config::from_environment();
  REQUIRE(launch.ok());
  REQUIRE(config.ok());
  auto job = std::make_unique<Job>();
  const bool nccl = config->comm.backend == CommBackendKind::kNccl;
  if (nccl) {
    // Every rank sees the same GPUs, so every rank makes the same choice.
    if (auto gpus = choose_backend(Backend::kCuda, launch->world_size - 1); !gpus.ok()) {
      testing::skip("the NCCL suite needs a GPU per rank (" + std::to_string(launch->world_size) +
                    "): " + std::string(gpus.status().message()));
      return nullptr;
    }
    auto device = make_device(Backend::kCuda, launch->local_rank);
    REQUIRE(device.ok());
    job->device = *std::move(device);
  } else {
    auto device = make_host_device({});
    REQUIRE(device.ok());
    job->device = *std::move(device);
  }
  job->copier = std::make_unique<testing::DeviceCopier>(*job->device);
  auto comm = Communicator::create(
      CommOptions{.launch = *launch, .settings = config->comm, .device = job->device.get()});
  if (nccl && !comm.ok() &&
      comm.status().message().find("has no NCCL") != absl::string_view::npos) {
    testing::skip(std::string(comm.status().message()));
    return nullptr;
  }
  if (!comm.ok()) FAIL(comm.status().ToString());
  job->comm = *std::move(comm);
  return job;
}

// This rank's job, or null when the suite is skipped here.
Job* job() {
  static const std::unique_ptr<Job> shared = start_job();
  return shared.get();
}

// The collective is done and its output written (NCCL's wait() only orders it on its stream).
bool finished(const absl::StatusOr<std::unique_ptr<CollectiveWork>>& work) {
  if (!work.ok()) {
    UNSCOPED_INFO(work.status().ToString());
    return false;
  }
  const absl::Status waited = (*work)->wait();
  const absl::Status done = waited.ok() ? (*work)->synchronize() : waited;
  if (!done.ok()) UNSCOPED_INFO(done.ToString());
  return done.ok();
}

constexpr DataType kTypes[] = {DataType::kUInt8,   DataType::kInt32,    DataType::kInt64,
                               DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                               DataType::kFloat64};

// Small integers: exact in every type, and sums of four of them too.
double value_of(int rank, uint64_t index, uint64_t salt) {
  return static_cast<double>((static_cast<uint64_t>(rank + 1) * 3 + index * 7 + salt) % 17);
}

void encode(DataType type, double v, uint8_t* out) {
  switch (type) {
    case DataType::kUInt8:
      *out = static_cast<uint8_t>(v);
      return;
    case DataType::kInt32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(out, &x, 4);
      return;
    }
    case DataType::kInt64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(out, &x, 8);
      return;
    }
    case DataType::kFloat16: {
      const auto x = comm_internal::to_float16(static_cast<float>(v));
      std::memcpy(out, &x, 2);
      return;
    }
    case DataType::kBFloat16: {
      const auto x = comm_internal::to_bfloat16(static_cast<float>(v));
      std::memcpy(out, &x, 2);
      return;
    }
    case DataType::kFloat32: {
      const float x = static_cast<float>(v);
      std::memcpy(out, &x, 4);
      return;
    }
    case DataType::kFloat64:
      std::memcpy(out, &v, 8);
      return;
  }
}

double decode(DataType type, const uint8_t* in) {
  switch (type) {
    case DataType::kUInt8:
      return *in;
    case DataType::kInt32: {
      int32_t x;
      std::memcpy(&x, in, 4);
      return x;
    }
    case DataType::kInt64: {
      int64_t x;
      std::memcpy(&x, in, 8);
      return static_cast<double>(x);
    }
    case DataType::kFloat16: {
      comm_internal::Float16Bits x;
      std::memcpy(&x, in, 2);
      return comm_internal::to_float(x);
    }
    case DataType::kBFloat16: {
      comm_internal::BFloat16Bits x;
      std::memcpy(&x, in, 2);
      return comm_internal::to_float(x);
    }
    case DataType::kFloat32: {
      float x;
      std::memcpy(&x, in, 4);
      return x;
    }
    case DataType::kFloat64: {
      double x;
      std::memcpy(&x, in, 8);
      return x;
    }
  }
  return 0;
}

std::vector<uint8_t> filled(DataType type, int rank, uint64_t count, uint64_t salt,
                            uint64_t first_index = 0) {
  const size_t e = element_size(type);
  std::vector<uint8_t> bytes(count * e);
  for (uint64_t i = 0; i < count; ++i)
    encode(type, value_of(rank, first_index + i, salt), &bytes[i * e]);
  return bytes;
}

double reduce_expected(ReduceOp op, DataType type, int world, uint64_t index, uint64_t salt) {
  double sum = 0, max = -1e300, min = 1e300;
  for (int r = 0; r < world; ++r) {
    const double v = value_of(r, index, salt);
    sum += v;
    max = std::max(max, v);
    min = std::min(min, v);
  }
  switch (op) {
    case ReduceOp::kSum:
      return sum;
    case ReduceOp::kMax:
      return max;
    case ReduceOp::kMin:
      return min;
    case ReduceOp::kAverage: {
      const bool integer =
          type == DataType::kUInt8 || type == DataType::kInt32 || type == DataType::kInt64;
      return integer ? std::floor(sum / world) : sum / world;
    }
  }
  return 0;
}

// Relative tolerance of an average in `type` (sums are exact; the division rounds once).
double tolerance(DataType type) {
  return type == DataType::kFloat16 ? 1e-3 : type == DataType::kBFloat16 ? 1e-2 : 1e-6;
}

std::vector<uint64_t> random_counts(std::mt19937_64& rng, int world) {
  std::vector<uint64_t> counts(world);
  const int shape = static_cast<int>(rng() % 4);
  for (int r = 0; r < world; ++r) {
    if (shape == 0)
      counts[r] = rng() % 3000;  // uneven
    else if (shape == 1)
      counts[r] = r == 1 ? 0 : rng() % 2000;  // an empty shard
    else if (shape == 2)
      counts[r] = 1000;  // equal
    else
      counts[r] = (rng() % 2) ? 0 : 1 + rng() % 5;  // tiny, several empty
  }
  return counts;
}

TEST_CASE("Every collective over every type, uneven and empty shards, contents checked",
          "[comm][ranks]") {
  Job* j = job();
  if (j == nullptr) return;
  Communicator& c = *j->comm;
  testing::DeviceCopier& copy = *j->copier;
  const int world = c.size(), rank = c.rank();
  std::mt19937_64 rng(0x5eed + world);  // the same on every rank
  for (int step = 0; step < 60; ++step) {
    const DataType type = kTypes[rng() % std::size(kTypes)];
    const size_t e = element_size(type);
    const int kind = static_cast<int>(rng() % 4);
    const bool in_place = rng() % 2 == 0;
    const uint64_t salt = static_cast<uint64_t>(step);
    INFO("step " << step << " type " << to_string(type) << " in place " << in_place);
    if (kind == 0) {  // all_gather
      const std::vector<uint64_t> counts = random_counts(rng, world);
      const uint64_t total = std::accumulate(counts.begin(), counts.end(), uint64_t{0});
      const uint64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, uint64_t{0});
      std::vector<uint8_t> recv(total * e + 1, 0xAB);
      const std::vector<uint8_t> send = filled(type, rank, counts[rank], salt);
      if (in_place && !send.empty()) std::memcpy(&recv[offset * e], send.data(), send.size());
      auto send_d = copy.copy_of(send);
      auto recv_d = copy.copy_of(recv);
      auto* recv_at = static_cast<uint8_t*>(recv_d->data());
      REQUIRE(finished(c.all_gather(in_place ? recv_at + offset * e : send_d->data(), recv_at,
                                    std::span<const uint64_t>(counts), type)));
      recv = copy.download(recv_at, recv.size());
      uint64_t at = 0;
      for (int r = 0; r < world; ++r) {
        for (uint64_t i = 0; i < counts[r]; ++i, ++at) {
          REQUIRE(decode(type, &recv[at * e]) == value_of(r, i, salt));
        }
      }
      CHECK(recv.back() == 0xAB);  // nothing written past the end
    } else if (kind == 1) {        // reduce_scatter
      const ReduceOp op = static_cast<ReduceOp>(rng() % 4);
      const std::vector<uint64_t> counts = random_counts(rng, world);
      const uint64_t total = std::accumulate(counts.begin(), counts.end(), uint64_t{0});
      const uint64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, uint64_t{0});
      const std::vector<uint8_t> original = filled(type, rank, total, salt);
      const std::vector<uint8_t> fill(counts[rank] * e + 1, 0xAB);
      auto send_d = copy.copy_of(original);
      auto recv_d = copy.copy_of(fill);
      auto* send_at = static_cast<uint8_t*>(send_d->data());
      uint8_t* out = in_place ? send_at + offset * e : static_cast<uint8_t*>(recv_d->data());
      REQUIRE(
          finished(c.reduce_scatter(send_at, out, std::span<const uint64_t>(counts), type, op)));
      INFO("op " << to_string(op));
      const std::vector<uint8_t> got = copy.download(out, counts[rank] * e);
      for (uint64_t i = 0; i < counts[rank]; ++i) {
        const double want = reduce_expected(op, type, world, offset + i, salt);
        REQUIRE(decode(type, &got[i * e]) == Approx(want).epsilon(tolerance(type)));
      }
      if (!in_place) {
        CHECK(copy.download(send_at, original.size()) == original);  // the input left alone
        CHECK(copy.download(recv_d->data(), fill.size()).back() == 0xAB);
      }
    } else if (kind == 2) {  // all_reduce
      const ReduceOp op = static_cast<ReduceOp>(rng() % 4);
      const uint64_t count = rng() % 5 == 0 ? 0 : 1 + rng() % 20000;
      auto send_d = copy.copy_of(filled(type, rank, count, salt));
      auto recv_d = copy.allocate(count * e);
      void* out = in_place ? send_d->data() : recv_d->data();
      REQUIRE(finished(c.all_reduce(send_d->data(), out, count, type, op)));
      const std::vector<uint8_t> got = copy.download(out, count * e);
      for (uint64_t i = 0; i < count; ++i) {
        REQUIRE(decode(type, &got[i * e]) ==
                Approx(reduce_expected(op, type, world, i, salt)).epsilon(tolerance(type)));
      }
    } else {  // broadcast
      const int root = static_cast<int>(rng() % world);
      const uint64_t count = rng() % 5 == 0 ? 0 : 1 + rng() % 30000;
      auto data = copy.copy_of(rank == root ? filled(type, root, count, salt)
                                            : std::vector<uint8_t>(count * e, 0xCD));
      REQUIRE(finished(c.broadcast(data->data(), count, type, root)));
      CHECK(copy.download(data->data(), count * e) == filled(type, root, count, salt));
    }
  }
}

TEST_CASE("Large reduce_scatter runs in pieces: uneven shards, in place and out of place",
          "[comm][ranks]") {
  Job* j = job();
  if (j == nullptr) return;
  Communicator& c = *j->comm;
  testing::DeviceCopier& copy = *j->copier;
  const int world = c.size(), rank = c.rank();
  // Several 4 MiB pieces, shards that do not divide evenly into them, one shard empty.
  std::vector<uint64_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = r == 1 ? 0 : 1500000 + 12345 * r;
  const uint64_t total = std::accumulate(counts.begin(), counts.end(), uint64_t{0});
  const uint64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, uint64_t{0});
  for (const DataType type : {DataType::kFloat32, DataType::kBFloat16}) {
    const size_t e = element_size(type);
    for (const bool in_place : {false, true}) {
      INFO(to_string(type) << " in place " << in_place);
      const std::vector<uint8_t> original = filled(type, rank, total, 7);
      auto send_d = copy.copy_of(original);
      auto recv_d = copy.allocate(counts[rank] * e);
      auto* send_at = static_cast<uint8_t*>(send_d->data());
      uint8_t* out = in_place ? send_at + offset * e : static_cast<uint8_t*>(recv_d->data());
      REQUIRE(finished(
          c.reduce_scatter(send_at, out, std::span<const uint64_t>(counts), type, ReduceOp::kSum)));
      const std::vector<uint8_t> got = copy.download(out, counts[rank] * e);
      uint64_t wrong = 0;
      for (uint64_t i = 0; i < counts[rank]; ++i) {
        if (decode(type, &got[i * e]) !=
            reduce_expected(ReduceOp::kSum, type, world, offset + i, 7)) {
          ++wrong;
        }
      }
      CHECK(wrong == 0);
      if (!in_place) CHECK(copy.download(send_at, original.size()) == original);
    }
  }
}

TEST_CASE("Several collectives in flight complete in order, waits in any order", "[comm][ranks]") {
  Job* j = job();
  if (j == nullptr) return;
  Communicator& c = *j->comm;
  testing::DeviceCopier& copy = *j->copier;
  const int world = c.size(), rank = c.rank();
  constexpr uint64_t kCount = 1 << 20;  // 4 MiB of float32 each: big enough to overlap
  std::vector<std::unique_ptr<DeviceMemory>> buffers;
  std::vector<std::unique_ptr<CollectiveWork>> works;
  const CommStats before = c.stats();
  for (uint64_t k = 0; k < 4; ++k) {
    buffers.push_back(copy.copy_of(filled(DataType::kFloat32, rank, kCount, 100 + k)));
  }
  for (uint64_t k = 0; k < 4; ++k) {
    auto work = c.all_reduce(buffers[k]->data(), buffers[k]->data(), kCount, DataType::kFloat32,
                             ReduceOp::kSum);
    REQUIRE(work.ok());
    works.push_back(*std::move(work));
  }
  auto barrier = c.barrier();
  REQUIRE(barrier.ok());
  for (size_t k = works.size(); k-- > 0;) {
    REQUIRE(works[k]->wait().ok());
    REQUIRE(works[k]->synchronize().ok());
  }
  REQUIRE(finished(barrier));
  CHECK(works[3]->sequence() == works[0]->sequence() + 3);
  CHECK((*barrier)->sequence() == works[3]->sequence() + 1);
  for (uint64_t k = 0; k < 4; ++k) {
    const std::vector<uint8_t> got = copy.download(buffers[k]->data(), kCount * 4);
    for (uint64_t i = 0; i < kCount; i += 4099) {
      REQUIRE(decode(DataType::kFloat32, &got[i * 4]) ==
              reduce_expected(ReduceOp::kSum, DataType::kFloat32, world, i, 100 + k));
    }
  }
  // The byte counters: nccl-tests' sizes and the bus factor.
  const CommStats after = c.stats();
  const auto& reduce_before = before[CollectiveKind::kAllReduce];
  const auto& reduce_after = after[CollectiveKind::kAllReduce];
  CHECK(reduce_after.calls - reduce_before.calls == 4);
  CHECK(reduce_after.bytes - reduce_before.bytes == 4 * kCount * 4);
  CHECK(reduce_after.wire_bytes - reduce_before.wire_bytes ==
        4 * static_cast<uint64_t>(kCount * 4.0 * 2 * (world - 1) / world));
  CHECK(after[CollectiveKind::kBarrier].calls - before[CollectiveKind::kBarrier].calls == 1);
}

// ZeRO stage 3's traffic: small reduce-scatters (Gloo's halving-doubling) and all-gathers
// issued back to back, each waited for at once, contents checked. Every rank draws the same
// random sequence.
TEST_CASE("Interleaved reduce-scatters and all-gathers, small and uneven, contents checked",
          "[comm][ranks]") {
  Job* j = job();
  if (j == nullptr) return;
  Communicator& c = *j->comm;
  testing::DeviceCopier& copy = *j->copier;
  const int world = c.size(), rank = c.rank();
  std::mt19937_64 rng(20261123);
  // One device buffer for every round (the largest size), so rounds cost no allocation.
  constexpr uint64_t kMaxPerRank = 40;
  auto buffer_d = copy.allocate(kMaxPerRank * static_cast<uint64_t>(world) * sizeof(float));
  auto shard_d = copy.allocate(kMaxPerRank * sizeof(float));
  auto* buffer_at = static_cast<float*>(buffer_d->data());
  for (int round = 0; round < 300; ++round) {
    const bool gather = rng() % 2 == 0;
    const uint64_t per_rank = 1 + rng() % kMaxPerRank;
    const uint64_t total = per_rank * static_cast<uint64_t>(world);
    const uint64_t seed = 1000 + static_cast<uint64_t>(round);
    INFO("round " << round << (gather ? " all_gather " : " reduce_scatter ") << per_rank);
    if (gather) {
      std::vector<float> shard(per_rank), out(total);
      for (uint64_t i = 0; i < per_rank; ++i) {
        shard[i] = static_cast<float>(seed + static_cast<uint64_t>(rank) * 1000 + i);
      }
      copy.upload(shard_d->data(), shard.data(), per_rank * sizeof(float));
      REQUIRE(finished(c.all_gather(shard_d->data(), buffer_at, per_rank, DataType::kFloat32)));
      const std::vector<uint8_t> got = copy.download(buffer_at, total * sizeof(float));
      std::memcpy(out.data(), got.data(), got.size());
      for (uint64_t i = 0; i < total; ++i) {
        REQUIRE(out[i] == static_cast<float>(seed + (i / per_rank) * 1000 + i % per_rank));
      }
    } else {
      std::vector<float> buffer(total);
      for (uint64_t i = 0; i < total; ++i) {
        buffer[i] = static_cast<float>((seed + i) % 64 + static_cast<uint64_t>(rank)) / 64.0F;
      }
      copy.upload(buffer_at, buffer.data(), total * sizeof(float));
      float* own = buffer_at + static_cast<uint64_t>(rank) * per_rank;
      REQUIRE(
          finished(c.reduce_scatter(buffer_at, own, per_rank, DataType::kFloat32, ReduceOp::kSum)));
      const std::vector<uint8_t> got = copy.download(own, per_rank * sizeof(float));
      std::vector<float> mine(per_rank);
      std::memcpy(mine.data(), got.data(), got.size());
      for (uint64_t i = 0; i < per_rank; ++i) {
        const uint64_t at = static_cast<uint64_t>(rank) * per_rank + i;
        float want = 0;
        for (int r = 0; r < world; ++r) {
          want += static_cast<float>((seed + at) % 64 + static_cast<uint64_t>(r)) / 64.0F;
        }
        REQUIRE(mine[i] == want);
      }
    }
  }
}

TEST_CASE("Bad arguments are errors on the calling rank and do not consume a sequence number",
          "[comm][ranks]") {
  Job* j = job();
  if (j == nullptr) return;
  Communicator& c = *j->comm;
  auto first = c.barrier();
  REQUIRE(finished(first));
  std::vector<uint64_t> wrong_counts(static_cast<size_t>(c.size()) + 1, 1);
  auto buffer = j->copier->allocate(wrong_counts.size() * sizeof(float));
  auto bad = c.all_gather(buffer->data(), buffer->data(), std::span<const uint64_t>(wrong_counts),
                          DataType::kFloat32);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("give one count per rank") != absl::string_view::npos);
  auto bad_scatter =
      c.reduce_scatter(buffer->data(), buffer->data(), std::span<const uint64_t>(wrong_counts),
                       DataType::kFloat32, ReduceOp::kSum);
  REQUIRE_FALSE(bad_scatter.ok());
  auto bad_root = c.broadcast(buffer->data(), 1, DataType::kFloat32, c.size());
  REQUIRE_FALSE(bad_root.ok());
  CHECK(bad_root.status().message().find("use a rank from 0 to") != absl::string_view::npos);
  // Still in step, and the rejected calls took no number: the next call is the next one.
  auto barrier = c.barrier();
  REQUIRE(finished(barrier));
  CHECK((*barrier)->sequence() == (*first)->sequence() + 1);
}

// Sub-communicators: the ranks split into blocks of two consecutive ranks (a 4-rank job: 2 nodes
// × 2), each block ranked in reverse by its key; collectives inside a group give that group's
// results while the parent keeps working. A second split puts every rank in one group.
TEST_CASE("split: groups of consecutive ranks, ranked by key, each with its own collectives",
          "[comm][ranks][split]") {
  Job* j = job();
  if (j == nullptr) return;
  Communicator& c = *j->comm;
  testing::DeviceCopier& copy = *j->copier;
  const int world = c.size(), rank = c.rank();
  const int color = rank / 2;
  auto group = c.split(color, /*key=*/-rank);
  REQUIRE(group.ok());
  Communicator& g = **group;
  // The group's members, in group-rank order: key -rank puts the highest parent rank first.
  std::vector<int> members;
  for (int r = world - 1; r >= 0; --r) {
    if (r / 2 == color) members.push_back(r);
  }
  REQUIRE(g.size() == static_cast<int>(members.size()));
  REQUIRE(members[static_cast<size_t>(g.rank())] == rank);
  CHECK(g.backend() == c.backend());
  CHECK(g.description().find("split #1 color " + std::to_string(color)) != std::string::npos);

  // all_gather of each member's parent rank: the members in group order.
  constexpr uint64_t kPer = 5;
  std::vector<int32_t> mine(kPer, rank);
  auto mine_d = copy.copy_of(std::vector<uint8_t>(reinterpret_cast<uint8_t*>(mine.data()),
                                                  reinterpret_cast<uint8_t*>(mine.data() + kPer)));
  auto all_d = copy.allocate(kPer * members.size() * sizeof(int32_t));
  REQUIRE(finished(g.all_gather(mine_d->data(), all_d->data(), kPer, DataType::kInt32)));
  const std::vector<uint8_t> got = copy.download(all_d->data(), all_d->size());
  for (size_t i = 0; i < kPer * members.size(); ++i) {
    int32_t v;
    std::memcpy(&v, got.data() + i * sizeof(int32_t), sizeof v);
    REQUIRE(v == members[i / kPer]);
  }
  // all_reduce: the sum over the group only, and the parent's over every rank, interleaved.
  const auto sum_of = [&](Communicator& comm, int expected) {
    const int32_t one = rank + 1;
    auto d = copy.copy_of(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&one),
                                               reinterpret_cast<const uint8_t*>(&one + 1)));
    REQUIRE(finished(comm.all_reduce(d->data(), d->data(), 1, DataType::kInt32, ReduceOp::kSum)));
    int32_t v;
    std::memcpy(&v, copy.download(d->data(), sizeof v).data(), sizeof v);
    CHECK(v == expected);
  };
  int group_sum = 0;
  for (int m : members) group_sum += m + 1;
  sum_of(g, group_sum);
  sum_of(c, world * (world + 1) / 2);
  sum_of(g, group_sum);
  REQUIRE(finished(g.barrier()));
  CHECK(g.stats()[CollectiveKind::kAllReduce].calls == 2);

  // A second split of the same parent: everyone in one group, in the parent's order.
  auto whole = c.split(7, rank);
  REQUIRE(whole.ok());
  CHECK((*whole)->size() == world);
  CHECK((*whole)->rank() == rank);
  sum_of(**whole, world * (world + 1) / 2);
  CHECK(c.split(-1, 0).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
