// SwapSpace: the NVMe tier's capacity — one preallocated, unlinked O_DIRECT file per path,
// extents allocated with an Arena per file, a tensor's bytes striped over the paths in stripe
// units, and an XXH3-64 checksum per unit verified on read. Unit i of a tensor lives on path
// (first + i) % paths, where `first` is chosen per tensor by free space (ties round robin), so
// tensors of one unit or less spread over every path and the whole capacity can be filled.
//
// Files are created with O_TMPFILE (or created 0600 and unlinked at once where the file system
// lacks it), so nothing is left behind after exit or a crash and no other user can open them.
// Preallocation (fallocate) makes a disk that cannot hold bytes_per_path an error at start.
// Thread-safe.
#pragma once

#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/allocator/arena.h"
#include "strata/nvme/io_engine.h"

namespace strata {

class FaultInjector;

struct SwapSpaceOptions {
  std::vector<std::string> paths;             // directories; one swap file each
  uint64_t bytes_per_path = 0;                // preallocated per file
  uint64_t stripe_bytes = uint64_t{1} << 20;  // one I/O request per unit
  uint32_t depth = 32;                        // requests in flight per path (check_io_depth)
  IoEngineKind engine = IoEngineKind::kAuto;  // what was asked for
  // The decision made upstream (the runtime's, from its io_uring probe): started as decided and
  // made again only when io_uring fails to start or to read under auto. Without it the engine is
  // decided at start from `engine`.
  std::optional<IoEngineDecision> decided;
  bool verify = true;                   // checksums recorded on write and checked on read
  std::vector<IoBuffer> fixed_buffers;  // pinned memory to register (the CPU tier)
  // Register each fixed buffer only on register_buffer() (IoEngineOptions::lazy_buffers).
  bool lazy_buffers = false;
  std::shared_ptr<FaultInjector> faults;  // tests only
  IoSettingNames names;                   // how errors name the settings (the runtime's variables)
};

// An extent: a tensor's place in swap. Stable until freed; stale handles are detected.
struct ExtentHandle {
  uint32_t index = UINT32_MAX;
  uint32_t generation = 0;
  bool valid() const { return index != UINT32_MAX; }
  friend bool operator==(const ExtentHandle&, const ExtentHandle&) = default;
};

struct SwapPathStats {
  std::string path;
  std::string filesystem;
  bool direct_io = true;  // false: the file system refused O_DIRECT, buffered I/O is used
  uint32_t alignment = 0;
  ArenaStats arena;
};

struct SwapStats {
  std::string engine;         // "io_uring" or "psync"
  std::string engine_reason;  // why that engine
  IoStats io;
  uint64_t capacity = 0;  // the sum over all paths
  uint64_t used = 0;      // the sum over all paths
  uint64_t extents = 0;
  uint64_t checksum_failures = 0;
  std::vector<SwapPathStats> paths;
  // Degraded but working (buffered I/O, psync fallback, unregistered buffers): print once.
  // A buffer registration that failed after start is here too (and was logged once then).
  std::vector<std::string> warnings;
};

class SwapSpace {
 public:
  static absl::StatusOr<std::unique_ptr<SwapSpace>> create(SwapSpaceOptions options);
  ~SwapSpace();
  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;

  // Buffers given to read/write must be aligned to this (the largest O_DIRECT alignment of the
  // paths, at least 512) and hold round_up(bytes, alignment()) bytes.
  uint64_t alignment() const;
  uint64_t stripe_bytes() const;
  uint64_t capacity() const;  // the sum over all paths

  // Reserves room for `bytes`, striped over the paths from a first path chosen by free space
  // (ties round robin). `name` (the tensor's) appears in errors. ResourceExhausted when no path
  // (for small tensors) or no rotation of the paths (for striped ones) has room; the message
  // gives the free bytes of every path together and the largest free run of any one. Nothing
  // already stored is affected.
  absl::StatusOr<ExtentHandle> allocate(uint64_t bytes, std::string name);
  absl::Status free(ExtentHandle extent);
  uint64_t size(ExtentHandle extent) const;

  // Asynchronous: `done` runs once — on an I/O thread, or on the calling thread when a write's
  // hashing finishes last — when every unit of [offset, offset + bytes)
  // of the extent is written (checksums recorded) or read (checksums verified when `verify`).
  // `offset` must be a multiple of stripe_bytes(); the range must lie inside the extent. The buffer
  // must stay valid until `done`. A failed write leaves the source untouched and the range
  // unreadable until it is written again; a failed read names the tensor, the unit, the path and
  // the reason. Returns an error (and does not call `done`) only when the request itself is
  // invalid.
  absl::Status write(ExtentHandle extent, uint64_t offset, const void* src, uint64_t bytes,
                     IoCallback done);
  absl::Status read(ExtentHandle extent, uint64_t offset, void* dst, uint64_t bytes,
                    IoCallback done);

  // Whole-extent synchronous forms.
  absl::Status write_sync(ExtentHandle extent, const void* src, uint64_t bytes);
  absl::Status read_sync(ExtentHandle extent, void* dst, uint64_t bytes);

  // Registers fixed_buffers[index] with the engine's rings (lazy_buffers; see
  // IoEngine::register_buffer: a failure is reported once, and I/O goes on unregistered).
  absl::Status register_buffer(uint32_t index);

  SwapStats stats() const;

  struct Impl;
  explicit SwapSpace(std::unique_ptr<Impl> impl);  // use create()

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
