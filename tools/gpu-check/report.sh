# shellcheck shell=bash
# Sourced by tools/gpu-check.sh after the steps: ctest's and pytest's counts, gpu-check.json and
# summary.txt (printed last: the device tool shows the last 12,000 characters of the output).
# ---- what the logs say -----------------------------------------------------------------------

# ctest: the counts and the failed tests, also when the deadline cut it short.
ctest_report() {
  local f="$OUT_DIR/ctest.log"
  [[ -s "$f" ]] || return
  awk '
    / Test +#[0-9]+: / {
      run++
      if ($0 ~ /Passed/) passed++
      else if ($0 ~ /\*\*\*Skipped/) skipped++
      else { failed++; line = $0; sub(/^.*Test +#[0-9]+: /, "", line); gsub(/\.\.\.+/, "", line)
             gsub(/ +/, " ", line); names = names (failed <= 25 ? "\n  " line : "") }
    }
    /tests passed, .* tests failed out of/ { total = $NF }
    END {
      printf "ctest: %d run%s, %d passed, %d failed, %d skipped", run, total ? " of " total : " (cut short)", passed, failed, skipped
      printf "%s%s\n", names, (failed > 25 ? "\n  ..." : "")
    }' "$f"
}

pytest_report() {
  local f="$OUT_DIR/pytest.log"
  [[ -s "$f" ]] || return
  echo "pytest: $(grep -E '[0-9]+ (passed|failed|error)' "$f" | tail -1 | tr -d '=' | sed 's/^ *//')"
  grep -E '^(FAILED|ERROR) ' "$f" | cut -c1-160 | head -15 | sed 's/^/  /'
}

passed=$(awk -F'\t' '$3 == "passed"' "$RESULTS" | wc -l)
failed=$(awk -F'\t' '$3 == "failed"' "$RESULTS" | wc -l)
skipped=$(awk -F'\t' '$3 == "skipped"' "$RESULTS" | wc -l)
elapsed=$((SECONDS - START))

# ---- the JSON -----------------------------------------------------------------------------------

json_string() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//$'\t'/ }"
  s="${s//$'\r'/ }"
  s="${s//$'\n'/\\n}"
  printf '"%s"' "$(tr -d '\000-\010\013\014\016-\037' <<<"$s")"
}

# A file's JSON as is when it holds any, else null.
json_file() {
  if [[ -s "$1" ]] && grep -q '[{[]' "$1"; then cat "$1"; else printf 'null'; fi
}

JSON="$OUT_DIR/gpu-check.json"
{
  printf '{\n  "tool": "gpu-check",\n'
  printf '  "finished": %s,\n' "$(json_string "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
  printf '  "gpus": %s,\n' "$(json_string "$gpu_list")"
  printf '  "driver": %s,\n' "$(json_string "$(timeout 10 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)")"
  printf '  "build_dir": %s,\n' "$(json_string "$BUILD_DIR")"
  printf '  "commit": %s,\n' "$(json_string "$(manifest_value commit || git -C "$SOURCE_DIR" rev-parse HEAD 2>/dev/null)")"
  printf '  "bundle_made": %s,\n' "$(json_string "$(manifest_value made || true)")"
  printf '  "setup": %s,\n' "$(json_string "$(cat "$SETUP_NOTES")")"
  printf '  "deadline_s": %d,\n  "elapsed_s": %d,\n' "$DEADLINE" "$elapsed"
  printf '  "ctest": %s,\n' "$(json_string "$(ctest_report)")"
  printf '  "pytest": %s,\n' "$(json_string "$(pytest_report)")"
  printf '  "summary": {"passed": %d, "failed": %d, "skipped": %d},\n' "$passed" "$failed" "$skipped"
  printf '  "checks": [\n'
  first=1
  while IFS=$'\t' read -r group name status seconds detail; do
    [[ $first -eq 1 ]] || printf ',\n'
    first=0
    printf '    {"group": %s, "name": %s, "status": %s, "seconds": %s, "detail": %s}' \
      "$(json_string "$group")" "$(json_string "$name")" "$(json_string "$status")" \
      "$seconds" "$(json_string "$detail")"
  done < "$RESULTS"
  printf '\n  ],\n  "figures": {\n'
  printf '    "strata_info": %s,\n' "$(json_file "$WORK/strata-info.json")"
  printf '    "offload_bench_paths": %s,\n' "$(json_file "$WORK/bench-paths.json")"
  printf '    "offload_bench_train_step": %s,\n' "$(json_file "$WORK/bench-train-step.json")"
  printf '    "offload_bench_overlap_step": %s,\n' "$(json_file "$WORK/bench-overlap-step.json")"
  printf '    "offload_bench_optimizer": %s,\n' "$(json_file "$WORK/bench-optimizer.json")"
  printf '    "torch_activations": %s,\n' "$(json_file "$WORK/torch-activations.json")"
  printf '    "gpt_compare": %s\n' "$(json_file "$OUT_DIR/compare.json")"
  printf '  }\n}\n'
} > "$JSON"

# ---- the summary (the device tool shows the last 12,000 characters of the output) ------------

SUMMARY="$OUT_DIR/summary.txt"
{
  echo "gpu-check summary: $(head -1 <<<"$gpu_list" | sed 's/ (UUID.*//'), $(nproc) cores"
  [[ -n "$MANIFEST" ]] && echo "bundle: commit $(manifest_value commit), made $(manifest_value made)"
  [[ -s "$SETUP_NOTES" ]] && sed 's/^/setup: /' "$SETUP_NOTES"
  # One line per check; of the [cuda] cases run one by one, the failures and a count.
  awk -F'\t' '$1 == "cuda-case" && $3 != "failed" { cases[$3]++; next }
              { d = $5; if (length(d) > 110) d = substr(d, 1, 107) "..."
                printf "%-7s %-9s %6ss  %s: %s\n", $3, $1, $4, $2, d }
              END { for (s in cases) printf "%-7s %-9s %7s  %d of the [cuda] cases run one by one\n", s, "cuda-case", "", cases[s] }' "$RESULTS"
  ctest_report
  pytest_report
  # compare.py's own summary (the comparison table travels in this file: few files come back).
  if [[ -s "$WORK/compare-summary.txt" ]]; then
    echo "---- GPT compare (examples/torch_trainer/compare.py) ----"
    cat "$WORK/compare-summary.txt"
  fi
} > "$SUMMARY"
# Every file kept under the device tool's 16 MiB (the end of a log is the part that tells).
for f in "${OUTPUT_FILES[@]}"; do
  if [[ -f "$OUT_DIR/$f" && $(stat -c %s "$OUT_DIR/$f") -gt 15728640 ]]; then
    { echo "[gpu-check: the start of this file was cut to keep it under 16 MiB]"
      tail -c 15000000 "$OUT_DIR/$f"; } > "$WORK/cut" && mv "$WORK/cut" "$OUT_DIR/$f"
  fi
done
files=$(find "$OUT_DIR" -type f | wc -l)
{
  echo "files: $(cd "$OUT_DIR" && find . -type f | sed 's|^\./||' | sort | tr '\n' ' ')($files of at most $MAX_OUT_FILES)"
  [[ $files -le $MAX_OUT_FILES ]] ||
    echo "error: $OUT_DIR holds $files files; the device tool returns at most $MAX_OUT_FILES"
  echo "gpu-check: $passed passed, $failed failed, $skipped skipped in ${elapsed}s (deadline ${DEADLINE}s)"
} >> "$SUMMARY"
echo
cat "$SUMMARY"
[[ $failed -eq 0 && $files -le $MAX_OUT_FILES ]]
