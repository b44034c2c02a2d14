#include "job_monitor.h"

#include <absl/strings/numbers.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "gloo_peers.h"
#include "rendezvous_address.h"
#include "strata/base/log.h"
#include "strata/base/text.h"
#include "tcp_store_protocol.h"

namespace strata::comm_internal {
namespace {

using namespace text;  // NOLINT(build/namespaces): string_view helpers
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kAbortKey = "strata/abort";
constexpr std::string_view kLeftKey = "strata/left";
std::string state_key(int rank) { return cat("strata/state/", rank); }
std::string host_key(int rank) { return cat("strata/host/", rank); }
// The peers a failing rank's timed-out transport operation waited on ("2,3"), for the chains.
std::string waiting_key(int rank) { return cat("strata/waiting/", rank); }

std::vector<int> parse_ranks(std::string_view text) {
  std::vector<int> ranks;
  while (!text.empty()) {
    const auto comma = text.find(',');
    int r = 0;
    if (absl::SimpleAtoi(to_absl(text.substr(0, comma)), &r)) ranks.push_back(r);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return ranks;
}

bool contains(const std::vector<int>& ranks, int r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}

// How long a failing rank waits for the others to say what they had issued: long enough for a
// watcher's next poll, short against any timeout.
constexpr milliseconds kPostMortemWait{1500};
constexpr milliseconds kWatchPoll{200};

}  // namespace

JobMonitor::JobMonitor(LaunchInfo launch, CommSettings settings)
    : launch_(std::move(launch)), settings_(settings) {}

absl::StatusOr<std::unique_ptr<JobMonitor>> JobMonitor::join(const LaunchInfo& launch,
                                                             const CommSettings& settings,
                                                             LauncherStore* launcher) {
  std::unique_ptr<JobMonitor> monitor(new JobMonitor(launch, settings));
  // A job of one rank has nobody to meet and takes no announcement (the other ranks' counts
  // stay in step). Where MASTER_PORT is someone else's (torchrun's agent, torch.distributed),
  // it serves on a free port instead.
  const bool port_taken = launcher != nullptr || launch.agent_store;
  if (launcher != nullptr && launch.world_size > 1) {
    if (absl::Status s = monitor->meet_through(*launcher); !s.ok()) return s;
  } else if (launch.rank == 0) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::start(
        launch.master_addr, port_taken ? uint16_t{0} : launch.master_port, launch.world_size);
    if (!server.ok()) return server.status();
    monitor->server_ = *std::move(server);
    monitor->launch_.master_port =
        monitor->server_->port();  // a lone rank's port 0: the one chosen
  }
  const LaunchInfo& where = monitor->launch_;
  TcpStore::Options options;
  options.host = where.master_addr;
  options.port = where.master_port;
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

absl::Status JobMonitor::meet_through(LauncherStore& launcher) {
  const std::string key = next_announcement_key(launch_);
  const std::string me = cat("rank ", launch_.rank, " of ", launch_.world_size);
  if (launch_.rank == 0) {
    absl::StatusOr<std::string> host = local_address_towards(launch_.master_addr);
    if (!host.ok()) return host.status();
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::start(*host, 0, launch_.world_size);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    launch_.master_addr = *host;
    launch_.master_port = server_->port();
    const std::string point = encode(RendezvousPoint{*host, launch_.master_port});
    if (absl::Status s = launcher.set(key, point); !s.ok()) {
      return absl::Status(
          s.code(), to_absl(cat(me, ": announcing strata's rendezvous (", point, ") in ",
                                launcher.description(), " under '", key, "': ", s.message())));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> value = launcher.get(key, settings_.timeout);
  if (!value.ok()) {
    const bool late = value.status().code() == absl::StatusCode::kDeadlineExceeded;
    return absl::Status(
        value.status().code(),
        to_absl(cat(
            me, ": ",
            late ? cat("rank 0 did not announce strata's rendezvous in ", launcher.description(),
                       " under '", key, "' within STRATA_COMM_TIMEOUT (",
                       tcp_store::format_duration(settings_.timeout),
                       "): rank 0 announces it when it creates its Communicator; is it "
                       "running, and does every rank create the same communicators in "
                       "the same order?")
                 : cat("reading strata's rendezvous address from ", launcher.description(),
                       " under '", key, "': ", value.status().message()))));
  }
  absl::StatusOr<RendezvousPoint> point = decode_rendezvous_point(*value);
  if (!point.ok()) {
    return absl::InvalidArgumentError(to_absl(cat(
        me, ": ", launcher.description(), " holds under '", key, "' ", point.status().message())));
  }
  launch_.master_addr = point->host;
  launch_.master_port = point->port;
  return absl::OkStatus();
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
  const int me = launch_.rank;
  std::string message = cat(call.describe(), " failed on rank ", me, " of ", world, ": ", local);
  if (world == 1) return absl::InternalError(to_absl(message));
  // The post-mortem has its own connection use: the watcher may be in a get on the other one.
  {
    MutexLock lock(&mutex_);
    state_posted_ = true;  // this rank's state is the failing call
  }
  TcpStore& store = *store_;
  const std::string mine = cat(call.sequence, "\t", call.describe());
  // Each rank's host, read once; after a failed read none is tried again (the store may be out
  // of reach, and each read waits).
  std::map<int, std::string> host_cache;
  bool hosts_unreadable = false;
  const auto host_of = [&](int r) -> std::optional<std::string> {
    if (const auto it = host_cache.find(r); it != host_cache.end()) return it->second;
    if (hosts_unreadable) return std::nullopt;
    absl::StatusOr<std::string> host = store.get(host_key(r), milliseconds(100));
    if (!host.ok()) {
      hosts_unreadable = true;
      return std::nullopt;
    }
    return host_cache[r] = *host;
  };
  // A timed-out send or receive names the peers it waited on (narrowed to the host Gloo's words
  // name), posted before the abort so that the other ranks can follow a chain through this one.
  std::vector<int> suspects;
  const std::optional<TransportWait> wait = gloo_transport_wait(call, world, me, local);
  if (wait) {
    suspects = wait->peers;
    if (!wait->address.empty()) {
      std::vector<int> there;
      for (int r : suspects) {
        if (host_of(r) == wait->address) there.push_back(r);
      }
      if (!there.empty()) suspects = std::move(there);
    }
    (void)store.set(waiting_key(me), text::join(suspects, ","));
  }
  // A rank whose own send or receive timed out closes all its pairs, and its peers see their
  // connections closed: the ranks on the host Gloo's words name that say they timed out (their
  // waiting keys) start the chain instead.
  std::vector<int> closers;
  const std::optional<std::string> closed_by = wait ? std::nullopt : gloo_closed_by(local);
  if (closed_by) {
    for (int r = 0; r < world; ++r) {
      if (r != me && (closed_by->empty() || host_of(r) == *closed_by)) closers.push_back(r);
    }
  }
  const bool transport = wait.has_value() || !closers.empty();
  (void)store.set(state_key(me), mine);
  (void)store.set(kAbortKey, cat(me));

  const auto sequence_of = [](const std::string& state) {
    uint64_t sequence = 0;
    (void)absl::SimpleAtoi(to_absl(std::string_view(state).substr(0, state.find('\t'))), &sequence);
    return sequence;
  };
  std::map<int, std::string> states;      // rank → "<sequence>\t<describe>"
  std::map<int, std::vector<int>> waits;  // rank → the peers its own timed-out operation waited on
  // Where the chain starts: this rank's suspects, or the closers that timed out.
  const auto start = [&] {
    if (wait) return suspects;
    std::vector<int> timed_out;
    for (int r : closers) {
      if (waits.count(r) != 0) timed_out.push_back(r);
    }
    return timed_out;
  };
  // The ranks the waits lead to from this rank's suspects (and from `extra`), and the chain's
  // ends: ranks that wait on nobody, and ranks on another host that wait on this one (among
  // others: a named host's ranks are all candidates): the two ends of a link wait on each other,
  // and that rank's other candidates are only possible. Within this host such a loop says
  // nothing (a chain that closes on itself has no ends).
  const auto follow = [&](const std::vector<int>& extra, std::vector<int>* ends) {
    std::vector<int> queue = start();
    queue.insert(queue.end(), extra.begin(), extra.end());
    std::vector<int> reached{me};
    for (size_t i = 0; i < queue.size(); ++i) {
      const int r = queue[i];
      if (contains(reached, r)) continue;
      reached.push_back(r);
      const auto it = waits.find(r);
      if (it == waits.end() || it->second.empty()) {
        if (ends != nullptr) ends->push_back(r);
        continue;
      }
      if (contains(it->second, me)) {
        const std::optional<std::string> there = host_of(r);
        if (ends != nullptr && there && *there != host_of(me).value_or(store.local_address())) {
          ends->push_back(r);
        }
        continue;
      }
      queue.insert(queue.end(), it->second.begin(), it->second.end());
    }
    reached.erase(reached.begin());
    return reached;
  };
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
      if (r == me || contains(lost, r)) continue;
      if (states.count(r) == 0) {
        absl::StatusOr<bool> present = store.check({state_key(r)});
        if (present.ok() && *present) {
          absl::StatusOr<std::string> value = store.get(state_key(r), milliseconds(100));
          if (value.ok()) states[r] = *value;
        }
      }
      if (transport && waits.count(r) == 0) {
        absl::StatusOr<bool> present = store.check({waiting_key(r)});
        if (present.ok() && *present) {
          absl::StatusOr<std::string> value = store.get(waiting_key(r), milliseconds(100));
          if (value.ok()) waits[r] = parse_ranks(*value);
        }
      }
    }
    bool complete = static_cast<int>(states.size() + lost.size()) >= world - 1;
    // A rank the waits lead to that is in this collective too may time out in turn and say on
    // whom it waits: its answer moves the blame along the chain (bounded by the same wait).
    // Not needed when a rank died or issued another collective as this one's number (below).
    const bool other_call = std::any_of(states.begin(), states.end(), [&](const auto& entry) {
      return sequence_of(entry.second) == call.sequence && entry.second != mine;
    });
    if (complete && transport && lost.empty() && !other_call) {
      if (start().empty()) complete = false;  // no closer has said yet that it timed out
      for (int r : follow({}, nullptr)) {
        const auto state = states.find(r);
        if (waits.count(r) == 0 && state != states.end() &&
            sequence_of(state->second) >= call.sequence) {
          complete = false;
        }
      }
    }
    if (complete) break;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(milliseconds(20));
  }

  std::vector<int> at_fault = lost;
  std::string findings;
  // " (on 10.77.0.2)" for ranks that ran on other hosts than this rank (server_gone: unknown).
  const std::string here = server_gone ? "" : host_of(me).value_or(store.local_address());
  const auto hosts_note = [&](const std::vector<int>& ranks) -> std::string {
    if (server_gone) return "";
    std::vector<std::string> hosts;
    for (int r : ranks) {
      const std::optional<std::string> host = host_of(r);
      if (!host) return "";
      if (std::find(hosts.begin(), hosts.end(), *host) == hosts.end()) hosts.push_back(*host);
    }
    if (hosts.size() == 1 && hosts[0] == here) return "";
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
  states[me] = mine;
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
  const std::string& agreed = majority->first;
  const uint64_t agreed_sequence = sequence_of(agreed);
  if (votes.size() > 1) {
    findings += cat(" ", majority->second, " of ", world, " ranks were at ",
                    agreed.substr(agreed.find('\t') + 1), ".");
  }
  std::vector<int> silent;
  for (int r = 0; r < world; ++r) {
    if (states.count(r) == 0 && !contains(lost, r)) silent.push_back(r);
  }
  std::vector<int> out_of_step;  // ranks whose state differs from the majority's
  for (const auto& [r, state] : states) {
    if (votes.size() == 1 || (!tie && state == agreed)) continue;
    const std::string theirs = state.substr(state.find('\t') + 1);
    const uint64_t their_sequence = sequence_of(state);
    const std::string who = cat(" Rank ", r, r == me ? " (this rank)" : "");
    out_of_step.push_back(r);
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
  // Against this rank's own call: a rank that issued another collective as its number is a
  // program error (the majority above names it); one that never issued it holds it up.
  bool other_call = false;
  std::vector<int> behind;
  for (const auto& [r, state] : states) {
    if (sequence_of(state) < call.sequence) behind.push_back(r);
    if (sequence_of(state) == call.sequence && state != mine) other_call = true;
  }
  const std::vector<int> first = start();
  if (!first.empty() && lost.empty() && silent.empty() && !other_call) {
    // Every rank answered and none issued another collective: the transport is the evidence.
    // Ranks that had gone on are not at fault (collectives run asynchronously); the blame
    // follows the waits to their ends: a rank that never issued this call, else a rank waited
    // on that waits on nobody (or, on another host, on this rank); when the waits close on
    // themselves, the ranks they reach on other hosts than this one.
    if (wait) {
      const bool send = wait->direction == TransportDirection::kSend;
      findings +=
          cat(" Rank ", me, " (this rank) timed out ", send ? "sending to" : "receiving from",
              " rank(s) ", text::join(suspects, ", "), hosts_note(suspects),
              send ? ": they, or the link to them, did not take the data."
                   : ": nothing came from them, or over the link from them.");
    } else {
      findings += cat(" Rank(s) ", text::join(first, ", "), hosts_note(first),
                      " closed their connections to this rank after timing out themselves.");
    }
    std::vector<int> ends;
    const std::vector<int> reached = follow(behind, &ends);
    for (int r : reached) {
      const auto it = waits.find(r);
      if (it != waits.end() && !it->second.empty()) {
        findings += cat(" Rank ", r, " had timed out itself, waiting on rank(s) ",
                        text::join(it->second, ", "), ".");
      }
    }
    // Only ranks on other hosts are blamed on the transport's word (a machine or the link to
    // it); within this host the ranks' states decide, as without it.
    const auto remote = [&](const std::vector<int>& ranks) {
      std::vector<int> there;
      for (int r : ranks) {
        const std::optional<std::string> host = host_of(r);
        if (host && *host != here) there.push_back(r);
      }
      return there;
    };
    std::vector<int> behind_ends;
    for (int r : ends) {
      if (contains(behind, r)) behind_ends.push_back(r);
    }
    std::vector<int> blamed = remote(behind_ends);
    if (blamed.empty()) blamed = remote(ends);
    if (blamed.empty()) blamed = remote(reached);
    std::sort(blamed.begin(), blamed.end());
    if (!blamed.empty()) {
      if (blamed != first) {
        findings +=
            cat(" The waits lead to rank(s) ", text::join(blamed, ", "), hosts_note(blamed), ".");
      }
      at_fault = blamed;
    } else {
      at_fault = out_of_step;
    }
  } else if (lost.empty() && silent.empty()) {
    // A rank that answered is at fault for being elsewhere only when no rank died and every
    // rank answered: a silent rank (a machine or link gone, a process stuck) is the cause, and
    // the others may just have been at different points of asynchronous collectives.
    at_fault.insert(at_fault.end(), out_of_step.begin(), out_of_step.end());
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
