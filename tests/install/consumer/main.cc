// Creates a host device and a GPU-arena tier through the installed headers and library, moves a
// block's bytes in and out, and checks them.
#include <strata/device/backend.h>
#include <strata/device/host_device.h>
#include <strata/store/tier.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  auto device = strata::make_host_device();
  if (!device.ok()) return 1;
  auto tier = strata::MemoryTier::create_gpu_arena(**device, 8 << 20);
  if (!tier.ok()) return 2;
  auto block = (*tier)->allocate(1 << 20);
  auto stream = (*device)->create_stream();
  if (!block.ok() || !stream.ok()) return 3;
  std::vector<unsigned char> in(1 << 20, 0xab), out(1 << 20, 0);
  void* address = *(*tier)->address(*block);
  if (!(*device)
           ->copy_async(address, in.data(), in.size(), strata::CopyKind::kHostToDevice, **stream)
           .ok() ||
      !(*device)
           ->copy_async(out.data(), address, out.size(), strata::CopyKind::kDeviceToHost, **stream)
           .ok() ||
      !(*device)->synchronize(**stream).ok()) {
    return 4;
  }
  if (std::memcmp(in.data(), out.data(), in.size()) != 0) return 5;
  std::printf("consumer: strata package works\n");
  return 0;
}
