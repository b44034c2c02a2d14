// The conformance suite every backend must pass, run by each rank of a job (CTest starts it
// under strata-run with 2, 3 and 4 ranks over loopback). Every rank draws the same random
// sequence of collectives (same seed), so all can compute every expected byte: each operation,
// each type, uneven and empty shards, in place and out of place, several in flight at once.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "comm/host_reduce.h"
#include "strata/comm/communicator.h"

namespace strata {
namespace {

Communicator& comm() {
  static std::unique_ptr<Communicator> shared = [] {
    absl::StatusOr<std::unique_ptr<Communicator>> created = Communicator::from_environment();
    if (!created.ok()) FAIL(created.status().ToString());
    return *std::move(created);
  }();
  return *shared;
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
  Communicator& c = comm();
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
      std::vector<uint8_t> send = filled(type, rank, counts[rank], salt);
      if (in_place && !send.empty()) std::memcpy(&recv[offset * e], send.data(), send.size());
      auto work = c.all_gather(in_place ? recv.data() + offset * e : send.data(), recv.data(),
                               std::span<const uint64_t>(counts), type);
      REQUIRE(work.ok());
      REQUIRE((*work)->wait().ok());
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
      std::vector<uint8_t> send = filled(type, rank, total, salt);
      const std::vector<uint8_t> original = send;
      std::vector<uint8_t> recv(counts[rank] * e + 1, 0xAB);
      uint8_t* out = in_place ? send.data() + offset * e : recv.data();
      auto work = c.reduce_scatter(send.data(), out, std::span<const uint64_t>(counts), type, op);
      REQUIRE(work.ok());
      REQUIRE((*work)->wait().ok());
      INFO("op " << to_string(op));
      for (uint64_t i = 0; i < counts[rank]; ++i) {
        const double want = reduce_expected(op, type, world, offset + i, salt);
        REQUIRE(decode(type, out + i * e) == Approx(want).epsilon(tolerance(type)));
      }
      if (!in_place) {
        CHECK(send == original);  // out of place leaves the input alone
        CHECK(recv.back() == 0xAB);
      }
    } else if (kind == 2) {  // all_reduce
      const ReduceOp op = static_cast<ReduceOp>(rng() % 4);
      const uint64_t count = rng() % 5 == 0 ? 0 : 1 + rng() % 20000;
      std::vector<uint8_t> send = filled(type, rank, count, salt);
      std::vector<uint8_t> recv(count * e, 0);
      uint8_t* out = in_place ? send.data() : recv.data();
      auto work = c.all_reduce(send.data(), out, count, type, op);
      REQUIRE(work.ok());
      REQUIRE((*work)->wait().ok());
      for (uint64_t i = 0; i < count; ++i) {
        REQUIRE(decode(type, out + i * e) ==
                Approx(reduce_expected(op, type, world, i, salt)).epsilon(tolerance(type)));
      }
    } else {  // broadcast
      const int root = static_cast<int>(rng() % world);
      const uint64_t count = rng() % 5 == 0 ? 0 : 1 + rng() % 30000;
      std::vector<uint8_t> data =
          rank == root ? filled(type, root, count, salt) : std::vector<uint8_t>(count * e, 0xCD);
      auto work = c.broadcast(data.data(), count, type, root);
      REQUIRE(work.ok());
      REQUIRE((*work)->wait().ok());
      CHECK(data == filled(type, root, count, salt));
    }
  }
}

TEST_CASE("Large reduce_scatter runs in pieces: uneven shards, in place and out of place",
          "[comm][ranks]") {
  Communicator& c = comm();
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
      std::vector<uint8_t> send = filled(type, rank, total, 7);
      const std::vector<uint8_t> original = send;
      std::vector<uint8_t> recv(counts[rank] * e);
      uint8_t* out = in_place ? send.data() + offset * e : recv.data();
      auto work = c.reduce_scatter(send.data(), out, std::span<const uint64_t>(counts), type,
                                   ReduceOp::kSum);
      REQUIRE(work.ok());
      REQUIRE((*work)->wait().ok());
      uint64_t wrong = 0;
      for (uint64_t i = 0; i < counts[rank]; ++i) {
        if (decode(type, out + i * e) !=
            reduce_expected(ReduceOp::kSum, type, world, offset + i, 7)) {
          ++wrong;
        }
      }
      CHECK(wrong == 0);
      if (!in_place) CHECK(send == original);
    }
  }
}

