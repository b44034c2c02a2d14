// The NCCL communicator with one rank (NCCL refuses two ranks on one GPU): every operation on
// device buffers with its contents checked, odd and empty sizes, in place, average, a stream
// given, the sequence numbers and the statistics. [cuda]: without a GPU (or without NCCL in
// this build) each test prints "SKIPPED: ..." and CTest reports it as skipped.
#include <catch2/catch.hpp>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "comm/device_copier.h"
#include "device/device_fixtures.h"
#include "skip.h"
#include "strata/comm/communicator.h"

namespace strata {
namespace {

// The communicator of a one-rank job on `device`, or nullptr after printing why the test is
// skipped (this build has no NCCL).
std::unique_ptr<Communicator> nccl_or_skip(Device& device, bool debug = false) {
  CommOptions options;
  options.launch.master_port = 0;  // rank 0 serves the rendezvous on a free port
  options.settings.backend = CommBackendKind::kNccl;
  options.settings.timeout = std::chrono::seconds(60);
  options.settings.debug = debug;
  options.device = &device;
  auto comm = Communicator::create(options);
  if (!comm.ok() && comm.status().code() == absl::StatusCode::kFailedPrecondition &&
      comm.status().message().find("has no NCCL") != absl::string_view::npos) {
    testing::skip(std::string(comm.status().message()));
    return nullptr;
  }
  REQUIRE(comm.ok());
  return *std::move(comm);
}

// Device memory with host copies in and out (each a synchronized copy).
class DeviceBuffer {
 public:
  DeviceBuffer(Device& device, uint64_t bytes)
      : copier_(device), memory_(copier_.allocate(bytes)), bytes_(bytes) {}
  void* data() const { return memory_->data(); }
  char* bytes_at(uint64_t offset) const { return static_cast<char*>(data()) + offset; }

  template <typename T>
  void upload(const std::vector<T>& values, uint64_t offset_bytes = 0) {
    const uint64_t n = values.size() * sizeof(T);
    REQUIRE(offset_bytes + n <= bytes_);
    copier_.upload(bytes_at(offset_bytes), values.data(), n);
  }

  template <typename T>
  std::vector<T> download(uint64_t count, uint64_t offset_bytes = 0) {
    const uint64_t n = count * sizeof(T);
    REQUIRE(offset_bytes + n <= bytes_);
    const std::vector<uint8_t> raw = copier_.download(bytes_at(offset_bytes), n);
    std::vector<T> out(count);
    std::memcpy(out.data(), raw.data(), n);
    return out;
  }

 private:
  testing::DeviceCopier copier_;
  std::unique_ptr<DeviceMemory> memory_;
  uint64_t bytes_;
};

std::vector<float> floats(uint64_t n, int seed) {
  std::vector<float> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<float>((i * 7 + seed) % 1000) - 500.0f;
  return out;
}

void finish(absl::StatusOr<std::unique_ptr<CollectiveWork>> work) {
  REQUIRE(work.ok());
  REQUIRE((*work)->wait().ok());
  REQUIRE((*work)->synchronize().ok());
}

TEST_CASE("NCCL communicator of one rank and its description", "[cuda][comm]") {
  auto device = testing::cuda_device_or_skip();
  if (device == nullptr) return;
  auto comm = nccl_or_skip(*device);
  if (comm == nullptr) return;
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(comm->backend() == CommBackendKind::kNccl);
  CHECK(comm->description().find("nccl") == 0);
  CHECK(comm->description().find("rank 0 of 1") != std::string::npos);
}

TEST_CASE("NCCL all_gather with odd and empty sizes out of place and in place", "[cuda][comm]") {
  auto device = testing::cuda_device_or_skip();
  if (device == nullptr) return;
  auto comm = nccl_or_skip(*device);
  if (comm == nullptr) return;
  constexpr uint64_t kCount = 1000003;  // not a multiple of anything
  DeviceBuffer send(*device, kCount * sizeof(float));
  DeviceBuffer recv(*device, kCount * sizeof(float));
  const auto values = floats(kCount, 1);
  send.upload(values);
  recv.upload(std::vector<float>(kCount, 0.0f));

  finish(comm->all_gather(send.data(), recv.data(), kCount, DataType::kFloat32));
  CHECK(recv.download<float>(kCount) == values);

  // Per-rank counts (one rank: one entry).
  const std::vector<uint64_t> counts = {kCount};
  recv.upload(std::vector<float>(kCount, 0.0f));
  finish(comm->all_gather(send.data(), recv.data(), std::span<const uint64_t>(counts),
                          DataType::kFloat32));
  CHECK(recv.download<float>(kCount) == values);

  // In place: this rank's slice of recv is the input.
  const auto other = floats(kCount, 2);
  recv.upload(other);
  finish(comm->all_gather(recv.data(), recv.data(), kCount, DataType::kFloat32));
  CHECK(recv.download<float>(kCount) == other);

  // Empty shard: nothing moves, the call still counts.
  auto empty = comm->all_gather(send.data(), recv.data(), 0, DataType::kFloat32);
  REQUIRE(empty.ok());
  CHECK((*empty)->synchronize().ok());
  CHECK((*empty)->sequence() == 4);
  CHECK(recv.download<float>(kCount) == other);
}

TEST_CASE("NCCL reduce_scatter with sum average max min and in place", "[cuda][comm]") {
  auto device = testing::cuda_device_or_skip();
  if (device == nullptr) return;
  auto comm = nccl_or_skip(*device);
  if (comm == nullptr) return;
  constexpr uint64_t kCount = 4099;
  DeviceBuffer send(*device, kCount * sizeof(float));
  DeviceBuffer recv(*device, kCount * sizeof(float));
  const auto values = floats(kCount, 3);  // integers: exact under sum and average of one
  send.upload(values);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax, ReduceOp::kMin}) {
    recv.upload(std::vector<float>(kCount, 0.0f));
    finish(comm->reduce_scatter(send.data(), recv.data(), kCount, DataType::kFloat32, op));
    CHECK(recv.download<float>(kCount) == values);
  }
  // In place: recv is this rank's slice of send.
  finish(comm->reduce_scatter(send.data(), send.data(), kCount, DataType::kFloat32,
                              ReduceOp::kAverage));
  CHECK(send.download<float>(kCount) == values);
  // An empty shard.
  const std::vector<uint64_t> none = {0};
  finish(comm->reduce_scatter(send.data(), recv.data(), std::span<const uint64_t>(none),
                              DataType::kFloat32, ReduceOp::kSum));
}

