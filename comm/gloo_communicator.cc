#include "gloo_communicator.h"

#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <climits>
#include <cstring>
#include <deque>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "collective_call.h"
#include "host_reduce.h"
#include "job_monitor.h"
#include "ordered_executor.h"
#include "strata/base/log.h"
#include "strata/base/mutex.h"
#include "strata/base/text.h"
#include "strata/device/device.h"

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

// Gloo's rendezvous reads and writes through this; failures become Gloo exceptions (which
// connectFullMesh expects) and the store's own status is kept for the user's message.
class StoreForGloo final : public gloo::rendezvous::Store {
 public:
  explicit StoreForGloo(TcpStore& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    check(store_.set(key, std::string_view(data.data(), data.size())));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_.get(key);
    check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_.options().timeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    check(store_.wait(keys, t));
  }
  const absl::Status& error() const { return error_; }

 private:
  void check(const absl::Status& status) {
    if (status.ok()) return;
    error_ = status;
    throw gloo::IoException(std::string(status.message()));
  }
  TcpStore& store_;
  absl::Status error_;
};

class GlooWork final : public CollectiveWork {
 public:
  GlooWork(std::shared_ptr<OrderedExecutor> executor,
           std::shared_ptr<OrderedExecutor::Ticket> ticket, uint64_t sequence,
           std::chrono::milliseconds timeout)
      : executor_(std::move(executor)),
        ticket_(std::move(ticket)),
        sequence_(sequence),
        timeout_(timeout) {}

  absl::Status wait() override {
    // Gloo bounds every operation by the timeout; this backstop (twice that, plus the
    // post-mortem) only guards against an engine that never returns.
    const absl::Status status =
        executor_->wait(ticket_, absl::FromChrono(timeout_) * 2 + absl::Seconds(5));
    if (status.code() == absl::StatusCode::kDeadlineExceeded && status.message() == "timed out") {
      return absl::DeadlineExceededError(to_absl(
          cat("collective #", sequence_,
              " did not finish within twice STRATA_COMM_TIMEOUT: the engine is stuck; stop the "
              "job")));
    }
    return status;
  }
  absl::Status synchronize() override { return wait(); }
  uint64_t sequence() const override { return sequence_; }

 private:
  std::shared_ptr<OrderedExecutor> executor_;
  std::shared_ptr<OrderedExecutor::Ticket> ticket_;
  uint64_t sequence_;
  std::chrono::milliseconds timeout_;
};

// Gloo's halving-doubling reduce-scatter is templated on the element type and takes a typed
// reduction; these forward to host_reduce's combine functions.
template <typename T, ReduceOp Op>
void typed_combine(T* x, const T* y, size_t n);

template <typename T>
constexpr DataType data_type_of();
template <>
constexpr DataType data_type_of<uint8_t>() {
  return DataType::kUInt8;
}
template <>
constexpr DataType data_type_of<int32_t>() {
  return DataType::kInt32;
}
template <>
constexpr DataType data_type_of<int64_t>() {
  return DataType::kInt64;
}
template <>
constexpr DataType data_type_of<Float16Bits>() {
  return DataType::kFloat16;
}
template <>
constexpr DataType data_type_of<BFloat16Bits>() {
  return DataType::kBFloat16;
}
template <>
constexpr DataType data_type_of<float>() {
  return DataType::kFloat32;
}
template <>
constexpr DataType data_type_of<double>() {
  return DataType::kFloat64;
}

template <typename T, ReduceOp Op>
void typed_combine(T* x, const T* y, size_t n) {
  static const CombineFn fn = combine_function(data_type_of<T>(), Op);
  fn(x, y, n);
}

