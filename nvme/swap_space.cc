#include "strata/nvme/swap_space.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <span>

#include "strata/base/format_bytes.h"
#include "strata/base/mutex.h"
#include "strata/testing/fault_injector.h"
#include "swap_file.h"

namespace strata {
namespace {

uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace

struct SwapSpace::Impl {
  // A tensor's place: one arena block per path, holding every path-th stripe unit.
  struct Extent {
    uint32_t generation = 0;
    bool live = false;
    std::string name;
    uint64_t bytes = 0;
    uint32_t first_path = 0;          // the path of unit 0; unit i is on (first_path + i) % paths
    std::vector<BlockHandle> blocks;  // per path; invalid where the path holds no unit
    std::vector<uint64_t> checksums;  // per unit, XXH3-64 of its data bytes
    std::vector<uint8_t> valid;       // per unit: written completely, checksum recorded
    uint32_t in_flight = 0;           // reads/writes not yet completed
  };

  // Where one stripe unit lives and how much of it is data.
  struct Unit {
    uint64_t index;
    uint32_t path;
    uint64_t file_offset;
    uint64_t data_bytes;  // tensor bytes in the unit
    uint64_t io_bytes;    // data_bytes rounded up to the O_DIRECT alignment
  };

  // What one read or write shares across its unit requests. A write also counts its hashing,
  // done by the submitting thread while the I/O is in flight, as one more part.
  struct Batch {
    Impl* impl;
    ExtentHandle extent;
    IoOp op;
    std::string tensor;
    std::vector<Unit> units;
    std::vector<uint64_t> checksums;  // writes: per entry of `units`, set by the submitter
    std::vector<uint8_t> written;     // writes: per entry of `units`, set by its completion
    std::atomic<uint64_t> remaining;
    absl::Mutex mu;
    absl::Status status ABSL_GUARDED_BY(mu);
    IoCallback done;
  };

  SwapSpaceOptions options;
  std::vector<SwapFile> files;
  uint64_t alignment = 512;
  uint64_t granularity = 4096;
  std::vector<std::string> warnings;
  std::string engine_reason;
  std::atomic<uint64_t> checksum_failures{0};

  mutable absl::Mutex mu;
  std::vector<Arena> arenas ABSL_GUARDED_BY(mu);
  std::vector<Extent> extents ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> free_slots ABSL_GUARDED_BY(mu);
  uint64_t live_extents ABSL_GUARDED_BY(mu) = 0;
  uint32_t next_first ABSL_GUARDED_BY(mu) = 0;  // round-robin cursor for the first path

  // Last: destroyed first, so in-flight completions finish while everything they touch exists.
  std::unique_ptr<IoEngine> engine;

  uint64_t units_of(uint64_t bytes) const {
    return (bytes + options.stripe_bytes - 1) / options.stripe_bytes;
  }
  uint32_t paths() const { return static_cast<uint32_t>(files.size()); }

  // Bytes path `p` holds of a tensor of `bytes` whose unit 0 is on path `first`.
  uint64_t path_bytes(uint64_t bytes, uint32_t first, uint32_t p) const {
    const uint32_t slot = (p + paths() - first) % paths();  // p holds units slot, slot + paths, ...
    const uint64_t units = units_of(bytes);
    if (units <= slot) return 0;
    const uint64_t count = (units - slot + paths() - 1) / paths();
    const uint64_t last = units - 1;
    if (last % paths() != slot) return count * options.stripe_bytes;
    const uint64_t tail = bytes - last * options.stripe_bytes;
    return (count - 1) * options.stripe_bytes + round_up(tail, granularity);
  }

  // The path for unit 0 of a new tensor of `bytes`, or nullopt when no choice fits. Every start
  // whose blocks all fit is a candidate (so a tensor smaller than a unit may land on any path with
  // room); the one leaving the most free space on its fullest path wins, ties going round robin,
  // so small tensors spread over every path and the paths fill evenly.
  std::optional<uint32_t> choose_first_path(uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::optional<uint32_t> best;
    uint64_t best_margin = 0;
    for (uint32_t k = 0; k < paths(); ++k) {
      const uint32_t first = (next_first + k) % paths();
      bool fits = true;
      uint64_t margin = UINT64_MAX;
      for (uint32_t p = 0; p < paths() && fits; ++p) {
        const uint64_t need = path_bytes(bytes, first, p);
        if (need == 0) continue;
        const ArenaStats stats = arenas[p].stats();
        // Blocks are multiples of the granularity at its alignment: a block fits exactly when
        // the largest free block holds it (best fit).
        fits = need <= stats.largest_free;
        margin = std::min(margin, stats.free - need);
      }
      if (fits && (!best || margin > best_margin)) {
        best = first;
        best_margin = margin;
      }
    }
    return best;
  }