TEST_CASE("NCCL all_reduce and broadcast over every element type", "[cuda][comm]") {
  auto device = testing::cuda_device_or_skip();
  if (device == nullptr) return;
  auto comm = nccl_or_skip(*device);
  if (comm == nullptr) return;
  constexpr uint64_t kCount = 513;
  for (DataType type : {DataType::kUInt8, DataType::kInt32, DataType::kInt64, DataType::kFloat16,
                        DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64}) {
    INFO("type " << to_string(type));
    const uint64_t bytes = kCount * element_size(type);
    // Small non-negative integers in every type (1.0 is 0x3C00 in float16 and 0x3F80 in
    // bfloat16; their sum and average over one rank are themselves).
    std::vector<uint8_t> values(bytes);
    for (uint64_t i = 0; i < kCount; ++i) {
      uint8_t* e = values.data() + i * element_size(type);
      const int v = static_cast<int>(i % 50);
      switch (type) {
        case DataType::kUInt8:
          *e = static_cast<uint8_t>(v);
          break;
        case DataType::kInt32: {
          const int32_t x = v;
          std::memcpy(e, &x, 4);
          break;
        }
        case DataType::kInt64: {
          const int64_t x = v;
          std::memcpy(e, &x, 8);
          break;
        }
        case DataType::kFloat16: {
          const uint16_t x = v % 2 == 0 ? 0x3C00 : 0x4000;  // 1.0, 2.0
          std::memcpy(e, &x, 2);
          break;
        }
        case DataType::kBFloat16: {
          const uint16_t x = v % 2 == 0 ? 0x3F80 : 0x4000;  // 1.0, 2.0
          std::memcpy(e, &x, 2);
          break;
        }
        case DataType::kFloat32: {
          const float x = static_cast<float>(v);
          std::memcpy(e, &x, 4);
          break;
        }
        case DataType::kFloat64: {
          const double x = v;
          std::memcpy(e, &x, 8);
          break;
        }
      }
    }
    DeviceBuffer a(*device, bytes);
    DeviceBuffer b(*device, bytes);
    a.upload(values);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      b.upload(std::vector<uint8_t>(bytes, 0xAB));
      finish(comm->all_reduce(a.data(), b.data(), kCount, type, op));
      CHECK(b.download<uint8_t>(bytes) == values);
    }
    finish(comm->all_reduce(a.data(), a.data(), kCount, type, ReduceOp::kSum));  // in place
    CHECK(a.download<uint8_t>(bytes) == values);
    finish(comm->broadcast(a.data(), kCount, type, 0));
    CHECK(a.download<uint8_t>(bytes) == values);
  }
}

