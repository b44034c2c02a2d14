#include "job_monitor.h"

#include <absl/strings/numbers.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "strata/base/log.h"
#include "strata/base/text.h"

namespace strata::comm_internal {
namespace {

using namespace text;  // NOLINT(build/namespaces): string_view helpers
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kAbortKey = "strata/abort";
constexpr std::string_view kLeftKey = "strata/left";
std::string state_key(int rank) { return cat("strata/state/", rank); }
std::string host_key(int rank) { return cat("strata/host/", rank); }

// How long a failing rank waits for the others to say what they had issued: long enough for a
// watcher's next poll, short against any timeout.
constexpr milliseconds kPostMortemWait{1500};
constexpr milliseconds kWatchPoll{200};

}  // namespace

JobMonitor::JobMonitor(LaunchInfo launch, CommSettings settings)
    : launch_(std::move(launch)), settings_(settings) {}

absl::StatusOr<std::unique_ptr<JobMonitor>> JobMonitor::join(const LaunchInfo& launch,
                                                             const CommSettings& settings) {
  std::unique_ptr<JobMonitor> monitor(new JobMonitor(launch, settings));
  if (launch.rank == 0) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::start(launch.master_addr, launch.master_port, launch.world_size);
    if (!server.ok()) return server.status();
    monitor->server_ = *std::move(server);
    monitor->launch_.master_port =
        monitor->server_->port();  // a lone rank's port 0: the one chosen
  }
  TcpStore::Options options;
  options.host = launch.master_addr;
  options.port = monitor->server_ ? monitor->server_->port() : launch.master_port;
  options.rank = launch.rank;
  options.world_size = launch.world_size;
  options.timeout = settings.timeout;
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect(options);
  if (!store.ok()) return store.status();
  monitor->store_ = *std::move(store);
  // Where this rank runs, for the post-mortem: across machines a silent rank is named with its
  // host, which tells a user which machine or link to look at.
  if (launch.world_size > 1) {
    if (absl::Status st =
            monitor->store_->set(host_key(launch.rank), monitor->store_->local_address());
        !st.ok()) {
      return st;
    }
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> watcher_store = TcpStore::connect(options);
  if (!watcher_store.ok()) return watcher_store.status();
  monitor->watcher_store_ = *std::move(watcher_store);
  monitor->watcher_ = std::thread([m = monitor.get()] { m->watch(); });
  return monitor;
}

JobMonitor::~JobMonitor() {
  stopping_ = true;
  if (watcher_.joinable()) watcher_.join();
  watcher_store_.reset();
  if (store_ != nullptr && launch_.world_size > 1) {
    const absl::StatusOr<int64_t> left = store_->add(kLeftKey, 1);
    if (left.ok() && launch_.rank == 0) {
      // Serve until every other rank has left or is lost. After a failure the survivors are
      // still in their post-mortems, reading the store to learn who died: if rank 0 stopped
      // serving at the first lost rank, a slower survivor would find the server gone and blame
      // rank 0 instead of the rank that died.
      const auto deadline = Clock::now() + settings_.timeout;
      while (Clock::now() < deadline) {
        absl::StatusOr<int64_t> count = store_->add(kLeftKey, 0);
        absl::StatusOr<std::vector<int>> lost = store_->lost_ranks();
        if (!count.ok() || !lost.ok()) break;
        if (*count + static_cast<int64_t>(lost->size()) >= launch_.world_size) break;
        std::this_thread::sleep_for(milliseconds(5));
      }
    }
  }
  store_.reset();
  server_.reset();
}

void JobMonitor::issued(const CollectiveCall& call) {
  std::string text = cat(call.sequence, "\t", call.describe());
  MutexLock lock(&mutex_);
  last_issued_ = std::move(text);
}

void JobMonitor::post_state() {
  std::string state;
  {
    MutexLock lock(&mutex_);
    if (state_posted_) return;
    state_posted_ = true;
    state = last_issued_.empty() ? std::string("0\t(no collective yet)") : last_issued_;
  }
  (void)watcher_store_->set(state_key(launch_.rank), state);
}

// Polls for another rank's failure (the abort key or a lost rank) and then says what this rank
// had issued, so the failing rank can name the ranks at fault.
void JobMonitor::watch() {
  while (!stopping_) {
    absl::StatusOr<std::string> abort = watcher_store_->get(kAbortKey, kWatchPoll);
    if (abort.ok()) {
      post_state();
      return;
    }
    if (abort.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
    // A lost rank (or the server gone): say what this rank had issued, if the store still works.
    if (!stopping_) post_state();
    return;
  }
}

absl::Status JobMonitor::post_mortem(const CollectiveCall& call, std::string_view local) {
  const int world = launch_.world_size;
  std::string message =
      cat(call.describe(), " failed on rank ", launch_.rank, " of ", world, ": ", local);
  if (world == 1) return absl::InternalError(to_absl(message));
  // The post-mortem has its own connection use: the watcher may be in a get on the other one.
  {
    MutexLock lock(&mutex_);
    state_posted_ = true;  // this rank's state is the failing call
  }
  TcpStore& store = *store_;
  (void)store.set(state_key(launch_.rank), cat(call.sequence, "\t", call.describe()));
  (void)store.set(kAbortKey, cat(launch_.rank));

  std::map<int, std::string> states;  // rank → "<sequence>\t<describe>"
  std::vector<int> lost;
  bool server_gone = false;
  const auto deadline = Clock::now() + kPostMortemWait;
  while (true) {
    absl::StatusOr<std::vector<int>> now_lost = store.lost_ranks();
    if (!now_lost.ok()) {  // the server itself is gone: rank 0 died
      server_gone = true;
      lost = {0};
      break;
    }
    lost = *now_lost;
    for (int r = 0; r < world; ++r) {
      if (r == launch_.rank || states.count(r) != 0) continue;
      if (std::find(lost.begin(), lost.end(), r) != lost.end()) continue;
      absl::StatusOr<bool> present = store.check({state_key(r)});
      if (present.ok() && *present) {
        absl::StatusOr<std::string> value = store.get(state_key(r), milliseconds(100));
        if (value.ok()) states[r] = *value;
      }
    }
    if (static_cast<int>(states.size() + lost.size()) >= world - 1) break;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(milliseconds(20));
  }

  std::vector<int> at_fault = lost;
  std::string findings;
  // " (on 10.77.0.2)" for ranks that ran on other hosts than this rank (server_gone: unknown).
  const auto hosts_note = [&](const std::vector<int>& ranks) -> std::string {
    if (server_gone) return "";
    std::vector<std::string> hosts;
    for (int r : ranks) {
      absl::StatusOr<std::string> host = store.get(host_key(r), milliseconds(100));
      if (!host.ok()) return "";
      if (std::find(hosts.begin(), hosts.end(), *host) == hosts.end()) hosts.push_back(*host);
    }
    if (hosts.size() == 1 && hosts[0] == store.local_address()) return "";
    return cat(" (on ", text::join(hosts, ", "), ")");
  };
  for (int r : lost) {
    findings += cat(" Rank ", r, hosts_note({r}),
                    server_gone ? " (which serves the rendezvous) exited or was killed."
                                : " exited or was killed (its connection closed).");
  }
  // What most ranks had issued is taken as the job's step; a rank that differs from it is at
  // fault (on a tie every differing rank is named, this one included). When a rank died, it is
  // the cause: the others may just have been at different points of asynchronous collectives
  // in flight (ZeRO's reduce-scatters overlapping backward), which is still worth reporting.
  states[launch_.rank] = cat(call.sequence, "\t", call.describe());
  std::map<std::string, int> votes;
  for (const auto& [r, state] : states) ++votes[state];
  auto majority = votes.begin();
  bool tie = false;
  for (auto it = votes.begin(); it != votes.end(); ++it) {
    if (it->second > majority->second) {
      majority = it;
      tie = false;
    } else if (it != majority && it->second == majority->second) {
      tie = true;
    }
  }
  const auto sequence_of = [](const std::string& state) {
    uint64_t sequence = 0;
    (void)absl::SimpleAtoi(to_absl(std::string_view(state).substr(0, state.find('\t'))), &sequence);
    return sequence;
  };
  const std::string& agreed = majority->first;
  const uint64_t agreed_sequence = sequence_of(agreed);
  if (votes.size() > 1) {
    findings += cat(" ", majority->second, " of ", world, " ranks were at ",
                    agreed.substr(agreed.find('\t') + 1), ".");
  }
  std::vector<int> silent;
  for (int r = 0; r < world; ++r) {
    if (states.count(r) == 0 && std::find(lost.begin(), lost.end(), r) == lost.end()) {
      silent.push_back(r);
    }
  }
  for (const auto& [r, state] : states) {
    if (votes.size() == 1 || (!tie && state == agreed)) continue;
    const std::string theirs = state.substr(state.find('\t') + 1);
    const uint64_t their_sequence = sequence_of(state);
    const std::string who = cat(" Rank ", r, r == launch_.rank ? " (this rank)" : "");
    // A rank that answered is at fault for being elsewhere only when no rank died and every
    // rank answered: a silent rank (a machine or link gone, a process stuck) is the cause, and
    // the others may just have been at different points of asynchronous collectives.
    if (lost.empty() && silent.empty()) at_fault.push_back(r);
    if (their_sequence == agreed_sequence) {
      findings += cat(who, " issued ", theirs, ".");
    } else if (their_sequence < agreed_sequence) {
      findings +=
          cat(who, " had issued only up to ", theirs, " (it never issued #", agreed_sequence, ").");
    } else {
      findings += cat(who, " had gone on to ", theirs, ".");
    }
  }
  if (!silent.empty()) {
    findings += cat(" Rank(s) ", text::join(silent, ", "), hosts_note(silent),
                    " did not answer (stuck outside strata, or their rendezvous connection "
                    "is down: a machine or the link to it may be gone).");
    if (lost.empty()) at_fault.insert(at_fault.end(), silent.begin(), silent.end());
  }
  std::sort(at_fault.begin(), at_fault.end());
  if (!at_fault.empty()) {
    findings += cat(" Rank(s) at fault: ", text::join(at_fault, ", "), ".");
  } else if (silent.empty()) {
    findings += " Every rank had issued the same collective: see the other ranks' output.";
  }
  return absl::UnavailableError(to_absl(cat(message, ".", findings)));
}

}  // namespace strata::comm_internal
