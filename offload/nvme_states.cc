// Optimizer states on NVMe (ZeRO-Infinity): all parameters' elements, concatenated in
// registration order, are cut into chunks of chunk_elements; a chunk's master, exp_avg and
// exp_avg_sq arrays lie back to back in one swap extent, so one read brings everything a chunk's
// step needs. Each chunk has two extents (slots): a new state is written to the slot not holding
// the committed one and becomes current only when the caller commits, so a failed write never
// destroys the last good state. That doubles the swap space used (24 bytes an element).
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cstring>

#include "optimizer_impl.h"
#include "strata/base/mutex.h"

namespace strata {

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
  {
    MutexLock lock(&state_mu);
    extent = chunks[chunk].slots[slot];
    counters.nvme_bytes_read += chunk_state_bytes();
  }
  return runtime.nvme()->read(extent, 0, dst, chunk_state_bytes(),
                              [&done](absl::Status status) { done.signal(std::move(status)); });
}

absl::Status OffloadOptimizer::Impl::write_chunk(uint64_t chunk, uint32_t slot, const void* src,
                                                 Completion& done) {
  ExtentHandle extent;
  {
    MutexLock lock(&state_mu);
    extent = chunks[chunk].slots[slot];
    counters.nvme_bytes_written += chunk_state_bytes();
  }
  return runtime.nvme()->write(extent, 0, src, chunk_state_bytes(),
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
    bool fresh;
    {
      MutexLock lock(&state_mu);
      fresh = c >= chunks.size();
    }
    if (fresh) {
      NvmeChunk chunk;
      for (uint32_t slot = 0; slot < 2; ++slot) {
        auto extent =
            nvme.allocate(chunk_state_bytes(), absl::StrFormat("optimizer states, chunk %d", c));
        if (!extent.ok()) {
          if (slot == 1) (void)nvme.free(chunk.slots[0]);
          return absl::Status(
              extent.status().code(),
              absl::StrCat("optimizer states on NVMe need ", 24, " bytes an element (two slots); ",
                           extent.status().message()));
        }
        chunk.slots[slot] = *extent;
      }
      MutexLock lock(&state_mu);
      chunks.push_back(chunk);
      std::memset(state, 0, chunk_state_bytes());
    } else {
      Completion read;
      if (auto st = read_chunk(c, current_slot(c), state, read); !st.ok()) return st;
      if (auto st = read.wait(); !st.ok()) return st;
    }
    const uint64_t chunk_begin = c * chunk_elements;
    const uint64_t from = std::max(chunk_begin, flat_offset);
    const uint64_t to = std::min(chunk_begin + chunk_elements, flat_offset + count);
    std::memcpy(state + (from - chunk_begin), master + (from - flat_offset), (to - from) * 4);
    std::memset(state + chunk_elements + (from - chunk_begin), 0, (to - from) * 4);
    std::memset(state + 2 * chunk_elements + (from - chunk_begin), 0, (to - from) * 4);
    // A fresh chunk's slot 0 is current, but nothing is committed in it yet: write it there.
    const uint32_t slot = fresh ? current_slot(c) : current_slot(c) ^ 1U;
    Completion written;
    if (auto st = write_chunk(c, slot, state, written); !st.ok()) return st;
    if (auto st = written.wait(); !st.ok()) {
      if (fresh) {  // its only slot is unreadable now: drop the chunk, a later append retries
        MutexLock lock(&state_mu);
        for (ExtentHandle e : chunks.back().slots) (void)nvme.free(e);
        chunks.pop_back();
      }
      return absl::Status(
          st.code(), absl::StrCat("writing the initial state of '", name, "': ", st.message()));
    }
    if (!fresh) commit_slots({c});
  }
  return absl::OkStatus();
}

}  // namespace strata