  absl::StatusOr<Extent*> live_extent(ExtentHandle handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!handle.valid() || handle.index >= extents.size()) {
      return absl::InvalidArgumentError("not an extent of this swap space");
    }
    Extent& extent = extents[handle.index];
    if (!extent.live || extent.generation != handle.generation) {
      return absl::NotFoundError("extent was freed (stale handle)");
    }
    return &extent;
  }

  Unit unit(const Extent& extent, uint64_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint32_t path = static_cast<uint32_t>((extent.first_path + index) % paths());
    const uint64_t start = index * options.stripe_bytes;
    const uint64_t data = std::min(options.stripe_bytes, extent.bytes - start);
    return Unit{index, path,
                arenas[path].offset(extent.blocks[path]) + (index / paths()) * options.stripe_bytes,
                data, round_up(data, alignment)};
  }

  // Checks a read/write request and returns its units.
  absl::StatusOr<std::vector<Unit>> units_for(ExtentHandle handle, uint64_t offset,
                                              const void* buffer, uint64_t bytes, IoOp op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto extent = live_extent(handle);
    if (!extent.ok()) return extent.status();
    const Extent& e = **extent;
    const auto fail = [&](std::string_view why) {
      return absl::InvalidArgumentError(absl::StrFormat("%s of tensor '%s' [%d, +%d): %s",
                                                        to_string(op), e.name, offset, bytes, why));
    };
    if (bytes == 0) return fail("zero bytes");
    if (buffer == nullptr) return fail("null buffer");
    if (reinterpret_cast<uintptr_t>(buffer) % alignment != 0) {
      return fail(absl::StrFormat("the buffer must be aligned to %d bytes (O_DIRECT)", alignment));
    }
    if (offset % options.stripe_bytes != 0) {
      return fail(absl::StrFormat("the offset must be a multiple of the stripe unit (%d bytes)",
                                  options.stripe_bytes));
    }
    if (offset > e.bytes || bytes > e.bytes - offset) {
      return fail(absl::StrFormat("the range runs past the tensor's %d bytes", e.bytes));
    }
    const uint64_t end = offset + bytes;
    if (end != e.bytes && end % options.stripe_bytes != 0) {
      return fail("the range must end on a stripe unit or at the tensor's end");
    }
    std::vector<Unit> units;
    for (uint64_t index = offset / options.stripe_bytes; index * options.stripe_bytes < end;
         ++index) {
      units.push_back(unit(e, index));
    }
    return units;
  }

  absl::Status submit(ExtentHandle handle, uint64_t offset, void* buffer, uint64_t bytes, IoOp op,
                      IoCallback done);
  void finish_unit(Batch& batch, size_t entry, std::byte* data, absl::Status status);
  void finish_part(Batch& batch);
};

absl::StatusOr<std::unique_ptr<SwapSpace>> SwapSpace::create(SwapSpaceOptions options) {
  const IoSettingNames& names = options.names;
  if (options.paths.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("swap space needs at least one path (%s is empty)", names.paths));
  }
  if (options.stripe_bytes == 0 || options.stripe_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %d must be a positive multiple of 4096",
                                                      names.stripe, options.stripe_bytes));
  }
  if (absl::Status s = check_io_depth(options.depth); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %s", names.depth, s.message()));
  }
  if (options.bytes_per_path < options.stripe_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s is smaller than one stripe unit (%s %s)", names.bytes_per_path,
        format_bytes(options.bytes_per_path), names.stripe, format_bytes(options.stripe_bytes)));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const SwapSpaceOptions& o = impl->options;
  const uint64_t file_bytes = o.bytes_per_path / 4096 * 4096;
  for (const std::string& path : o.paths) {
    auto file = SwapFile::create(path, file_bytes, o.names);
    if (!file.ok()) return file.status();
    if (!file->warning().empty()) impl->warnings.push_back(file->warning());
    impl->alignment = std::max<uint64_t>(impl->alignment, file->alignment());
    impl->files.push_back(*std::move(file));
  }
  impl->granularity = std::max<uint64_t>(impl->alignment, 4096);
  if (o.stripe_bytes % impl->granularity != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %d is not a multiple of the swap files' O_DIRECT alignment (%d)",
                        o.names.stripe, o.stripe_bytes, impl->granularity));
  }
  {
    MutexLock lock(&impl->mu);
    for (size_t i = 0; i < impl->files.size(); ++i) {
      auto arena =
          Arena::create(file_bytes / impl->granularity * impl->granularity, impl->granularity);
      if (!arena.ok()) return arena.status();
      impl->arenas.push_back(*std::move(arena));
    }
  }

  IoEngineOptions engine_options;
  for (const SwapFile& file : impl->files) {
    engine_options.files.push_back(
        IoFile{file.fd(), absl::StrFormat("swap file in '%s'", file.dir())});
  }
  engine_options.fixed_buffers = o.fixed_buffers;
  engine_options.lazy_buffers = o.lazy_buffers;
  engine_options.depth = o.depth;
  engine_options.workers = static_cast<uint32_t>(impl->files.size());
  engine_options.faults = o.faults;
  engine_options.names = o.names;
  auto choice = o.decided ? make_io_engine(*o.decided, engine_options)
                          : make_io_engine(o.engine, engine_options);
  if (!choice.ok()) return choice.status();
  impl->engine = std::move(choice->engine);
  impl->engine_reason = choice->decision.reason;
  // A fallback decided upstream was already reported there; one made here is reported here.
  const IoEngineDecision& decision = choice->decision;
  if (!decision.warning.empty() && (!o.decided || o.decided->kind != decision.kind)) {
    impl->warnings.push_back(decision.warning);
  }
  if (const std::string warning = impl->engine->warning(); !warning.empty()) {
    impl->warnings.push_back(warning);
  }
  return std::make_unique<SwapSpace>(std::move(impl));
}

