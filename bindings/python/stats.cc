#include "stats.h"

#include <pybind11/stl.h>

#include "names.h"
#include "strata/runtime/runtime.h"

namespace py = pybind11;

namespace strata::python {

py::dict store_stats(const StoreStats& s) {
  py::list tiers;
  for (const TierUsage& u : s.tiers) {
    py::dict d;
    d["kind"] = tier_name(u.kind);
    d["present"] = u.present;
    d["capacity"] = u.capacity;
    d["used"] = u.used;
    d["peak_used"] = u.peak_used;
    d["resident"] = u.resident;
    d["fragmentation"] = u.fragmentation;
    tiers.append(d);
  }
  py::dict moves;
  for (size_t from = 0; from < 3; ++from) {
    for (size_t to = 0; to < 3; ++to) {
      if (from == to) continue;
      const MoveStats& m = s.moves[from][to];
      py::dict d;
      d["bytes"] = m.bytes;
      d["moves"] = m.moves;
      d["ns"] = m.ns;
      moves[py::str(tier_name(static_cast<TierKind>(from)) + "->" +
                    tier_name(static_cast<TierKind>(to)))] = d;
    }
  }
  py::dict schedule;
  schedule["steps"] = s.schedule.steps;
  schedule["trace_length"] = s.schedule.trace_length;
  schedule["acquires"] = s.schedule.acquires;
  schedule["matched"] = s.schedule.matched;
  schedule["realigned"] = s.schedule.realigned;
  schedule["unknown"] = s.schedule.unknown;
  schedule["rerecords"] = s.schedule.rerecords;
  schedule["late"] = s.schedule.late;
  schedule["has_trace"] = s.schedule.has_trace;
  schedule["given_order"] = s.schedule.given_order;
  py::dict d;
  d["tiers"] = tiers;
  d["moves"] = moves;
  d["tensors"] = s.tensors;
  d["acquires"] = s.acquires;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["stall_ns"] = s.stall_ns;
  d["evictions_clean"] = s.evictions_clean;
  d["evictions_writeback"] = s.evictions_writeback;
  d["overwrites"] = s.overwrites;
  d["discards"] = s.discards;
  d["early_writebacks"] = s.early_writebacks;
  d["early_writeback_bytes"] = s.early_writeback_bytes;
  d["early_writebacks_used"] = s.early_writebacks_used;
  d["early_writebacks_wasted"] = s.early_writebacks_wasted;
  d["errors"] = s.errors;
  d["prefetches_issued"] = s.prefetches_issued;
  d["prefetches_used"] = s.prefetches_used;
  d["prefetches_late"] = s.prefetches_late;
  d["prefetches_wasted"] = s.prefetches_wasted;
  d["prefetches_failed"] = s.prefetches_failed;
  d["prefetch_accuracy"] = s.prefetch_accuracy();
  d["schedule"] = schedule;
  return d;
}

py::dict startup_dict(const StartupStats& s) {
  const PinningStats& p = s.pinning;
  py::dict d;
  d["create_seconds"] = s.create_seconds;
  d["piece_bytes"] = p.piece_bytes;
  d["pieces"] = p.pieces;
  d["pinned_pieces"] = p.pinned_pieces;
  d["pinned_bytes"] = p.pinned_bytes;
  d["unpinned_pieces"] = p.unpinned_pieces;
  d["pin_seconds"] = static_cast<double>(p.pin_ns) / 1e9;
  d["listener_pieces"] = p.listener_pieces;
  d["listener_seconds"] = static_cast<double>(p.listener_ns) / 1e9;
  d["registered_bytes"] = s.registered_bytes;
  d["registrations"] = s.registrations;
  d["registration_seconds"] = s.registration_seconds;
  d["registration_failures"] = s.registration_failures;
  d["rings"] = s.rings;
  return d;
}

py::dict config_dict(const ResolvedConfig& c) {
  py::dict d;
  d["backend"] = std::string(to_string(c.backend));
  d["backend_reason"] = c.backend_reason;
  d["device"] = c.device;
  d["device_reason"] = c.device_reason;
  d["gpu_bytes"] = c.gpu_bytes;
  d["cpu_bytes"] = c.cpu_bytes;
  d["nvme_paths"] = c.nvme_paths;
  d["nvme_bytes"] = c.nvme_bytes;
  d["io_engine"] = std::string(to_string(c.io_engine.kind));
  d["io_engine_reason"] = c.io_engine.reason;
  d["io_depth"] = c.io_depth;
  d["io_block"] = c.io_block;
  d["staging_bytes"] = c.staging_bytes;
  d["verify"] = c.verify;
  d["log"] = std::string(to_string(c.log));
  d["warnings"] = c.warnings;
  return d;
}

py::dict optimizer_stats(const OffloadOptimizerStats& s) {
  py::dict d;
  d["steps"] = s.steps;
  d["skipped_steps"] = s.skipped_steps;
  d["failed_steps"] = s.failed_steps;
  d["grads_landed"] = s.grads_landed;
  d["grad_bytes_landed"] = s.grad_bytes_landed;
  d["params"] = s.params;
  d["elements"] = s.elements;
  d["chunk_elements"] = s.chunk_elements;
  d["chunks"] = s.chunks;
  d["last_step_ns"] = s.last_step_ns;
  d["last_step_wait_ns"] = s.last_step_wait_ns;
  d["last_adam_ns"] = s.last_adam_ns;
  d["last_nvme_wait_ns"] = s.last_nvme_wait_ns;
  d["nvme_bytes_read"] = s.nvme_bytes_read;
  d["nvme_bytes_written"] = s.nvme_bytes_written;
  d["peak_staging_chunks"] = s.peak_staging_chunks;
  d["nvme_state_bytes"] = s.nvme_state_bytes;
  d["overlap_early_steps"] = s.overlap_early_steps;
  d["overlap_rollbacks"] = s.overlap_rollbacks;
  d["last_early_elements"] = s.last_early_elements;
  d["last_redone_elements"] = s.last_redone_elements;
  d["last_early_adam_ns"] = s.last_early_adam_ns;
  d["last_rollback_ns"] = s.last_rollback_ns;
  d["last_early_wait_ns"] = s.last_early_wait_ns;
  d["overlap_host_bytes"] = s.overlap_host_bytes;
  d["overlap_budget_misses"] = s.overlap_budget_misses;
  return d;
}

}  // namespace strata::python
