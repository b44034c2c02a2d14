// The overlapped-step report: the text table and the "overlap_step" JSON object
// (bench/train_step/overlap_step.h).
#include <absl/strings/str_format.h>

#include "bench/common.h"
#include "bench/train_step/overlap_step.h"
#include "json.h"

namespace strata::bench {
namespace {

double ms(double seconds) { return seconds * 1e3; }
double ms_ns(uint64_t ns) { return static_cast<double>(ns) * 1e-6; }

// "-" where a ratio has no basis in this run.
std::string ratio_text(double value) {
  return value > 0 ? absl::StrFormat("%.3f", value) : std::string("-");
}

Json stats_json(const OffloadOptimizerStats& s) {
  return Json{{"last_step_ns", s.last_step_ns},
              {"last_step_wait_ns", s.last_step_wait_ns},
              {"last_adam_ns", s.last_adam_ns},
              {"last_nvme_wait_ns", s.last_nvme_wait_ns},
              {"last_early_elements", s.last_early_elements},
              {"last_redone_elements", s.last_redone_elements},
              {"last_early_adam_ns", s.last_early_adam_ns},
              {"last_rollback_ns", s.last_rollback_ns},
              {"last_early_wait_ns", s.last_early_wait_ns},
              {"overlap_early_steps", s.overlap_early_steps},
              {"overlap_rollbacks", s.overlap_rollbacks},
              {"overlap_host_bytes", s.overlap_host_bytes},
              {"overlap_budget_misses", s.overlap_budget_misses}};
}

Json run_json(const OverlapStepReport& report, const OverlapStepRun& run) {
  std::vector<double> exposed, steps, forwards, backwards;
  Json rolled = Json::array(), skipped = Json::array(), early = Json::array(),
       redone = Json::array();
  for (const OverlapStepSample& s : run.samples) {
    exposed.push_back(s.exposed_seconds);
    steps.push_back(s.step_seconds);
    forwards.push_back(s.forward_seconds);
    backwards.push_back(s.backward_seconds);
    rolled.push_back(s.rolled_back);
    skipped.push_back(s.skipped);
    early.push_back(s.early_elements);
    redone.push_back(s.redone_elements);
  }
  const OverlapStepSample& m = run.median;
  return Json{{"name", run.name},
              {"overlap", run.overlap},
              {"max_grad_norm", json_general(run.max_grad_norm)},
              {"inf_every", run.inf_every},
              {"steps", run.samples.size()},
              {"rollbacks", run.rollbacks},
              {"rollback_rate", ratio_json(run.rollback_rate())},
              {"exposed_seconds", seconds_json(m.exposed_seconds)},
              {"exposed_ratio", ratio_json(report.exposed_ratio(run))},
              {"exposed_after_landing_seconds", seconds_json(m.exposed_after_landing_seconds())},
              {"exposed_after_landing_ratio", ratio_json(report.exposed_after_landing_ratio(run))},
              {"forward_seconds", seconds_json(run.forward_seconds)},
              {"forward_wait_seconds", seconds_json(run.forward_wait_seconds)},
              {"first_layer_wait_seconds", seconds_json(run.first_layer_wait_seconds)},
              {"backward_seconds", seconds_json(m.backward_seconds)},
              {"step_seconds", seconds_json(run.step_seconds)},
              {"ratio_to_bound", ratio_json(report.ratio_to_bound(run))},
              {"kept_exposed_seconds", seconds_json(run.kept_exposed_seconds)},
              {"rolled_back_exposed_seconds", seconds_json(run.rolled_back_exposed_seconds)},
              {"rollback_cost", ratio_json(report.rollback_cost(run))},
              {"early_elements", m.early_elements},
              {"overlap_host_bytes", m.stats.overlap_host_bytes},
              {"stats", stats_json(m.stats)},
              {"all_exposed_seconds", seconds_list_json(exposed)},
              {"all_step_seconds", seconds_list_json(steps)},
              {"all_forward_seconds", seconds_list_json(forwards)},
              {"all_backward_seconds", seconds_list_json(backwards)},
              {"all_rolled_back", std::move(rolled)},
              {"all_skipped", std::move(skipped)},
              {"all_early_elements", std::move(early)},
              {"all_redone_elements", std::move(redone)},
              {"warmup_early_elements", run.warmup_early_elements},
              {"warmup_redone_elements", run.warmup_redone_elements},
              {"warmup_rolled_back", run.warmup_rolled_back}};
}

}  // namespace

void print_overlap_step(const OverlapStepReport& report, std::ostream& out) {
  out << absl::StrFormat(
      "\noverlapped optimizer step: %d layers x %s fp16 (%d params), states on %s, %.3g ms "
      "compute per layer, %d measured step(s) per configuration\n",
      report.train.layers, format_bytes(report.train.layer_bytes), report.params, report.state_home,
      report.train.compute_ms, report.train.steps);
  out << absl::StrFormat(
      "bound %.1f ms = max(compute (forward + backward) %.1f, transfer %.1f, optimizer %.1f) ms\n",
      ms(report.bound_seconds()), ms(report.compute_seconds), ms(report.transfer_seconds),
      ms(report.optimizer_seconds));
  out << absl::StrFormat("%-8s %10s %7s %10s %7s %10s %10s %10s %10s %10s %7s %8s %7s %10s %9s\n",
                         "config", "exposed", "vs off", "landed", "vs off", "forward", "fwd wait",
                         "1st wait", "backward", "step", "/bound", "rollback", "rb cost",
                         "early elem", "host MiB");
  for (const OverlapStepRun& run : report.runs) {
    out << absl::StrFormat(
        "%-8s %8.2fms %7s %8.2fms %7s %8.2fms %8.2fms %8.2fms %8.2fms %8.2fms %7.3f %8.2f %7s %10d "
        "%9.1f\n",
        run.name, ms(run.median.exposed_seconds), ratio_text(report.exposed_ratio(run)),
        ms(run.median.exposed_after_landing_seconds()),
        ratio_text(report.exposed_after_landing_ratio(run)), ms(run.forward_seconds),
        ms(run.forward_wait_seconds), ms(run.first_layer_wait_seconds),
        ms(run.median.backward_seconds), ms(run.step_seconds), report.ratio_to_bound(run),
        run.rollback_rate(), ratio_text(report.rollback_cost(run)), run.median.early_elements,
        static_cast<double>(run.median.stats.overlap_host_bytes) / (1 << 20));
  }
  out << "exposed = step()'s time after the last gradient (last_step_ns); landed = the same "
         "after the last gradient has landed (less last_step_wait_ns); forward = the next "
         "forward, its weights waited for one by one; fwd wait = forward less its compute (its "
         "wait for the previous step's uploads); 1st wait = the same for its first layer; "
         "step = forward + backward + step(); rb cost = a rolled-back step's exposed time / "
         "off's; medians (backward: the median exposed step's)\n";
  out << "where the exposed time goes (the median step; ms):\n";
  out << absl::StrFormat("%-8s %9s %9s %9s %9s %9s %9s %9s\n", "config", "step()", "grad wait",
                         "adam", "early wait", "rollback", "nvme wait", "early adam");
  for (const OverlapStepRun& run : report.runs) {
    const OffloadOptimizerStats& s = run.median.stats;
    out << absl::StrFormat("%-8s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", run.name,
                           ms_ns(s.last_step_ns), ms_ns(s.last_step_wait_ns), ms_ns(s.last_adam_ns),
                           ms_ns(s.last_early_wait_ns), ms_ns(s.last_rollback_ns),
                           ms_ns(s.last_nvme_wait_ns), ms_ns(s.last_early_adam_ns));
  }
  out << "goals: exposed vs off <= 0.10, step /bound <= 1.10, rb cost (a rolled-back step's "
         "exposed time vs off's) <= 2.0\n";
  for (const std::string& note : report.notes) out << note << "\n";
}

Json overlap_step_json(const OverlapStepReport& report) {
  Json runs = Json::array();
  for (const OverlapStepRun& run : report.runs) runs.push_back(run_json(report, run));
  return Json{{"mode", report.options.mode},
              {"state_home", report.state_home},
              {"layers", report.train.layers},
              {"layer_bytes", report.train.layer_bytes},
              {"params", report.params},
              {"chunk_elements", report.chunk_elements},
              {"compute_ms", json_general(report.train.compute_ms)},
              {"link_throttle_gbps", json_general(report.train.link_gbps)},
              {"steps", report.train.steps},
              {"inf_every", report.options.inf_every},
              {"bound_seconds", seconds_json(report.bound_seconds())},
              {"compute_seconds", seconds_json(report.compute_seconds)},
              {"transfer_seconds", seconds_json(report.transfer_seconds)},
              {"optimizer_seconds", seconds_json(report.optimizer_seconds)},
              {"runs", std::move(runs)},
              {"notes", report.notes}};
}

}  // namespace strata::bench