SwapSpace::SwapSpace(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SwapSpace::~SwapSpace() = default;

uint64_t SwapSpace::alignment() const { return impl_->alignment; }
uint64_t SwapSpace::stripe_bytes() const { return impl_->options.stripe_bytes; }

uint64_t SwapSpace::capacity() const {
  MutexLock lock(&impl_->mu);
  uint64_t total = 0;
  for (const Arena& arena : impl_->arenas) total += arena.capacity();
  return total;
}

absl::StatusOr<ExtentHandle> SwapSpace::allocate(uint64_t bytes, std::string name) {
  Impl& s = *impl_;
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("tensor '%s': cannot swap 0 bytes", name));
  }
  MutexLock lock(&s.mu);
  const std::optional<uint32_t> first = s.choose_first_path(bytes);
  if (!first) {
    uint64_t free_bytes = 0, capacity = 0, largest = 0;
    for (const Arena& arena : s.arenas) {
      const ArenaStats stats = arena.stats();
      free_bytes += stats.free;
      capacity += stats.capacity;
      largest = std::max(largest, stats.largest_free);
    }
    const uint64_t units = s.units_of(bytes);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "swap space full: tensor '%s' needs %s (%d stripe unit(s) of %s over %d path(s)) but %s "
        "of %s are free across %d path(s), at most %s in one piece on any path; raise %s or "
        "add paths to %s",
        name, format_bytes(bytes), units, format_bytes(s.options.stripe_bytes),
        std::min<uint64_t>(units, s.paths()), format_bytes(free_bytes), format_bytes(capacity),
        s.paths(), format_bytes(largest), s.options.names.bytes_per_path, s.options.names.paths));
  }
  std::vector<BlockHandle> blocks(s.paths());
  for (uint32_t p = 0; p < s.paths(); ++p) {
    const uint64_t need = s.path_bytes(bytes, *first, p);
    if (need == 0) continue;
    auto block = s.arenas[p].allocate(need);
    if (!block.ok()) {  // not expected: choose_first_path checked that every block fits
      for (uint32_t q = 0; q < p; ++q) {
        if (blocks[q].valid()) (void)s.arenas[q].free(blocks[q]);
      }
      return absl::InternalError(
          absl::StrFormat("swap space: tensor '%s' (%s) on path %d of %d: %s", name,
                          format_bytes(bytes), p, s.paths(), block.status().message()));
    }
    blocks[p] = *block;
  }
  s.next_first = (*first + 1) % s.paths();
  uint32_t index;
  if (!s.free_slots.empty()) {
    index = s.free_slots.back();
    s.free_slots.pop_back();
  } else {
    index = static_cast<uint32_t>(s.extents.size());
    s.extents.emplace_back();
  }
  Impl::Extent& extent = s.extents[index];
  extent.live = true;
  extent.name = std::move(name);
  extent.bytes = bytes;
  extent.first_path = *first;
  extent.blocks = std::move(blocks);
  extent.checksums.assign(s.units_of(bytes), 0);
  extent.valid.assign(s.units_of(bytes), 0);
  extent.in_flight = 0;
  ++s.live_extents;
  return ExtentHandle{index, extent.generation};
}

