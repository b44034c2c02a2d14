// offload-bench --workload=collective: strata's collectives (Communicator) against the same
// engine called directly, measured in the same run, under strata-run -n N (or alone: one rank).
//
// For each operation (all_gather, reduce_scatter, all_reduce, broadcast) and each size of the
// sweep (nccl-tests' "size": all_gather the gathered output, reduce_scatter the full input,
// all_reduce and broadcast the buffer; float32, equal shards, in place), a timed sample is
// max(1, floor(--bytes / size)) collectives back to back, each issued and waited; the time of one
// collective is the sample's time over that count. Ranks meet at a barrier through the engine
// being timed before each sample; each sample's time is the slowest rank's (an all-reduce max
// after the measurement, as nccl-tests does). Reported: the median over --repeat samples, after
// warm-ups, of strata's time and of the baseline's, alternated sample by sample in ABBA order;
// algorithm bandwidth size / time and bus bandwidth per nccl-tests (all_gather and
// reduce_scatter × (n−1)/n, all_reduce × 2(n−1)/n, broadcast × 1).
//
// The baseline on Gloo: a gloo::rendezvous::Context of the bench's own (its own TCP store,
// served by rank 0 on a free port announced through strata's communicator) and the Gloo calls
// strata makes (allgatherv, ReduceScatterHalvingDoubling in place, allreduce, broadcast) on a
// plain buffer of the same size (docs/bench.md).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli.h"

namespace strata::bench {

// 64 KiB, 256 KiB, 1 MiB, 4 MiB, 16 MiB, 64 MiB.
std::vector<uint64_t> default_collective_sizes();

struct CollectiveBenchOptions {
  uint64_t bytes = uint64_t{64} << 20;  // --bytes: bytes per timed sample (and the largest size)
  std::vector<uint64_t> sizes;          // --tensor-bytes: the sweep, in the given order
  uint64_t repeat = 10;                 // timed samples per operation and size
  uint64_t warmups = 2;                 // untimed samples of each side before them
  std::string json;                     // "-": stdout; "": none
};

// One operation at one size.
struct CollectiveRow {
  std::string op;  // "all_gather", "reduce_scatter", "all_reduce", "broadcast"
  uint64_t bytes = 0;
  uint64_t calls_per_sample = 0;
  double time_s = 0;  // strata: the median time of one collective (the slowest rank's)
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  double baseline_time_s = 0;
  double baseline_algbw_gbps = 0;
  double baseline_busbw_gbps = 0;
  double ratio = 0;               // baseline time / strata time = strata busbw / baseline busbw
  std::vector<double> samples_s;  // per timed sample, one collective's time, slowest rank
  std::vector<double> baseline_samples_s;
};

struct CollectiveReport {
  std::string backend;      // "gloo"
  std::string description;  // Communicator::description() on rank 0
  std::string baseline;     // what the baseline is, in words
  int ranks = 1;
  uint64_t repeat = 0;
  uint64_t warmups = 0;
  std::vector<CollectiveRow> rows;
};

// The bus-bandwidth factor of nccl-tests for `op` over `ranks` ranks.
double bus_factor(const std::string& op, int ranks);

// The sizes actually measured: each of options.sizes capped at options.bytes and rounded down
// to a multiple of 4 × ranks (equal float32 shards; at least one element per rank), each once.
std::vector<uint64_t> collective_sizes(const CollectiveBenchOptions& options, int ranks);

// A usage error in `options` (the message names the flag), or nullopt.
std::optional<std::string> validate(const CollectiveBenchOptions& options);

// Joins the job (launch variables, STRATA_COMM_*), runs the workload and, on rank 0, prints
// the table (stdout; stderr with --json=-) and writes the JSON document. Returns the exit code.
int run_collective_workload(const CollectiveBenchOptions& options, const cli::FlagSet& flags);

// The table, printed as the rows come: a header, one line per row, the notes under it.
void print_collective_header(const CollectiveReport& report, std::ostream& out);
void print_collective_row(const CollectiveRow& row, std::ostream& out);
void print_collective_footer(const CollectiveReport& report, std::ostream& out);
// The value of the "collective" key of offload-bench's JSON document.
nlohmann::ordered_json collective_json(const CollectiveReport& report);

}  // namespace strata::bench
