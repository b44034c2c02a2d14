#include "bench/collective/collective_workload.h"

#include <absl/strings/str_format.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <utility>

#include "bench/report.h"
#include "strata/base/size.h"
#include "strata/comm/communicator.h"
#include "strata/comm/tcp_store.h"
#include "strata/config/config.h"
#include "strata/device/backend.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kOps[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
constexpr uint64_t kFloat = sizeof(float);
// Gloo's reduce-scatter takes an int element count.
constexpr uint64_t kMaxSize = (uint64_t{1} << 31) - kFloat;

int fail(const absl::Status& status) {
  return cli::print_error("offload-bench", std::string(status.message()));
}

absl::Status with_context(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrFormat("collective: %s: %s", what, std::string(status.message())));
}

// Gloo's rendezvous through a strata TcpStore, under a key prefix of the bench's own (the
// communicator's keys live in the same kind of store, but this one is separate anyway).
class BenchStore final : public gloo::rendezvous::Store {
 public:
  explicit BenchStore(TcpStore& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    check(store_.set(kPrefix + key, std::string_view(data.data(), data.size())));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_.get(kPrefix + key);
    check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_.options().timeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> prefixed;
    for (const std::string& key : keys) prefixed.push_back(kPrefix + key);
    check(store_.wait(prefixed, t));
  }

 private:
  static inline const std::string kPrefix = "offload-bench/gloo-baseline/";
  static void check(const absl::Status& status) {
    if (!status.ok()) throw gloo::IoException(std::string(status.message()));
  }
  TcpStore& store_;
};

// The baseline: Gloo called directly, on a context of the bench's own.
class GlooBaseline {
 public:
  // Rank 0 serves a TcpStore on a free port and announces it through `comm`; every rank
  // connects and Gloo's pairs are connected through it.
  static absl::StatusOr<std::unique_ptr<GlooBaseline>> connect(Communicator& comm,
                                                               const LaunchInfo& launch,
                                                               std::chrono::milliseconds timeout) {
    std::unique_ptr<GlooBaseline> b(new GlooBaseline);
    int32_t port = 0;
    if (comm.rank() == 0) {
      auto server = TcpStoreServer::start(launch.master_addr, 0, comm.size());
      if (!server.ok()) return with_context(server.status(), "the baseline's rendezvous");
      b->server_ = *std::move(server);
      port = b->server_->port();
    }
    auto announced = comm.broadcast(&port, 1, DataType::kInt32, 0);
    if (!announced.ok()) return announced.status();
    if (absl::Status s = (*announced)->wait(); !s.ok()) return s;
    TcpStore::Options options;
    options.host = launch.master_addr;
    options.port = static_cast<uint16_t>(port);
    options.rank = comm.rank();
    options.world_size = comm.size();
    options.timeout = timeout;
    auto store = TcpStore::connect(options);
    if (!store.ok()) return with_context(store.status(), "the baseline's rendezvous");
    b->store_ = *std::move(store);
    b->context_ = std::make_shared<gloo::rendezvous::Context>(comm.rank(), comm.size());
    b->context_->setTimeout(timeout);
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = b->store_->local_address();
      BenchStore adapter(*b->store_);
      std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
      b->context_->connectFullMesh(adapter, device);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrFormat("collective: the baseline could not connect Gloo's pairs: %s", e.what()));
    }
    return b;
  }

  // Closes Gloo's pairs and the store connection; rank 0 stops serving only after every rank
  // has closed theirs (a barrier through `comm`).
  absl::Status close(Communicator& comm) {
    context_.reset();
    store_.reset();
    auto barrier = comm.barrier();
    absl::Status status = barrier.ok() ? (*barrier)->wait() : barrier.status();
    server_.reset();
    return status;
  }

  absl::Status barrier() {
    return run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

  // The Gloo calls GlooCommunicator makes for strata's in-place forms, on `data`.
  absl::Status all_gather(float* data, uint64_t count) {
    return run("all_gather", [&] {
      gloo::AllgathervOptions opts(context_);
      opts.setOutput(data, std::vector<size_t>(context_->size, count));
      opts.setTag(next_tag());
      gloo::allgatherv(opts);
    });
  }
  absl::Status reduce_scatter(float* data, uint64_t count) {
    return run("reduce_scatter", [&] {
      const int total = static_cast<int>(count) * context_->size;
      gloo::ReduceScatterHalvingDoubling<float> algorithm(
          context_, {data}, total, std::vector<int>(context_->size, static_cast<int>(count)),
          gloo::ReductionFunction<float>::sum);
      algorithm.run();
    });
  }
  absl::Status all_reduce(float* data, uint64_t count) {
    return run("all_reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(next_tag());
      gloo::allreduce(opts);
    });
  }
  absl::Status broadcast(float* data, uint64_t count) {
    return run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, count);
      opts.setRoot(0);
      opts.setTag(next_tag());
      gloo::broadcast(opts);
    });
  }

 private:
  GlooBaseline() = default;
  uint32_t next_tag() { return tag_++; }
  static absl::Status run(const char* what, const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrFormat(
          "collective: the baseline's %s (Gloo called directly) failed: %s", what, e.what()));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  std::unique_ptr<TcpStore> store_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 0;
};