absl::Status SwapSpace::free(ExtentHandle handle) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  auto extent = s.live_extent(handle);
  if (!extent.ok()) return extent.status();
  Impl::Extent& e = **extent;
  if (e.in_flight != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "tensor '%s': cannot free its swap extent while %d read(s)/write(s) are in flight", e.name,
        e.in_flight));
  }
  for (uint32_t p = 0; p < s.paths(); ++p) {
    if (e.blocks[p].valid()) (void)s.arenas[p].free(e.blocks[p]);
  }
  e.live = false;
  ++e.generation;
  e.name.clear();
  e.blocks.clear();
  e.checksums.clear();
  e.valid.clear();
  s.free_slots.push_back(handle.index);
  --s.live_extents;
  return absl::OkStatus();
}

uint64_t SwapSpace::size(ExtentHandle handle) const {
  MutexLock lock(&impl_->mu);
  auto extent = impl_->live_extent(handle);
  return extent.ok() ? (*extent)->bytes : 0;
}

absl::Status SwapSpace::write(ExtentHandle extent, uint64_t offset, const void* src, uint64_t bytes,
                              IoCallback done) {
  // The engine takes void*; a write only reads from it.
  return impl_->submit(extent, offset, const_cast<void*>(src), bytes, IoOp::kWrite,
                       std::move(done));
}

absl::Status SwapSpace::read(ExtentHandle extent, uint64_t offset, void* dst, uint64_t bytes,
                             IoCallback done) {
  return impl_->submit(extent, offset, dst, bytes, IoOp::kRead, std::move(done));
}

absl::Status SwapSpace::Impl::submit(ExtentHandle handle, uint64_t offset, void* buffer,
                                     uint64_t bytes, IoOp op, IoCallback done) {
  auto batch = std::make_shared<Batch>();
  batch->impl = this;
  batch->extent = handle;
  batch->op = op;
  batch->done = std::move(done);
  std::vector<IoRequest> requests;
  {
    MutexLock lock(&mu);
    auto units = units_for(handle, offset, buffer, bytes, op);
    if (!units.ok()) return units.status();
    Extent& e = extents[handle.index];
    if (op == IoOp::kRead) {
      for (const Unit& u : *units) {
        if (!e.valid[u.index]) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "read of tensor '%s': stripe unit %d (bytes [%d, +%d)) holds no data: it was never "
              "written or its last write failed",
              e.name, u.index, u.index * options.stripe_bytes, u.data_bytes));
        }
      }
    } else {
      // Until this write lands, the old contents of these units are no longer the tensor's.
      for (const Unit& u : *units) e.valid[u.index] = 0;
    }
    ++e.in_flight;
    batch->tensor = e.name;
    batch->units = *std::move(units);
    const size_t count = batch->units.size();
    batch->remaining = count + (op == IoOp::kWrite ? 1 : 0);
    if (op == IoOp::kWrite) {
      batch->checksums.assign(count, 0);
      batch->written.assign(count, 0);
    }
    auto* base = static_cast<std::byte*>(buffer);
    for (size_t entry = 0; entry < count; ++entry) {
      const Unit& u = batch->units[entry];
      std::byte* data = base + (u.index * options.stripe_bytes - offset);
      IoRequest request;
      request.op = op;
      request.file = u.path;
      request.offset = u.file_offset;
      request.buffer = data;
      request.length = u.io_bytes;
      request.done = [batch, entry, data](absl::Status status) {
        batch->impl->finish_unit(*batch, entry, data, std::move(status));
      };
      requests.push_back(std::move(request));
    }
  }
  if (auto status = engine->submit(std::span<IoRequest>(requests)); !status.ok()) {
    MutexLock lock(&mu);
    if (auto extent = live_extent(handle); extent.ok()) --(*extent)->in_flight;
    return status;
  }
  if (op == IoOp::kWrite) {
    // The source is final while the write is in flight: hash it here, overlapping the I/O,
    // rather than on the engine's threads, which should be refilling the drive. With
    // verification off nothing would ever check the hash, so none is made.
    const auto* base = static_cast<const std::byte*>(buffer);
    for (size_t entry = 0; options.verify && entry < batch->units.size(); ++entry) {
      const Unit& u = batch->units[entry];
      batch->checksums[entry] =
          XXH3_64bits(base + (u.index * options.stripe_bytes - offset), u.data_bytes);
    }
    finish_part(*batch);
  }
  return absl::OkStatus();
}

void SwapSpace::Impl::finish_unit(Batch& batch, size_t entry, std::byte* data,
                                  absl::Status status) {
  const Unit& u = batch.units[entry];
  const std::string& dir = files[u.path].dir();
  if (!status.ok()) {
    status = absl::Status(
        status.code(),
        absl::StrFormat("%s of tensor '%s', stripe unit %d (bytes [%d, +%d)) in "
                        "'%s': %s",
                        to_string(batch.op), batch.tensor, u.index, u.index * options.stripe_bytes,
                        u.data_bytes, dir, status.message()));
  } else if (batch.op == IoOp::kWrite) {
    batch.written[entry] = 1;  // published to the last part by `remaining`'s acq_rel
  } else if (options.verify) {
    // Verification runs on the engine's thread for this path (after it refilled the ring), so
    // paths verify in parallel.
    const uint64_t checksum = XXH3_64bits(data, u.data_bytes);
    MutexLock lock(&mu);
    const uint64_t expected = extents[batch.extent.index].checksums[u.index];
    if (checksum != expected) {
      checksum_failures.fetch_add(1, std::memory_order_relaxed);
      status = absl::DataLossError(absl::StrFormat(
          "checksum mismatch reading tensor '%s', extent %d, stripe unit %d (bytes [%d, +%d)) "
          "from the swap file in '%s' at offset %d: the data on disk is not what was written "
          "(XXH3 %016x, expected %016x); the drive or something writing to it corrupted it",
          batch.tensor, batch.extent.index, u.index, u.index * options.stripe_bytes, u.data_bytes,
          dir, u.file_offset, checksum, expected));
    }
  }
  if (!status.ok()) {
    MutexLock lock(&batch.mu);
    if (batch.status.ok()) batch.status = std::move(status);
  }
  finish_part(batch);
}

// The last part to finish records a write's checksums and calls `done`.
void SwapSpace::Impl::finish_part(Batch& batch) {
  if (batch.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  {
    MutexLock lock(&mu);
    Extent& e = extents[batch.extent.index];
    if (batch.op == IoOp::kWrite) {
      for (size_t entry = 0; entry < batch.units.size(); ++entry) {
        if (!batch.written[entry]) continue;  // failed: the unit stays unreadable
        e.checksums[batch.units[entry].index] = batch.checksums[entry];
        e.valid[batch.units[entry].index] = 1;
      }
    }
    --e.in_flight;
  }
  absl::Status result;
  {
    MutexLock lock(&batch.mu);
    result = batch.status;
  }
  std::move(batch.done)(std::move(result));
}

absl::Status SwapSpace::write_sync(ExtentHandle extent, const void* src, uint64_t bytes) {
  IoWaiter waiter;
  if (auto status = write(extent, 0, src, bytes, waiter.track()); !status.ok()) return status;
  return waiter.wait();
}

absl::Status SwapSpace::read_sync(ExtentHandle extent, void* dst, uint64_t bytes) {
  IoWaiter waiter;
  if (auto status = read(extent, 0, dst, bytes, waiter.track()); !status.ok()) return status;
  return waiter.wait();
}

absl::Status SwapSpace::register_buffer(uint32_t index) {
  return impl_->engine->register_buffer(index);
}

SwapStats SwapSpace::stats() const {
  const Impl& s = *impl_;
  SwapStats stats;
  stats.engine = std::string(s.engine->name());
  stats.engine_reason = s.engine_reason;
  stats.io = s.engine->stats();
  stats.checksum_failures = s.checksum_failures.load(std::memory_order_relaxed);
  stats.warnings = s.warnings;
  if (const std::string late = s.engine->warning();
      !late.empty() &&
      std::find(stats.warnings.begin(), stats.warnings.end(), late) == stats.warnings.end()) {
    stats.warnings.push_back(late);
  }
  MutexLock lock(&s.mu);
  stats.extents = s.live_extents;
  for (size_t p = 0; p < s.files.size(); ++p) {
    SwapPathStats path;
    path.path = s.files[p].dir();
    path.filesystem = s.files[p].filesystem();
    path.direct_io = s.files[p].direct_io();
    path.alignment = s.files[p].alignment();
    path.arena = s.arenas[p].stats();
    stats.capacity += path.arena.capacity;
    stats.used += path.arena.used;
    stats.paths.push_back(std::move(path));
  }
  return stats;
}

}  // namespace strata