template <typename T>
const gloo::ReductionFunction<T>* gloo_reduction(ReduceOp op) {
  static const gloo::ReductionFunction<T> sum(gloo::SUM, &typed_combine<T, ReduceOp::kSum>);
  static const gloo::ReductionFunction<T> max(gloo::MAX, &typed_combine<T, ReduceOp::kMax>);
  static const gloo::ReductionFunction<T> min(gloo::MIN, &typed_combine<T, ReduceOp::kMin>);
  switch (op) {
    case ReduceOp::kMax:
      return &max;
    case ReduceOp::kMin:
      return &min;
    default:
      return &sum;
  }
}

// Calls f(T{}) with the storage type of `type` (Gloo's algorithms are templated on it).
template <typename F>
void with_storage_type(DataType type, F&& f) {
  switch (type) {
    case DataType::kUInt8:
      return f(uint8_t{});
    case DataType::kInt32:
      return f(int32_t{});
    case DataType::kInt64:
      return f(int64_t{});
    case DataType::kFloat16:
      return f(Float16Bits{});
    case DataType::kBFloat16:
      return f(BFloat16Bits{});
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat64:
      return f(double{});
  }
}

// 4 MiB: below where Gloo's halving-doubling reduce-scatter collapsed on loopback.
constexpr uint64_t kReduceScatterPieceBytes = uint64_t{4} << 20;

#if defined(STRATA_TSAN)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

