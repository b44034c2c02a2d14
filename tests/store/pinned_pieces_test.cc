// The pinned CPU tier is pinned with the device piece by piece as it fills (not whole at start),
// hands each piece to a listener on its own thread (the runtime's io_uring registration), and
// keeps every byte right when pinning fails part-way.
#include <absl/synchronization/mutex.h>

#include <cstring>
#include <set>
#include <vector>

#include "device/device_fixtures.h"
#include "strata/base/mutex.h"
#include "strata/store/tier.h"

namespace strata {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// The pieces the listener was given, in order.
class Seen {
 public:
  absl::AnyInvocable<void(uint32_t)> listener() {
    return [this](uint32_t piece) {
      MutexLock lock(&mu_);
      pieces_.push_back(piece);
    };
  }
  std::vector<uint32_t> pieces() const {
    MutexLock lock(&mu_);
    return pieces_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<uint32_t> pieces_ ABSL_GUARDED_BY(mu_);
};

uint32_t piece_of(MemoryTier& tier, BlockHandle block) {
  auto address = tier.address(block);
  REQUIRE(address.ok());
  return static_cast<uint32_t>(
      (static_cast<std::byte*>(*address) - static_cast<std::byte*>(tier.base())) /
      tier.piece_bytes());
}

TEST_CASE("The pinned CPU tier pins a piece when it first hands out bytes in it", "[tier]") {
  HostDeviceOptions options;
  options.gate = std::make_shared<HostCopyGate>();
  auto device = testing::host_device(options);
  auto tier = MemoryTier::create_pinned_cpu(*device, 16 * kMiB, kMiB);
  REQUIRE(tier.ok());
  MemoryTier& cpu = **tier;
  CHECK(cpu.piece_bytes() == kMiB);
  PinningStats p = cpu.stats().pinning;
  CHECK(p.pieces == 16);
  CHECK(p.pinned_pieces == 1);  // piece 0, at creation
  CHECK(p.pinned_bytes == kMiB);

  Seen seen;
  cpu.set_piece_listener(seen.listener());
  auto a = cpu.allocate(1536 * kKiB);  // pieces 0 and 1
  REQUIRE(a.ok());
  CHECK(cpu.stats().pinning.pinned_pieces == 2);
  auto top = cpu.allocate(100 * kKiB, Placement::kHigh);  // piece 15
  REQUIRE(top.ok());
  CHECK(piece_of(cpu, *top) == 15);
  CHECK(cpu.stats().pinning.pinned_pieces == 3);
  REQUIRE(cpu.free(*a).ok());
  auto again = cpu.allocate(kMiB);  // in pieces already pinned: nothing new
  REQUIRE(again.ok());
  p = cpu.stats().pinning;
  CHECK(p.pinned_pieces == 3);
  CHECK(p.pinned_bytes == 3 * kMiB);
  CHECK(p.unpinned_pieces == 0);
  cpu.wait_piece_listener();
  CHECK(seen.pieces() == std::vector<uint32_t>{0, 1, 15});
  CHECK(cpu.stats().pinning.listener_pieces == 3);

  // A block across pieces 0 and 1 is copied as two pieces, each within one registration.
  auto gpu = device->allocate_device_memory(2 * kMiB);
  REQUIRE(gpu.ok());
  auto stream = device->create_stream();
  REQUIRE(stream.ok());
  REQUIRE(cpu.free(*again).ok());
  auto span = cpu.allocate(1536 * kKiB);
  REQUIRE(span.ok());
  auto* host = static_cast<unsigned char*>(*cpu.address(*span));
  REQUIRE(host == cpu.base());  // offset 0 again
  for (uint64_t i = 0; i < 1536 * kKiB; ++i) host[i] = static_cast<unsigned char>(i * 31 + 7);
  const uint64_t before = options.gate->passed(CopyKind::kHostToDevice);
  REQUIRE(device->copy_async((*gpu)->data(), host, 1536 * kKiB, CopyKind::kHostToDevice, **stream)
              .ok());
  std::vector<unsigned char> back(1536 * kKiB);
  REQUIRE(
      device
          ->copy_async(back.data(), (*gpu)->data(), back.size(), CopyKind::kDeviceToHost, **stream)
          .ok());
  REQUIRE(device->synchronize(**stream).ok());
  CHECK(options.gate->passed(CopyKind::kHostToDevice) - before == 2);
  CHECK(std::memcmp(back.data(), host, back.size()) == 0);

  // Detached: later pieces are not reported; attached again: every piece in use is.
  cpu.set_piece_listener(nullptr);
  REQUIRE(cpu.allocate(2 * kMiB).ok());  // after `span`: pieces 1 to 3, of which 2 and 3 are new
  CHECK(cpu.stats().pinning.pinned_pieces == 5);
  Seen later;
  cpu.set_piece_listener(later.listener());
  cpu.wait_piece_listener();
  const std::vector<uint32_t> all = later.pieces();
  CHECK(std::set<uint32_t>(all.begin(), all.end()).size() == cpu.stats().pinning.pinned_pieces);
  CHECK(seen.pieces().size() == 3);
  cpu.set_piece_listener(nullptr);  // before `later` and `seen` go
}

// HostDevice refuses a registration that overlaps another, as a stand-in for cudaHostRegister
// failing part-way (out of pinnable memory).
TEST_CASE("A pinning failure leaves the rest unpinned, says so once, and keeps bytes right",
          "[tier]") {
  auto device = testing::host_device();
  auto tier = MemoryTier::create_pinned_cpu(*device, 8 * kMiB, kMiB);
  REQUIRE(tier.ok());
  MemoryTier& cpu = **tier;
  auto* base = static_cast<std::byte*>(cpu.base());
  auto squatter = device->register_host(base + 3 * kMiB + 4096, 4096);
  REQUIRE(squatter.ok());
  auto gpu = device->allocate_device_memory(8 * kMiB);
  REQUIRE(gpu.ok());
  auto stream = device->create_stream();
  REQUIRE(stream.ok());
  std::vector<BlockHandle> blocks;
  for (int i = 0; i < 7; ++i) {
    auto block = cpu.allocate(kMiB);  // pieces 0..6, one each
    REQUIRE(block.ok());
    blocks.push_back(*block);
  }
  const PinningStats p = cpu.stats().pinning;
  CHECK(p.pinned_pieces == 3);    // 0, 1, 2
  CHECK(p.unpinned_pieces == 4);  // 3 failed; 4..6 not tried
  CHECK_THAT(cpu.pinning_warning(), Catch::Contains("piece 3"));
  CHECK_THAT(cpu.pinning_warning(), Catch::Contains("stay unpinned"));
  // Every block round-trips through the device, pinned pieces or not.
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto* host = static_cast<unsigned char*>(*cpu.address(blocks[i]));
    for (uint64_t b = 0; b < kMiB; ++b) host[b] = static_cast<unsigned char>(b * 13 + i);
    auto* dev = static_cast<std::byte*>((*gpu)->data()) + i * kMiB;
    REQUIRE(device->copy_async(dev, host, kMiB, CopyKind::kHostToDevice, **stream).ok());
  }
  REQUIRE(device->synchronize(**stream).ok());
  for (size_t i = 0; i < blocks.size(); ++i) std::memset(*cpu.address(blocks[i]), 0, kMiB);
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto* dev = static_cast<std::byte*>((*gpu)->data()) + i * kMiB;
    REQUIRE(
        device->copy_async(*cpu.address(blocks[i]), dev, kMiB, CopyKind::kDeviceToHost, **stream)
            .ok());
  }
  REQUIRE(device->synchronize(**stream).ok());
  uint64_t wrong = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto* host = static_cast<unsigned char*>(*cpu.address(blocks[i]));
    for (uint64_t b = 0; b < kMiB; ++b) wrong += host[b] != static_cast<unsigned char>(b * 13 + i);
  }
  CHECK(wrong == 0);
}

}  // namespace
}  // namespace strata
