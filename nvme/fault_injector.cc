#include "strata/testing/fault_injector.h"

#include <algorithm>

#include "strata/base/mutex.h"

namespace strata {

void FaultInjector::add(FaultRule rule) {
  MutexLock lock(&mu_);
  rules_.push_back(Armed{.rule = std::move(rule)});
}

void FaultInjector::clear() {
  MutexLock lock(&mu_);
  rules_.clear();
  registrations_left_.reset();
  registrations_held_ = false;
  released_.SignalAll();
}

uint64_t FaultInjector::fired() const {
  MutexLock lock(&mu_);
  return fired_;
}

// Every rule that matches the attempt counts it (so "skip 2 writes" means the first two writes,
// whatever other rules did with them); the first rule past its skip with uses left decides.
FaultInjector::Decision FaultInjector::apply(IoOp op, uint32_t file, int64_t result) {
  MutexLock lock(&mu_);
  const Armed* chosen = nullptr;
  for (Armed& armed : rules_) {
    const FaultRule& rule = armed.rule;
    if ((rule.op && *rule.op != op) || (rule.file && *rule.file != file)) continue;
    const uint64_t position = armed.seen++;
    if (chosen != nullptr || position < rule.skip || armed.applied >= rule.times) continue;
    ++armed.applied;
    chosen = &armed;
  }
  if (chosen == nullptr) return Decision{.result = result};
  ++fired_;
  const FaultRule& rule = chosen->rule;
  switch (rule.action) {
    case FaultRule::Action::kError:
      return Decision{.result = -int64_t{rule.error_number}};
    case FaultRule::Action::kShortTransfer:
      // Only a successful transfer can come back short; errors pass through unchanged.
      return Decision{
          .result = result < 0 ? result : std::min(result, static_cast<int64_t>(rule.short_bytes))};
    case FaultRule::Action::kDelay:
      return Decision{.result = result, .delay = rule.delay};
  }
  return Decision{.result = result};
}

void FaultInjector::fail_registrations(uint64_t skip, int error_number) {
  MutexLock lock(&mu_);
  registrations_left_ = skip;
  registration_error_ = error_number;
}

void FaultInjector::hold_registrations() {
  MutexLock lock(&mu_);
  registrations_held_ = true;
}

void FaultInjector::release_registrations() {
  MutexLock lock(&mu_);
  registrations_held_ = false;
  released_.SignalAll();
}

int FaultInjector::apply_registration() {
  MutexLock lock(&mu_);
  while (registrations_held_) wait(&released_, &mu_);
  if (!registrations_left_) return 0;
  if (*registrations_left_ > 0) {
    --*registrations_left_;
    return 0;
  }
  ++fired_;
  return -registration_error_;
}

}  // namespace strata