absl::Status finish(absl::StatusOr<std::unique_ptr<CollectiveWork>> work) {
  if (!work.ok()) return work.status();
  return (*work)->wait();
}

// strata's in-place form of `op` on `data` (size() × count floats).
absl::Status strata_call(Communicator& comm, const std::string& op, float* data, uint64_t count) {
  const uint64_t total = count * static_cast<uint64_t>(comm.size());
  float* own = data + count * static_cast<uint64_t>(comm.rank());
  if (op == "all_gather") return finish(comm.all_gather(own, data, count, DataType::kFloat32));
  if (op == "reduce_scatter") {
    return finish(comm.reduce_scatter(data, own, count, DataType::kFloat32, ReduceOp::kSum));
  }
  if (op == "all_reduce") {
    return finish(comm.all_reduce(data, data, total, DataType::kFloat32, ReduceOp::kSum));
  }
  return finish(comm.broadcast(data, total, DataType::kFloat32, 0));
}

absl::Status baseline_call(GlooBaseline& gloo, const std::string& op, float* data, uint64_t count,
                           int ranks) {
  if (op == "all_gather") return gloo.all_gather(data, count);
  if (op == "reduce_scatter") return gloo.reduce_scatter(data, count);
  if (op == "all_reduce") return gloo.all_reduce(data, count * static_cast<uint64_t>(ranks));
  return gloo.broadcast(data, count * static_cast<uint64_t>(ranks));
}

using Call = std::function<absl::Status()>;