// A Gloo exception's message, written by one of Gloo's threads and handed over under Gloo's own
// locks, which TSan cannot see: its read is hidden from TSan (TSan builds only).
std::string message_of(const std::exception& e) {
#if defined(STRATA_TSAN)
  __tsan_ignore_thread_begin();
  std::string text = e.what();
  __tsan_ignore_thread_end();
  return text;
#else
  return e.what();
#endif
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const CommOptions& options, std::unique_ptr<JobMonitor> monitor,
                   std::shared_ptr<gloo::rendezvous::Context> context)
      : options_(options),
        monitor_(std::move(monitor)),
        context_(std::move(context)),
        executor_(std::make_shared<OrderedExecutor>()) {}

  ~GlooCommunicator() override {
    // Runs what was issued (each bounded by the timeout): the tasks use this communicator, and
    // work handles may keep the executor itself alive past it.
    executor_->drain();
    context_.reset();  // close Gloo's pairs before the job's rendezvous goes
    monitor_.reset();
  }

  int rank() const override { return options_.launch.rank; }
  int size() const override { return options_.launch.world_size; }
  CommBackendKind backend() const override { return CommBackendKind::kGloo; }
  CommStats stats() const override {
    MutexLock lock(&mutex_);
    return stats_;
  }
  std::string description() const override {
    return cat("gloo, rank ", rank(), " of ", size(), ", rendezvous at ",
               options_.launch.master_addr, ":", options_.launch.master_port, ", timeout ",
               format_duration(options_.settings.timeout),
               options_.settings.debug ? ", signatures checked" : "");
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_gather(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type,
      const CollectiveOptions& options) override {
    CollectiveCall call = CollectiveCall::of(CollectiveKind::kAllGather, type);
    call.counts.assign(counts.begin(), counts.end());
    return issue(std::move(call), options, [this, send, recv, type](const CollectiveCall& c) {
      const size_t element = element_size(type);
      // Gathering moves bytes only: byte counts, one code path for every type.
      std::vector<size_t> byte_counts;
      for (uint64_t count : c.counts) byte_counts.push_back(count * element);
      const uint64_t offset =
          std::accumulate(c.counts.begin(), c.counts.begin() + rank(), uint64_t{0});
      uint8_t* own = static_cast<uint8_t*>(recv) + offset * element;
      gloo::AllgathervOptions opts(context_);
      if (send != own) {
        opts.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), byte_counts[rank()]);
      }
      opts.setOutput(static_cast<uint8_t*>(recv), std::move(byte_counts));
      opts.setTag(tag(c));
      gloo::allgatherv(opts);
    });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> reduce_scatter(
      const void* send, void* recv, std::span<const uint64_t> counts, DataType type, ReduceOp op,
      const CollectiveOptions& options) override {
    CollectiveCall call = CollectiveCall::of(CollectiveKind::kReduceScatter, type, op);
    call.counts.assign(counts.begin(), counts.end());
    return issue(std::move(call), options, [this, send, recv, type, op](const CollectiveCall& c) {
      reduce_scatter_in_pieces(c, static_cast<const uint8_t*>(send), static_cast<uint8_t*>(recv),
                               type, op);
      if (op == ReduceOp::kAverage) divide_in_place(recv, c.counts[rank()], type, size());
    });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> all_reduce(
      const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
      const CollectiveOptions& options) override {
    CollectiveCall call = CollectiveCall::of(CollectiveKind::kAllReduce, type, op);
    call.counts = {count};
    return issue(std::move(call), options, [this, send, recv, type, op](const CollectiveCall& c) {
      const size_t element = element_size(type);
      if (send != recv) std::memcpy(recv, send, c.total_bytes());
      const CombineFn combine = combine_function(type, op);
      with_storage_type(type, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(static_cast<T*>(recv), c.total_count());
        // x = a op b over n elements (x may be a).
        opts.setReduceFunction([combine, element](void* x, const void* a, const void* b, size_t n) {
          if (x != a) std::memcpy(x, a, n * element);
          combine(x, b, n);
        });
        opts.setTag(tag(c));
        gloo::allreduce(opts);
      });
      if (op == ReduceOp::kAverage) divide_in_place(recv, c.total_count(), type, size());
    });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> broadcast(
      void* data, uint64_t count, DataType type, int root,
      const CollectiveOptions& options) override {
    CollectiveCall call = CollectiveCall::of(CollectiveKind::kBroadcast, type);
    call.root = root;
    call.counts = {count};
    return issue(std::move(call), options, [this, data, root](const CollectiveCall& c) {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), c.total_bytes());
      opts.setRoot(root);
      opts.setTag(tag(c));
      gloo::broadcast(opts);
    });
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> barrier(
      const CollectiveOptions& options) override {
    CollectiveCall call = CollectiveCall::of(CollectiveKind::kBarrier, DataType::kUInt8);
    return issue(std::move(call), options, [this](const CollectiveCall& c) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag(c));
      gloo::barrier(opts);
    });
  }

 private:
  using Body = std::function<void(const CollectiveCall&)>;
  struct Task {
    CollectiveCall call;
    Body body;
    std::unique_ptr<Event> ready;  // recorded on CollectiveOptions::stream at issue
  };

  // Data and signature exchanges get distinct tags, so a late one never matches the other.
  static uint32_t tag(const CollectiveCall& call) {
    return static_cast<uint32_t>(call.sequence * 2);
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> issue(CollectiveCall call,
                                                        const CollectiveOptions& options,
                                                        Body body) {
    Task task;
    if (options.stream != nullptr) {
      if (options_.device == nullptr) {
        return absl::InvalidArgumentError(
            "a collective was given a stream but the communicator has no device: pass "
            "CommOptions::device (or the device to Communicator::from_environment)");
      }
      absl::StatusOr<std::unique_ptr<Event>> event = options_.device->create_event();
      if (!event.ok()) return event.status();
      if (absl::Status s = options_.device->record(**event, *options.stream); !s.ok()) return s;
      task.ready = *std::move(event);
    }
    MutexLock lock(&mutex_);
    if (!broken_.ok()) return broken_;
    call.sequence = sequence_ + 1;  // taken only by a call that is issued
    if (absl::Status s = check_counts(call, size()); !s.ok()) return s;
    ++sequence_;
    add_to_stats(stats_, call, size(), rank());
    monitor_->issued(call);
    task.call = std::move(call);
    task.body = std::move(body);
    const uint64_t sequence = task.call.sequence;
    auto shared_task = std::make_shared<Task>(std::move(task));
    std::shared_ptr<OrderedExecutor::Ticket> ticket =
        executor_->submit([this, shared_task] { return run(*shared_task); });
    return std::make_unique<GlooWork>(executor_, std::move(ticket), sequence,
                                      options_.settings.timeout);
  }

  // Gloo's halving-doubling reduce-scatter reduces in the buffer it is given and leaves this
  // rank's slice at its start. Above a few MiB per call it collapses here (12 MiB: 40× slower
  // than 10 MiB, for Gloo called directly too — docs/comm.md), so a large call runs as pieces
  // of at most kReduceScatterPieceBytes: piece j takes the j-th part of every rank's slice,
  // packed into a scratch buffer (which also keeps `send` intact out of place). A small call
  // made in place runs on the caller's buffer directly.
  void reduce_scatter_in_pieces(const CollectiveCall& c, const uint8_t* send, uint8_t* recv,
                                DataType type, ReduceOp op) {
    const uint64_t element = element_size(type);
    const int world = size();
    std::vector<uint64_t> offsets(world + 1, 0);
    for (int r = 0; r < world; ++r) offsets[r + 1] = offsets[r] + c.counts[r];
    const uint64_t total = offsets[world];
    const uint64_t mine = c.counts[rank()];
    const uint64_t pieces = std::max<uint64_t>(
        1, (total * element + kReduceScatterPieceBytes - 1) / kReduceScatterPieceBytes);
    const bool in_place = recv == send + offsets[rank()] * element;
    const auto run_piece = [&](void* buffer, const std::vector<int>& counts) {
      with_storage_type(type, [&](auto zero) {
        using T = decltype(zero);
        const int count = std::accumulate(counts.begin(), counts.end(), 0);
        gloo::ReduceScatterHalvingDoubling<T> algorithm(context_, {static_cast<T*>(buffer)}, count,
                                                        counts, gloo_reduction<T>(op));
        algorithm.run();
      });
    };
    if ((world & (world - 1)) != 0) {
      // Not a power of two: Gloo's halving-doubling splits the ranks into binary blocks, and its
      // exchange between blocks lost a rank's contribution now and then under ZeRO stage 3's
      // interleaved traffic (a 3-rank test: the larger block summed zeros for rank 2's part).
      // An all-reduce of the whole buffer (Gloo's ring, new API) is correct at twice the bytes.
      uint8_t* buffer = const_cast<uint8_t*>(send);
      if (!in_place) {
        scratch_.assign(send, send + total * element);
        buffer = scratch_.data();
      }
      const CombineFn combine =
          combine_function(type, op == ReduceOp::kAverage ? ReduceOp::kSum : op);
      with_storage_type(type, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(reinterpret_cast<T*>(buffer), total);
        opts.setReduceFunction([combine, element](void* x, const void* a, const void* b, size_t n) {
          if (x != a) std::memcpy(x, a, n * element);
          combine(x, b, n);
        });
        opts.setTag(tag(c));
        gloo::allreduce(opts);
      });
      uint8_t* own = buffer + offsets[rank()] * element;
      if (mine > 0 && own != recv) std::memmove(recv, own, mine * element);
      return;
    }
    const bool any_empty =
        std::any_of(c.counts.begin(), c.counts.end(), [](uint64_t n) { return n == 0; });
    if (pieces == 1 && in_place && !any_empty) {
      uint8_t* buffer = const_cast<uint8_t*>(send);
      run_piece(buffer, std::vector<int>(c.counts.begin(), c.counts.end()));
      if (mine > 0 && buffer != recv) std::memmove(recv, buffer, mine * element);
      return;
    }
    std::vector<uint64_t> per_piece(world);
    uint64_t piece_total = 0;
    for (int r = 0; r < world; ++r) {
      per_piece[r] = (c.counts[r] + pieces - 1) / pieces;
      piece_total += std::max<uint64_t>(per_piece[r], 1);
    }
    scratch_.resize(piece_total * element);
    std::vector<int> part(world);
    for (uint64_t j = 0; j < pieces; ++j) {
      uint8_t* packed = scratch_.data();
      bool any_data = false;
      for (int r = 0; r < world; ++r) {
        const uint64_t start = std::min(c.counts[r], j * per_piece[r]);
        const uint64_t n = std::min(c.counts[r] - start, per_piece[r]);
        any_data |= n > 0;
        if (n > 0) {
          std::memcpy(packed, send + (offsets[r] + start) * element, n * element);
        } else {
          // Gloo's algorithm can hang when a rank's part is empty (seen with 3 ranks): such a
          // rank gets one zero element whose reduction nobody reads.
          std::memset(packed, 0, element);
        }
        part[r] = static_cast<int>(std::max<uint64_t>(n, 1));
        packed += part[r] * element;
      }
      // Every rank computes the same parts, so an empty piece is skipped everywhere.
      if (!any_data) continue;
      run_piece(scratch_.data(), part);
      // In place this writes only the part of this rank's slice already packed above.
      const uint64_t own_start = std::min(mine, j * per_piece[rank()]);
      const uint64_t own = std::min(mine - own_start, per_piece[rank()]);
      if (own > 0)
        std::memcpy(recv + j * per_piece[rank()] * element, scratch_.data(), own * element);
    }
  }

  absl::Status run(Task& task) {
    {
      MutexLock lock(&mutex_);
      if (!broken_.ok()) return broken_;
    }
    const CollectiveCall& call = task.call;
    if (task.ready != nullptr) {
      if (absl::Status s = options_.device->synchronize(*task.ready); !s.ok()) return fail(s);
    }
    try {
      if (options_.settings.debug && size() > 1) {
        if (absl::Status s = check_signatures(call); !s.ok()) return fail(s);
      }
      if (call.kind == CollectiveKind::kBarrier || call.total_count() > 0) task.body(call);
    } catch (const std::exception& e) {
      return fail(monitor_->post_mortem(call, message_of(e)));
    }
    return absl::OkStatus();
  }

  // Every rank gathers every rank's signature of this call; all see the same table, so all
  // reach the same verdict without a further exchange.
  absl::Status check_signatures(const CollectiveCall& call) {
    const CollectiveCall::Signature mine = call.signature();
    std::vector<CollectiveCall::Signature> all(size());
    gloo::AllgathervOptions opts(context_);
    opts.setInput(const_cast<uint64_t*>(mine.data()), mine.size());
    opts.setOutput(all.front().data(), std::vector<size_t>(size(), mine.size()));
    opts.setTag(tag(call) + 1);
    gloo::allgatherv(opts);
    for (const auto& s : all) {
      if (s != mine) {
        return absl::FailedPreconditionError(to_absl(
            cat(call.describe(), " on rank ", rank(), ": ", mismatch_message(all, rank()))));
      }
    }
    return absl::OkStatus();
  }

  // Marks the communicator broken: every later call returns this error.
  absl::Status fail(absl::Status status) {
    MutexLock lock(&mutex_);
    if (broken_.ok()) broken_ = status;
    return status;
  }

  const CommOptions options_;
  std::unique_ptr<JobMonitor> monitor_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  mutable absl::Mutex mutex_;
  uint64_t sequence_ ABSL_GUARDED_BY(mutex_) = 0;
  CommStats stats_ ABSL_GUARDED_BY(mutex_);
  absl::Status broken_ ABSL_GUARDED_BY(mutex_);
  std::shared_ptr<OrderedExecutor> executor_;  // shared with the works it hands out
  std::vector<uint8_t> scratch_;               // reduce-scatter pieces; used by one task at a time
};

