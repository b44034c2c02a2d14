// The store's side of moving bytes: the MoveGuard bracket, issuing a move through the TierMover
// (which never sees the store), and the completion worker that finishes moves the host must see
// end (write-backs, fetches into host memory) and drops evicted copies once their device work is
// over. Nothing here blocks the thread that asked for the move on a device copy.
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>

#include "strata/base/log.h"
#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

// ---- MoveGuard ------------------------------------------------------------------------------

Impl::MoveGuard::MoveGuard(Impl& s, Tensor& t, TierKind from, TierKind to)
    : s_(&s),
      t_(&t),
      from_(from),
      to_(to),
      version_(t.version),
      host_reads_(from == TierKind::kCpu && to == TierKind::kNvme) {
  Copy& src = t.copies[tier_index(from)];
  Copy& dst = t.copies[tier_index(to)];
  src.begin_move_out();
  s.cancel_eviction(t, to);  // being filled: wanted again
  dst.begin_arrival();
  ++t.operations;
  s.update_pin(t, from);
  s.update_pin(t, to);
}

Impl::MoveGuard::MoveGuard(MoveGuard&& other) noexcept
    : s_(other.s_),
      t_(other.t_),
      from_(other.from_),
      to_(other.to_),
      version_(other.version_),
      host_reads_(other.host_reads_),
      reading_(other.reading_),
      active_(std::exchange(other.active_, false)) {}

Impl::MoveGuard::~MoveGuard() { finish(false); }

void Impl::MoveGuard::issued() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!active_ || !reading_ || host_reads_) return;
  reading_ = false;
  t_->copies[tier_index(from_)].move_reads_issued();
  s_->changed.SignalAll();
}

void Impl::MoveGuard::finish(bool succeeded) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!active_) return;
  active_ = false;
  Tensor& t = *t_;
  Copy& src = t.copies[tier_index(from_)];
  Copy& dst = t.copies[tier_index(to_)];
  src.end_move_out(reading_);
  if (succeeded && t.version == version_) {
    dst.arrive();
  } else {
    dst.miss_arrival();
  }
  s_->update_pin(t, from_);
  s_->update_pin(t, to_);
  --t.operations;
  s_->changed.SignalAll();
}

// ---- issuing --------------------------------------------------------------------------------

namespace {

absl::Status in_context(const Impl::Tensor& t, TierKind from, TierKind to,
                        const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrFormat("moving tensor '%s' (%d bytes) from %s to %s: %s", t.name,
                                      t.bytes, to_string(from), to_string(to), status.message()));
}

void count_move(StoreStats& counters, TierKind from, TierKind to, uint64_t bytes, uint64_t ns) {
  MoveStats& m = counters.moves[tier_index(from)][tier_index(to)];
  m.bytes += bytes;
  ++m.moves;
  m.ns += ns;
}

uint64_t ns_since(absl::Time start) {
  return static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
}

}  // namespace