TEST_CASE("Several collectives in flight complete in order; waits in any order", "[comm][ranks]") {
  Communicator& c = comm();
  const int world = c.size(), rank = c.rank();
  constexpr uint64_t kCount = 1 << 20;  // 4 MiB of float32 each: big enough to overlap
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<std::unique_ptr<CollectiveWork>> works;
  const CommStats before = c.stats();
  for (uint64_t k = 0; k < 4; ++k) {
    buffers.push_back(filled(DataType::kFloat32, rank, kCount, 100 + k));
  }
  for (uint64_t k = 0; k < 4; ++k) {
    auto work = c.all_reduce(buffers[k].data(), buffers[k].data(), kCount, DataType::kFloat32,
                             ReduceOp::kSum);
    REQUIRE(work.ok());
    works.push_back(*std::move(work));
  }
  auto barrier = c.barrier();
  REQUIRE(barrier.ok());
  for (size_t k = works.size(); k-- > 0;) REQUIRE(works[k]->wait().ok());
  REQUIRE((*barrier)->wait().ok());
  CHECK(works[3]->sequence() == works[0]->sequence() + 3);
  CHECK((*barrier)->sequence() == works[3]->sequence() + 1);
  for (uint64_t k = 0; k < 4; ++k) {
    for (uint64_t i = 0; i < kCount; i += 4099) {
      REQUIRE(decode(DataType::kFloat32, &buffers[k][i * 4]) ==
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
// issued back to back, each waited for at once or later, contents checked. Every rank draws the
// same random sequence.
TEST_CASE("Interleaved reduce-scatters and all-gathers, small and uneven, contents checked",
          "[comm][ranks]") {
  Communicator& c = comm();
  const int world = c.size(), rank = c.rank();
  std::mt19937_64 rng(20261123);
  for (int round = 0; round < 300; ++round) {
    const bool gather = rng() % 2 == 0;
    const uint64_t per_rank = 1 + rng() % 40;
    const uint64_t total = per_rank * static_cast<uint64_t>(world);
    const uint64_t seed = 1000 + static_cast<uint64_t>(round);
    INFO("round " << round << (gather ? " all_gather " : " reduce_scatter ") << per_rank);
    if (gather) {
      std::vector<float> shard(per_rank), out(total, -1.0F);
      for (uint64_t i = 0; i < per_rank; ++i) {
        shard[i] = static_cast<float>(seed + static_cast<uint64_t>(rank) * 1000 + i);
      }
      auto work = c.all_gather(shard.data(), out.data(), per_rank, DataType::kFloat32);
      REQUIRE(work.ok());
      REQUIRE((*work)->wait().ok());
      for (uint64_t i = 0; i < total; ++i) {
        REQUIRE(out[i] == static_cast<float>(seed + (i / per_rank) * 1000 + i % per_rank));
      }
    } else {
      std::vector<float> buffer(total);
      for (uint64_t i = 0; i < total; ++i) {
        buffer[i] = static_cast<float>((seed + i) % 64 + static_cast<uint64_t>(rank)) / 64.0F;
      }
      float* own = buffer.data() + static_cast<uint64_t>(rank) * per_rank;
      auto work =
          c.reduce_scatter(buffer.data(), own, per_rank, DataType::kFloat32, ReduceOp::kSum);
      REQUIRE(work.ok());
      REQUIRE((*work)->wait().ok());
      for (uint64_t i = 0; i < per_rank; ++i) {
        const uint64_t at = static_cast<uint64_t>(rank) * per_rank + i;
        float want = 0;
        for (int r = 0; r < world; ++r) {
          want += static_cast<float>((seed + at) % 64 + static_cast<uint64_t>(r)) / 64.0F;
        }
        REQUIRE(own[i] == want);
      }
    }
  }
}

TEST_CASE("Bad arguments are errors on the calling rank and do not consume a sequence number",
          "[comm][ranks]") {
  Communicator& c = comm();
  std::vector<uint64_t> wrong_counts(static_cast<size_t>(c.size()) + 1, 1);
  std::vector<float> buffer(wrong_counts.size());
  auto bad = c.all_gather(buffer.data(), buffer.data(), std::span<const uint64_t>(wrong_counts),
                          DataType::kFloat32);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("give one count per rank") != absl::string_view::npos);
  auto bad_root = c.broadcast(buffer.data(), 1, DataType::kFloat32, c.size());
  REQUIRE_FALSE(bad_root.ok());
  CHECK(bad_root.status().message().find("use a rank from 0 to") != absl::string_view::npos);
  // Still in step: a barrier on every rank works.
  auto barrier = c.barrier();
  REQUIRE(barrier.ok());
  CHECK((*barrier)->wait().ok());
}

}  // namespace
}  // namespace strata
