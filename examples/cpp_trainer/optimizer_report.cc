// What cpp_trainer reports of its optimizer steps: per step the optimizer time exposed after the
// last gradient and, with --overlap-step, the early work kept or rolled back; and the report's
// list of floats (the losses).
#include <absl/strings/str_format.h>

#include <algorithm>
#include <utility>

#include "trainer.h"

namespace cpp_trainer {

void record_optimizer_step(const strata::OffloadOptimizerStats& after, uint64_t rollbacks_before,
                           RunResult& result) {
  result.optimizer_ns.push_back(after.last_step_ns);
  result.early_elements.push_back(after.last_early_elements);
  result.rolled_back.push_back(after.overlap_rollbacks > rollbacks_before);
}

std::string overlap_note(const Args& args, const RunResult& r, size_t step) {
  if (!args.overlap_step) return "";
  return absl::StrFormat(" (%d elements early%s)", r.early_elements[step],
                         r.rolled_back[step] ? ", rolled back" : "");
}

namespace {
uint64_t rollbacks(const RunResult& r) {
  return static_cast<uint64_t>(std::count(r.rolled_back.begin(), r.rolled_back.end(), true));
}
}  // namespace

void print_optimizer_summary(std::FILE* human, const Args& args, const RunResult& r) {
  // Step 1 runs with cold caches: the mean leaves it out when there are more.
  const size_t first = r.optimizer_ns.size() > 1 ? 1 : 0;
  double ns = 0;
  uint64_t early_steps = 0;
  for (size_t i = first; i < r.optimizer_ns.size(); ++i) {
    ns += static_cast<double>(r.optimizer_ns[i]);
    early_steps += r.early_elements[i] > 0 ? 1 : 0;
  }
  const size_t counted = std::max<size_t>(1, r.optimizer_ns.size() - first);
  std::fprintf(human, "optimizer time exposed after the last gradient: %.3f ms a step (mean%s)",
               ns / static_cast<double>(counted) * 1e-6, first == 1 ? " after step 1" : "");
  if (args.overlap_step) {
    std::fprintf(human, "; overlapped: %llu of %zu steps kept early work, %llu rolled back",
                 static_cast<unsigned long long>(early_steps), counted,
                 static_cast<unsigned long long>(rollbacks(r)));
  }
  std::fprintf(human, "\n");
}

Json optimizer_json(const RunResult& r) {
  Json exposed = Json::array();
  for (uint64_t ns : r.optimizer_ns) exposed.push_back(json_double(static_cast<double>(ns) * 1e-9));
  return Json{{"exposed_seconds", std::move(exposed)},
              {"early_elements", r.early_elements},
              {"rollbacks", rollbacks(r)}};
}

Json json_floats(const std::vector<float>& values) {
  Json list = Json::array();
  for (float v : values) list.push_back(strata::json_float(v));
  return list;
}

}  // namespace cpp_trainer