absl::StatusOr<std::shared_ptr<Impl::InFlight>> Impl::start_move(Tensor& t, TierKind from,
                                                                 TierKind to) {
  MoveGuard guard(*this, t, from, to);  // pins both copies before their addresses are taken
  const auto place = [&](TierKind k) {
    Place p;
    p.tier = k;
    if (k == TierKind::kNvme) {
      p.extent = t.copies[tier_index(k)].extent;
    } else {
      p.address = address(t, k);
    }
    return p;
  };
  const Place source = place(from);
  const Place destination = place(to);
  // Work on either copy comes first; so do GPU compaction copies still in flight.
  std::vector<std::shared_ptr<Event>> after;
  for (TierKind k : {from, to}) {
    for (const Busy& b : t.copies[tier_index(k)].busy) after.push_back(b.event);
  }
  if (from == TierKind::kGpu || to == TierKind::kGpu) {
    if (std::shared_ptr<Event> fence = gpu.pending_compaction()) after.push_back(fence);
  }
  const uint64_t bytes = t.bytes;
  STRATA_LOG(kDebug, "move '%s' %s -> %s, %d bytes", t.name, to_string(from), to_string(to), bytes);
  const bool fetch = from == TierKind::kNvme;
  if (fetch) {
    ++counters.fetches_in_flight;
    counters.fetches_in_flight_peak =
        std::max(counters.fetches_in_flight_peak, counters.fetches_in_flight);
  }
  const uint64_t trace_id = timeline != nullptr ? Timeline::next_id() : 0;
  t.copies[tier_index(to)].move_id = trace_id;
  const absl::Time start = absl::Now();
  absl::StatusOr<MoveTicket> ticket;
  {
    MutexUnlock unlock(&mu);
    ticket = mover->move(source, destination, bytes, after, trace_id);
  }
  const absl::Time issue_end = absl::Now();
  if (!ticket.ok()) {
    if (fetch) --counters.fetches_in_flight;
    trace_move(t, from, to, trace_id, start, issue_end, absl::InfinitePast(),
               Timeline::thread_track(), false);
    guard.finish(false);
    ++counters.errors;
    return in_context(t, from, to, ticket.status());
  }
  // Arrivals on the GPU from the CPU tier are stream-ordered: whoever uses either copy next waits
  // on the event, so the destination is valid now. Everything with host I/O in it (NVMe reads
  // and writes) or ending in host memory is finished by the completion worker.
  if (ticket->host == nullptr && (to == TierKind::kGpu || ticket->event == nullptr)) {
    if (ticket->event != nullptr) {
      if (from != TierKind::kNvme) add_busy(t, from, ticket->stream, ticket->event);
      add_busy(t, to, ticket->stream, ticket->event);
    }
    guard.finish(true);
    if (fetch) --counters.fetches_in_flight;
    count_move(counters, from, to, bytes, ns_since(start));
    // Stream-ordered: the host sees it end when issued (the device copy may still run).
    trace_move(t, from, to, trace_id, start, issue_end, absl::InfinitePast(),
               Timeline::thread_track(), true);
    return nullptr;
  }
  // The rest end on the host's view (the destination is host memory or a drive): the completion
  // worker finishes them. Writes to the source are ordered after the copy reading it.
  if (ticket->event != nullptr && from != TierKind::kNvme) {
    add_busy(t, from, ticket->stream, ticket->event);
  }
  guard.issued();
  auto m = std::make_shared<InFlight>(std::move(guard), *std::move(ticket));
  m->index = t.index;
  m->from = from;
  m->to = to;
  m->issue_ns = ns_since(start);
  m->issued_at = start;
  m->trace_id = trace_id;
  m->issue_end = issue_end;
  if (trace_id != 0) m->issuer = Timeline::thread_track();
  in_flight.push_back(m);
  completion_work.Signal();
  return m;
}

absl::Status Impl::wait_for(InFlight& m) {
  if (!m.done) {
    absl::Status status;
    {
      MutexUnlock unlock(&mu);
      status = m.ticket.wait(device);
    }
    if (!m.done) {  // the completion worker has not finished it meanwhile: finish it here
      std::erase_if(in_flight, [&](const std::shared_ptr<InFlight>& p) { return p.get() == &m; });
      complete(m, status);
    }
  }
  return absl::Status(m.status.code(), m.status.message());
}

void Impl::wait_while_moving(Tensor& t, TierKind tier, std::string_view what) {
  const Copy& c = t.copies[tier_index(tier)];
  const absl::Time start = absl::Now();
  const uint64_t ref = c.move_id;
  std::shared_ptr<InFlight> move;
  for (const std::shared_ptr<InFlight>& m : in_flight) {
    if (m->index == t.index && m->to == tier && !m->done) move = m;
  }
  if (move != nullptr) {
    // Its error, if any, is the mover's (the destination is dropped): the caller's loop decides
    // again from what is left.
    (void)wait_for(*move);
  } else {
    wait(&changed, &mu);  // being issued still, or a stream-ordered move being bracketed
  }
  trace_wait(what, t, ref, start);
}