// Gloo's TCP transport writes to its sockets without MSG_NOSIGNAL: once a peer rank has died, a
// write that meets its reset connection raises SIGPIPE, whose default action kills this process
// too (seen in CI: the surviving ranks of a job died of signal 13 instead of reporting the dead
// one). With SIGPIPE handled the write fails with EPIPE, Gloo throws, and the survivors fail
// with the Communicator's error. Installed once, and only over the default disposition: a
// handler (or SIG_IGN) the program chose stays. A do-nothing handler rather than SIG_IGN, so
// that programs this process execs start with the default again.
void handle_sigpipe_once() {
  static const bool installed = [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
        (current.sa_flags & SA_SIGINFO) != 0) {
      return false;
    }
    struct sigaction quiet {};
    quiet.sa_handler = [](int) {};
    sigemptyset(&quiet.sa_mask);
    quiet.sa_flags = SA_RESTART;
    if (sigaction(SIGPIPE, &quiet, nullptr) != 0) return false;
    STRATA_LOG(kDebug, "%s",
               "SIGPIPE is handled: a dead peer's socket fails Gloo's write "
               "instead of killing this process");
    return true;
  }();
  (void)installed;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> create_gloo_communicator(const CommOptions& options) {
  handle_sigpipe_once();
  absl::StatusOr<std::unique_ptr<JobMonitor>> monitor =
      JobMonitor::join(options.launch, options.settings);
  if (!monitor.ok()) return monitor.status();
  const LaunchInfo& launch = options.launch;
  auto context = std::make_shared<gloo::rendezvous::Context>(launch.rank, launch.world_size);
  context->setTimeout(options.settings.timeout);
  StoreForGloo store((*monitor)->store());
  try {
    gloo::transport::tcp::attr attr;
    // The interface that reaches rank 0 reaches the other ranks too.
    attr.hostname = (*monitor)->store().local_address();
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::PrefixStore prefixed("strata/gloo", store);
    context->connectFullMesh(prefixed, device);
  } catch (const std::exception& e) {
    const std::string cause = store.error().ok() ? e.what() : std::string(store.error().message());
    return absl::UnavailableError(
        to_absl(cat("rank ", launch.rank, " of ", launch.world_size,
                    " could not connect Gloo's pairs "
                    "(rendezvous at ",
                    launch.master_addr, ":", launch.master_port, "): ", cause)));
  }
  CommOptions served = options;  // a lone rank's port 0 becomes the one it serves
  served.launch.master_port = (*monitor)->launch().master_port;
  return std::make_unique<GlooCommunicator>(served, *std::move(monitor), std::move(context));
}

}  // namespace strata::comm_internal

