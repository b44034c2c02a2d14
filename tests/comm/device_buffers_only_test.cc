// testing::device_buffers_only (strata/testing/device_buffers_only.h): a Gloo communicator on the
// host backend that takes device memory only, as NCCL does, so that callers' paths for such
// backends (the Python collectives' bounce of host arrays) run without a GPU. It must refuse
// host memory before the call takes a sequence number, and pass device memory through.
#include "strata/testing/device_buffers_only.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/device_copier.h"
#include "device/device_fixtures.h"
#include "strata/comm/communicator.h"

namespace strata {
namespace {

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

std::unique_ptr<Communicator> lone_gloo(Device& device) {
  absl::StatusOr<LaunchInfo> alone = LaunchInfo::from_variables({});
  REQUIRE(alone.ok());
  CommOptions options;
  options.launch = *alone;
  options.settings.backend = CommBackendKind::kGloo;
  options.device = &device;
  auto comm = Communicator::create(options);
  REQUIRE(comm.ok());
  return *std::move(comm);
}

TEST_CASE("device_buffers_only: host memory is refused before it is numbered, device memory runs",
          "[comm][device_buffers_only]") {
  std::unique_ptr<Device> device = testing::host_device();
  std::unique_ptr<Communicator> plain = lone_gloo(*device);
  CHECK_FALSE(plain->needs_device_buffers());  // Gloo takes host memory
  std::unique_ptr<Communicator> comm = testing::device_buffers_only(std::move(plain), *device);
  CHECK(comm->needs_device_buffers());
  CHECK(comm->backend() == CommBackendKind::kGloo);
  CHECK(contains(comm->description(), "(device buffers only: testing)"));

  std::vector<float> host = {1.0F, 2.0F, 3.0F};
  auto refused = comm->all_reduce(host.data(), host.data(), 3, DataType::kFloat32, ReduceOp::kSum);
  REQUIRE_FALSE(refused.ok());
  const std::string why(refused.status().message());
  INFO(why);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(contains(why, "all_reduce: buffer "));
  CHECK(contains(why, " is host memory; this communicator moves "));
  CHECK_FALSE(comm->broadcast(host.data(), 3, DataType::kFloat32, 0).ok());
  CHECK(comm->stats()[CollectiveKind::kAllReduce].calls == 0);  // no sequence number taken
  CHECK(comm->stats()[CollectiveKind::kBroadcast].calls == 0);

  testing::DeviceCopier copier(*device);
  std::vector<uint8_t> bytes(host.size() * sizeof(float));
  std::memcpy(bytes.data(), host.data(), bytes.size());
  std::unique_ptr<DeviceMemory> on_device = copier.copy_of(bytes);
  auto work =
      comm->all_reduce(on_device->data(), on_device->data(), 3, DataType::kFloat32, ReduceOp::kSum);
  INFO(work.status().ToString());
  REQUIRE(work.ok());
  REQUIRE((*work)->synchronize().ok());
  CHECK((*work)->sequence() == 1);
  CHECK(copier.download(on_device->data(), bytes.size()) == bytes);  // one rank: the same
  REQUIRE(comm->broadcast(on_device->data(), 3, DataType::kFloat32, 0).ok());
  CHECK(comm->stats()[CollectiveKind::kAllReduce].calls == 1);

  // A group of a wrapped communicator takes device memory only too.
  auto group = comm->split(0, 0);
  REQUIRE(group.ok());
  CHECK((*group)->needs_device_buffers());
  CHECK_FALSE(
      (*group)->all_reduce(host.data(), host.data(), 3, DataType::kFloat32, ReduceOp::kSum).ok());
  group->reset();
}

}  // namespace
}  // namespace strata