void Impl::complete(InFlight& m, const absl::Status& status) {
  Tensor& t = *tensors[m.index];  // alive: the guard holds an operation on it
  // A stream-ordered arrival (NVMe -> GPU: its reads are done, its last copies may still run):
  // readers wait on its event, and the memory is reused only after it, valid or not.
  if (status.ok() && m.ticket.stream_ordered && m.ticket.event != nullptr) {
    add_busy(t, m.to, m.ticket.stream, m.ticket.event);
  }
  m.guard.finish(status.ok());
  if (m.early) early_writeback_done(t, m, status.ok());
  if (m.from == TierKind::kNvme) --counters.fetches_in_flight;
  if (m.trace_id != 0) {
    trace_move(t, m.from, m.to, m.trace_id, m.issued_at, m.issue_end,
               m.ticket.host != nullptr ? m.ticket.host->done_at() : absl::InfinitePast(), m.issuer,
               status.ok());
  }
  if (status.ok()) {
    // A read from NVMe counts until its bytes are in (its latency, as a waiting host sees it);
    // other moves the host time spent issuing them.
    count_move(counters, m.from, m.to, t.bytes,
               m.from == TierKind::kNvme ? ns_since(m.issued_at) : m.issue_ns);
    m.status = absl::OkStatus();
  } else {
    ++counters.errors;
    m.status = in_context(t, m.from, m.to, status);
    // Rule 3: the source stays; a half-filled destination that is not the home copy goes.
    if (m.to != t.home) drop_copy(t, m.to);
    STRATA_LOG(kDebug, "%s", m.status.message());
  }
  Copy& src = t.copies[tier_index(m.from)];
  if (t.live && src.evicting()) {
    if (status.ok()) {
      schedule_drop(t, m.from);
    } else {
      cancel_eviction(t, m.from);  // its bytes are still the only newest
    }
  }
  m.done = true;
  changed.SignalAll();
}

// ---- the completion worker ------------------------------------------------------------------

void Impl::start_completion_worker() {
  completion_thread = std::thread([this] { run_completion_worker(); });
}

void Impl::stop_completion_worker() {
  {
    MutexLock lock(&mu);
    completion_stopping = true;
    completion_work.SignalAll();
  }
  if (completion_thread.joinable()) completion_thread.join();
}

void Impl::run_completion_worker() {
  Timeline::set_thread_track("completion worker");
  MutexLock lock(&mu);
  for (;;) {
    while (in_flight.empty() && dropping.empty() && !completion_stopping) {
      wait(&completion_work, &mu);
    }
    if (in_flight.empty() && dropping.empty()) return;  // stopping, and nothing left
    // What to watch, taken under the lock; watched with it released.
    std::vector<std::shared_ptr<InFlight>> moves(in_flight.begin(), in_flight.end());
    std::vector<std::shared_ptr<Event>> drop_events;
    for (uint64_t k : dropping) {
      for (const Busy& b : tensors[k >> 2]->copies[k & 3].busy) drop_events.push_back(b.event);
    }
    std::vector<std::optional<absl::Status>> results(moves.size());
    {
      MutexUnlock unlock(&mu);
      bool progress = false;
      for (size_t i = 0; i < moves.size(); ++i) {
        absl::StatusOr<bool> ready = moves[i]->ticket.ready(device);
        if (!ready.ok()) {
          results[i] = ready.status();
        } else if (*ready) {
          results[i] = absl::OkStatus();
        }
        progress = progress || results[i].has_value();
      }
      for (const auto& e : drop_events) {
        auto done = device.query(*e);
        progress = progress || !done.ok() || *done;
      }
      if (!progress) {
        // Nothing has ended yet: block on the oldest move, else on an evicted copy's work.
        if (!moves.empty()) {
          results[0] = moves[0]->ticket.wait(device);
        } else if (!drop_events.empty()) {
          (void)device.synchronize(*drop_events.front());
        }
      }
    }
    for (size_t i = 0; i < moves.size(); ++i) {
      // A move a waiter finished itself while the lock was released is done already.
      if (!results[i].has_value() || moves[i]->done) continue;
      std::erase(in_flight, moves[i]);
      complete(*moves[i], *results[i]);
    }
    const std::vector<uint64_t> keys(dropping.begin(), dropping.end());
    bool dropped = false;
    for (uint64_t k : keys) {
      Tensor& t = *tensors[k >> 2];
      if (!t.live || try_drop(t, static_cast<TierKind>(k & 3))) {
        dropping.erase(k);
        dropped = true;
      }
    }
    // Copies held only by moves issued on other threads: wait until one of those ends.
    if (moves.empty() && drop_events.empty() && !dropped && !dropping.empty()) {
      wait(&changed, &mu);
    }
  }
}

}  // namespace strata