// ThreadSanitizer builds only: Gloo is not built with TSan, so TSan sees none of its locks. It
// then reports Gloo's own threads as racing: its halving-doubling reduce-scatter sends from and
// receives into one notification byte (recv and writev called from libgloo), and a pair's stored
// exception (a peer that left first) is freed by the thread that closes the context, and an
// exception a Gloo thread allocated is rethrown to (and read by) the collective's thread. Reports
// with a libgloo frame, on an exception object, or in Gloo's context teardown, are suppressed;
// strata's own accesses stay checked. TSan reads this hook at start (a program that defines its own
// replaces it); it lives here so it is linked whenever the Gloo backend is.
#if defined(STRATA_TSAN)
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libgloo.so\nrace:libgloo.so\nrace:gloo::Exception\n"
         "race:gloo::rendezvous::Context\nrace:__cxa_allocate_exception\n";
}
#endif

// AddressSanitizer builds only: the distribution step of Gloo's halving-doubling reduce-scatter
// (gloo/reduce_scatter.h, compiled into strata from Debian's header) memcpy's a rank's result
// onto an overlapping range of the same buffer; glibc's memcpy on x86-64 is memmove, so the
// result is right, but the interceptor reports it. That one call site is suppressed.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_suppressions() {
  return "interceptor_via_fun:gloo::ReduceScatterHalvingDoubling\n";
}
#endif