// One sample: the ranks meet at `barrier`, then `calls` collectives back to back; the time of
// one collective on this rank.
absl::StatusOr<double> sample(const Call& barrier, const Call& call, uint64_t calls) {
  if (absl::Status s = barrier(); !s.ok()) return s;
  const Clock::time_point start = Clock::now();
  for (uint64_t i = 0; i < calls; ++i) {
    if (absl::Status s = call(); !s.ok()) return s;
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(calls);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

absl::StatusOr<CollectiveRow> measure_row(Communicator& comm, GlooBaseline& gloo,
                                          const CollectiveBenchOptions& options,
                                          const std::string& op, uint64_t bytes) {
  const int ranks = comm.size();
  const uint64_t count = bytes / kFloat / static_cast<uint64_t>(ranks);
  // Zeros: sums stay zero (no overflow, no denormals however often they are reduced in place).
  std::vector<float> strata_buffer(count * static_cast<uint64_t>(ranks));
  std::vector<float> baseline_buffer(strata_buffer.size());
  CollectiveRow row;
  row.op = op;
  row.bytes = bytes;
  // Whole collectives in --bytes (a size rounded down to whole shards still gets as many).
  row.calls_per_sample = std::max<uint64_t>(1, options.bytes / bytes);
  const Call strata_barrier = [&] { return finish(comm.barrier()); };
  const Call strata = [&] { return strata_call(comm, op, strata_buffer.data(), count); };
  const Call baseline_barrier = [&] { return gloo.barrier(); };
  const Call baseline = [&] {
    return baseline_call(gloo, op, baseline_buffer.data(), count, ranks);
  };
  for (uint64_t i = 0; i < options.warmups; ++i) {
    if (auto s = sample(strata_barrier, strata, row.calls_per_sample); !s.ok()) return s.status();
    if (auto s = sample(baseline_barrier, baseline, row.calls_per_sample); !s.ok()) {
      return s.status();
    }
  }
  // ABBA: strata first in even samples, the baseline first in odd ones.
  std::vector<double> times(2 * options.repeat);  // strata's, then the baseline's
  for (uint64_t i = 0; i < options.repeat; ++i) {
    const bool strata_first = i % 2 == 0;
    for (int side = 0; side < 2; ++side) {
      const bool is_strata = (side == 0) == strata_first;
      auto t = is_strata ? sample(strata_barrier, strata, row.calls_per_sample)
                         : sample(baseline_barrier, baseline, row.calls_per_sample);
      if (!t.ok()) return t.status();
      times[is_strata ? i : options.repeat + i] = *t;
    }
  }
  // Each sample's time is the slowest rank's.
  if (absl::Status s = finish(comm.all_reduce(times.data(), times.data(), times.size(),
                                              DataType::kFloat64, ReduceOp::kMax));
      !s.ok()) {
    return s;
  }
  row.samples_s.assign(times.begin(), times.begin() + static_cast<ptrdiff_t>(options.repeat));
  row.baseline_samples_s.assign(times.begin() + static_cast<ptrdiff_t>(options.repeat),
                                times.end());
  row.time_s = median(row.samples_s);
  row.baseline_time_s = median(row.baseline_samples_s);
  const double gb = static_cast<double>(bytes) / 1e9;
  const double factor = bus_factor(op, ranks);
  row.algbw_gbps = gb / row.time_s;
  row.busbw_gbps = row.algbw_gbps * factor;
  row.baseline_algbw_gbps = gb / row.baseline_time_s;
  row.baseline_busbw_gbps = row.baseline_algbw_gbps * factor;
  row.ratio = row.baseline_time_s / row.time_s;
  return row;
}

// The launch variables (RANK, WORLD_SIZE, ...) and STRATA_COMM_*, checked before anything runs.
absl::Status read_environment(LaunchInfo* launch, CommSettings* settings) {
  auto from_env = LaunchInfo::from_environment();
  if (!from_env.ok()) return from_env.status();
  auto config = Config::from_environment();
  if (!config.ok()) return config.status();
  if (config->comm.backend == CommBackendKind::kNccl) {
    return absl::FailedPreconditionError(
        "collective: STRATA_COMM_BACKEND=nccl: this workload measures host buffers on Gloo only "
        "(an NCCL run with its baseline is not written yet); unset STRATA_COMM_BACKEND or set it "
        "to gloo");
  }
  *launch = *from_env;
  *settings = config->comm;
  // Alone (no launcher): a free port, so that a lone run never collides with another job.
  if (!launch->launched) launch->master_port = 0;
  return absl::OkStatus();
}

// The JSON document: the top-level fields every workload writes, then "collective".
absl::StatusOr<std::string> document(const CollectiveReport& report) {
  auto base = Config::from_environment();
  if (!base.ok()) return base.status();
  auto loaded = load_configuration(*base);
  if (!loaded.ok()) return loaded.status();
  auto device = make_device(loaded->first.backend, loaded->first.device);
  if (!device.ok()) return device.status();
  Report paths;  // no path rows: this workload's results are under "collective"
  paths.engine = "none";
  return document_with(to_json(paths, loaded->first, **device), "collective",
                       collective_json(report));
}

}  // namespace

std::vector<uint64_t> default_collective_sizes() {
  std::vector<uint64_t> sizes;
  for (uint64_t size = uint64_t{64} << 10; size <= uint64_t{64} << 20; size *= 4) {
    sizes.push_back(size);
  }
  return sizes;
}

double bus_factor(const std::string& op, int ranks) {
  const double n = ranks;
  if (op == "all_reduce") return 2 * (n - 1) / n;
  if (op == "broadcast") return 1;
  return (n - 1) / n;
}

std::vector<uint64_t> collective_sizes(const CollectiveBenchOptions& options, int ranks) {
  const uint64_t unit = kFloat * static_cast<uint64_t>(ranks);
  std::vector<uint64_t> out;
  for (uint64_t size : options.sizes) {
    const uint64_t capped = std::max(unit, std::min(size, options.bytes) / unit * unit);
    if (std::find(out.begin(), out.end(), capped) == out.end()) out.push_back(capped);
  }
  return out;
}

std::optional<std::string> validate(const CollectiveBenchOptions& options) {
  if (options.repeat == 0) return "--repeat: must be at least 1";
  if (options.bytes == 0) return "--bytes: must be at least 1";
  if (options.sizes.empty()) return "--tensor-bytes: give at least one size";
  for (uint64_t size : options.sizes) {
    if (std::min(size, options.bytes) > kMaxSize) {
      return absl::StrFormat(
          "--tensor-bytes/--bytes: %s is above %s, the most one Gloo reduce-scatter takes (2^31 "
          "elements): give smaller sizes",
          format_bytes(std::min(size, options.bytes)), format_bytes(kMaxSize));
    }
  }
  return std::nullopt;
}

int run_collective_workload(const CollectiveBenchOptions& options, const cli::FlagSet& flags) {
  LaunchInfo launch;
  CommSettings settings;
  if (absl::Status s = read_environment(&launch, &settings); !s.ok()) return fail(s);
  const bool lead = launch.rank == 0;
  // Opened before the job starts, so that a bad path fails at once, on rank 0 only.
  std::unique_ptr<FILE, int (*)(FILE*)> json_file(nullptr, &std::fclose);
  if (lead && !options.json.empty() && options.json != "-") {
    json_file.reset(std::fopen(options.json.c_str(), "w"));
    if (json_file == nullptr) {
      return flags.usage_error("--json: cannot write '" + options.json +
                               "': " + std::strerror(errno));
    }
  }
  auto comm_or = Communicator::create(CommOptions{.launch = launch, .settings = settings});
  if (!comm_or.ok()) return fail(comm_or.status());
  Communicator& comm = **comm_or;
  const bool json_to_stdout = options.json == "-";
  std::ostream& human = json_to_stdout ? std::cerr : std::cout;

  CollectiveReport report;
  report.backend = std::string(to_string(comm.backend()));
  report.description = comm.description();
  report.ranks = comm.size();
  report.repeat = options.repeat;
  report.warmups = options.warmups;
  report.baseline =
      "Gloo called directly (allgatherv, ReduceScatterHalvingDoubling in place, allreduce with "
      "gloo::sum, broadcast) on a context of its own over gloo::transport::tcp";
  const std::vector<uint64_t> sizes = collective_sizes(options, comm.size());
  auto gloo = GlooBaseline::connect(comm, launch, settings.timeout);
  if (!gloo.ok()) return fail(gloo.status());
  if (lead) {
    human << "offload-bench " << STRATA_VERSION << " workload collective: " << report.description
          << "; " << format_bytes(options.bytes) << " per sample; repeat " << options.repeat
          << " after " << options.warmups << " warm-ups\n";
    print_collective_header(report, human);
    human.flush();
  }
  for (const char* op : kOps) {
    for (uint64_t size : sizes) {
      auto row = measure_row(comm, **gloo, options, op, size);
      if (!row.ok()) return fail(row.status());
      if (lead) {
        print_collective_row(*row, human);
        human.flush();
      }
      report.rows.push_back(*std::move(row));
    }
  }
  if (absl::Status s = (*gloo)->close(comm); !s.ok()) return fail(s);
  if (!lead) return 0;
  print_collective_footer(report, human);
  if (options.json.empty()) return 0;
  auto text = document(report);
  if (!text.ok()) return fail(text.status());
  if (json_to_stdout) {
    std::cout << *text;
  } else if (std::fwrite(text->data(), 1, text->size(), json_file.get()) != text->size() ||
             std::fclose(json_file.release()) != 0) {
    return cli::print_error("offload-bench",
                            "cannot write --json=" + options.json + ": " + std::strerror(errno));
  }
  return 0;
}

}  // namespace strata::bench
