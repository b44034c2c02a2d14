// Optimizer states on NVMe (ZeRO-Infinity): all parameters' elements, concatenated in
// registration order, are cut into chunks of chunk_elements; a chunk's master, exp_avg and
// exp_avg_sq arrays lie back to back in one swap extent, so one read brings everything a chunk's
// step needs. Each array is as long as the chunk's registered elements rounded up to
// kNvmeChunkGranule (its stride), so a step moves the bytes of the states it steps: a model
// smaller than one chunk does not pay for the whole chunk. Each chunk has two extents (slots): a
// new state is written to the slot not holding the committed one and becomes current only when
// the caller commits, so a failed write never destroys the last good state. That doubles the
// swap space used (24 bytes an element).
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cstring>

#include "optimizer_impl.h"
#include "strata/base/mutex.h"

namespace strata {
namespace {

uint64_t stride_for(uint64_t elements) {
  return (elements + kNvmeChunkGranule - 1) / kNvmeChunkGranule * kNvmeChunkGranule;
}

}  // namespace

uint64_t OffloadOptimizer::Impl::chunk_stride(uint64_t chunk) const {
  MutexLock lock(&state_mu);
  return chunks[chunk].stride;
}

uint64_t OffloadOptimizer::Impl::nvme_state_bytes() const {
  uint64_t bytes = 0;
  for (const NvmeChunk& c : chunks) bytes += 2 * 12 * c.stride;
  return bytes;
}

uint32_t OffloadOptimizer::Impl::current_slot(uint64_t chunk) const {
  MutexLock lock(&state_mu);
  return chunks[chunk].current;
}

void OffloadOptimizer::Impl::commit_slots(const std::vector<uint64_t>& written) {
  MutexLock lock(&state_mu);
  for (uint64_t c : written) chunks[c].current ^= 1U;
}

absl::Status OffloadOptimizer::Impl::read_chunk(uint64_t chunk, uint32_t slot, void* dst,
                                                Completion& done) {
  ExtentHandle extent;
  uint64_t bytes;
  {
    MutexLock lock(&state_mu);
    extent = chunks[chunk].slots[slot];
    bytes = 12 * chunks[chunk].stride;
    counters.nvme_bytes_read += bytes;
  }
  return runtime.nvme()->read(extent, 0, dst, bytes,
                              [&done](absl::Status status) { done.signal(std::move(status)); });
}

absl::Status OffloadOptimizer::Impl::write_chunk(uint64_t chunk, uint32_t slot, const void* src,
                                                 Completion& done) {
  ExtentHandle extent;
  uint64_t bytes;
  {
    MutexLock lock(&state_mu);
    extent = chunks[chunk].slots[slot];
    bytes = 12 * chunks[chunk].stride;
  }
  return write_extent(extent, src, bytes, done);
}

absl::Status OffloadOptimizer::Impl::write_extent(ExtentHandle extent, const void* src,
                                                  uint64_t bytes, Completion& done) {
  {
    MutexLock lock(&state_mu);
    counters.nvme_bytes_written += bytes;
  }
  return runtime.nvme()->write(extent, 0, src, bytes,
                               [&done](absl::Status status) { done.signal(std::move(status)); });
}

std::vector<Piece> OffloadOptimizer::Impl::chunk_pieces(uint64_t chunk,
                                                        const std::vector<Param>& list,
                                                        const std::vector<bool>* only) const {
  std::vector<Piece> pieces;
  const uint64_t begin = chunk * chunk_elements;
  const uint64_t end = begin + chunk_elements;
  // Parameters are in flat order: find the first that ends after `begin`.
  auto it = std::partition_point(list.begin(), list.end(),
                                 [&](const Param& p) { return p.flat_offset + p.count <= begin; });
  for (; it != list.end() && it->flat_offset < end; ++it) {
    const auto index = static_cast<uint32_t>(it - list.begin());
    if (only != nullptr && !(*only)[index]) continue;
    const uint64_t from = std::max(begin, it->flat_offset);
    const uint64_t to = std::min(end, it->flat_offset + it->count);
    pieces.push_back(Piece{index, from - it->flat_offset, to - from, from - begin});
  }
  return pieces;
}

absl::Status OffloadOptimizer::Impl::nvme_append(const std::string& name, uint64_t flat_offset,
                                                 uint64_t count, const float* master) {
  SwapSpace& nvme = *runtime.nvme();
  StagingPool::Lease lease = pool->acquire();
  auto* state = static_cast<float*>(lease.data());
  const uint64_t first = flat_offset / chunk_elements;
  const uint64_t last = (flat_offset + count - 1) / chunk_elements;
  for (uint64_t c = first; c <= last; ++c) {
    const uint64_t chunk_begin = c * chunk_elements;
    const uint64_t from = std::max(chunk_begin, flat_offset);
    const uint64_t to = std::min(chunk_begin + chunk_elements, flat_offset + count);
    const uint64_t kept = from - chunk_begin;  // elements registered in the chunk before
    const uint64_t used = to - chunk_begin;    // and after this append
    const uint64_t stride = stride_for(used);
    bool fresh;
    uint64_t old_stride = 0;
    {
      MutexLock lock(&state_mu);
      fresh = c >= chunks.size();
      if (!fresh) old_stride = chunks[c].stride;
    }
    if (!fresh) {
      Completion read;
      if (auto st = read_chunk(c, current_slot(c), state, read); !st.ok()) return st;
      if (auto st = read.wait(); !st.ok()) return st;
      // The arrays move up to the longer stride: exp_avg_sq first, whose new place may cover
      // exp_avg's old one.
      if (stride != old_stride) {
        std::memmove(state + 2 * stride, state + 2 * old_stride, kept * 4);
        std::memmove(state + stride, state + old_stride, kept * 4);
      }
    }
    for (uint64_t a = 0; a < 3; ++a) {  // the new elements' moments and the padding: zero
      std::memset(state + a * stride + kept, 0, (stride - kept) * 4);
    }
    std::memcpy(state + kept, master + (from - flat_offset), (to - from) * 4);

    if (!fresh && stride == old_stride) {  // the other slot, committed once written
      Completion written;
      absl::Status st = write_chunk(c, current_slot(c) ^ 1U, state, written);
      st = st.ok() ? written.wait() : st;
      if (!st.ok()) {
        return absl::Status(
            st.code(), absl::StrCat("writing the initial state of '", name, "': ", st.message()));
      }
      commit_slots({c});
      continue;
    }
    // A new chunk, or one whose arrays grew: two new slots of the new size; the new state goes
    // into the first, and the old slots are freed only once it is written.
    ExtentHandle slots[2];
    for (uint32_t slot = 0; slot < 2; ++slot) {
      auto extent = nvme.allocate(12 * stride, absl::StrFormat("optimizer states, chunk %d", c));
      if (!extent.ok()) {
        if (slot == 1) (void)nvme.free(slots[0]);
        return absl::Status(
            extent.status().code(),
            absl::StrCat("optimizer states on NVMe need ", 24, " bytes an element (two slots); ",
                         extent.status().message()));
      }
      slots[slot] = *extent;
    }
    Completion written;
    absl::Status st = write_extent(slots[0], state, 12 * stride, written);
    st = st.ok() ? written.wait() : st;
    if (!st.ok()) {  // nothing changed: the chunk (if any) keeps its slots
      for (ExtentHandle e : slots) (void)nvme.free(e);
      return absl::Status(
          st.code(), absl::StrCat("writing the initial state of '", name, "': ", st.message()));
    }
    MutexLock lock(&state_mu);
    if (fresh) {
      chunks.push_back(NvmeChunk{{slots[0], slots[1]}, 0, stride});
    } else {
      for (ExtentHandle e : chunks[c].slots) (void)nvme.free(e);
      chunks[c] = NvmeChunk{{slots[0], slots[1]}, 0, stride};
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