TEST_CASE("NCCL collectives are ordered on a given stream without a host wait", "[cuda][comm]") {
  auto device = testing::cuda_device_or_skip();
  if (device == nullptr) return;
  auto comm = nccl_or_skip(*device);
  if (comm == nullptr) return;
  constexpr uint64_t kCount = 1 << 20;
  constexpr uint64_t kBytes = kCount * sizeof(float);
  auto stream = device->create_stream();
  auto pinned = device->allocate_pinned(2 * kBytes, "test buffer");
  REQUIRE(stream.ok());
  REQUIRE(pinned.ok());
  DeviceBuffer send(*device, kBytes);
  DeviceBuffer recv(*device, kBytes);
  auto* host = static_cast<char*>((*pinned)->data());
  const CollectiveOptions on_stream{.stream = stream->get()};
  for (int round = 0; round < 4; ++round) {
    const auto values = floats(kCount, 10 + round);
    std::memcpy(host, values.data(), kBytes);
    // Upload, all-reduce and download on one stream; the host waits once, at the end.
    REQUIRE(device->copy_async(send.data(), host, kBytes, CopyKind::kHostToDevice, **stream).ok());
    auto work = comm->all_reduce(send.data(), recv.data(), kCount, DataType::kFloat32,
                                 ReduceOp::kSum, on_stream);
    REQUIRE(work.ok());
    REQUIRE((*work)->wait().ok());
    REQUIRE(
        device->copy_async(host + kBytes, recv.data(), kBytes, CopyKind::kDeviceToHost, **stream)
            .ok());
    REQUIRE(device->synchronize(**stream).ok());
    CHECK(std::memcmp(host + kBytes, values.data(), kBytes) == 0);
    CHECK((*work)->synchronize().ok());
  }
  // A barrier on the stream, then one on the communicator's own.
  finish(comm->barrier(on_stream));
  finish(comm->barrier());
}

TEST_CASE("NCCL sequence numbers and statistics count every call", "[cuda][comm]") {
  auto device = testing::cuda_device_or_skip();
  if (device == nullptr) return;
  auto comm = nccl_or_skip(*device);
  if (comm == nullptr) return;
  constexpr uint64_t kCount = 1000;
  DeviceBuffer a(*device, 4 * kCount);
  DeviceBuffer b(*device, 4 * kCount);
  auto w1 = comm->all_gather(a.data(), b.data(), kCount, DataType::kFloat32);
  auto w2 = comm->reduce_scatter(a.data(), b.data(), kCount, DataType::kFloat32, ReduceOp::kSum);
  auto w3 = comm->all_reduce(a.data(), b.data(), kCount, DataType::kInt32, ReduceOp::kMax);
  auto w4 = comm->broadcast(a.data(), kCount, DataType::kUInt8, 0);
  auto w5 = comm->barrier();
  auto w6 = comm->all_reduce(a.data(), b.data(), kCount / 2, DataType::kFloat32, ReduceOp::kSum);
  for (auto* w : {&w1, &w2, &w3, &w4, &w5, &w6}) REQUIRE(w->ok());
  CHECK((*w1)->sequence() == 1);
  CHECK((*w6)->sequence() == 6);
  for (auto* w : {&w1, &w2, &w3, &w4, &w5, &w6}) CHECK((**w)->synchronize().ok());
  const CommStats stats = comm->stats();
  CHECK(stats[CollectiveKind::kAllGather].calls == 1);
  CHECK(stats[CollectiveKind::kAllGather].bytes == 4 * kCount);
  CHECK(stats[CollectiveKind::kReduceScatter].bytes == 4 * kCount);
  CHECK(stats[CollectiveKind::kAllReduce].calls == 2);
  CHECK(stats[CollectiveKind::kAllReduce].bytes == 4 * kCount + 4 * kCount / 2);
  CHECK(stats[CollectiveKind::kBroadcast].bytes == kCount);
  CHECK(stats[CollectiveKind::kBarrier].calls == 1);
  CHECK(stats[CollectiveKind::kBarrier].bytes == 0);
  CHECK(stats.total_wire_bytes() == 0);  // one rank sends nothing
}

TEST_CASE("NCCL in debug mode checks signatures and a bad root is an error it survives",
          "[cuda][comm]") {
  auto device = testing::cuda_device_or_skip();
  if (device == nullptr) return;
  auto comm = nccl_or_skip(*device, /*debug=*/true);
  if (comm == nullptr) return;
  CHECK(comm->description().find("signatures checked") != std::string::npos);
  DeviceBuffer a(*device, 4096);
  auto bad = comm->broadcast(a.data(), 16, DataType::kFloat32, 1);
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("root 1") != absl::string_view::npos);
  const auto values = floats(1024, 5);
  a.upload(values);
  finish(comm->all_reduce(a.data(), a.data(), 1024, DataType::kFloat32, ReduceOp::kSum));
  CHECK(a.download<float>(1024) == values);
  finish(comm->barrier());
}

TEST_CASE("NCCL needs a CUDA device", "[comm]") {
  auto host = testing::host_device();
  CommOptions options;
  options.launch.master_port = 0;
  options.settings.backend = CommBackendKind::kNccl;
  options.device = host.get();
  auto comm = Communicator::create(options);
  REQUIRE(!comm.ok());
  CHECK(comm.status().code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata
