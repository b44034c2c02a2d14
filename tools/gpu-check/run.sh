# shellcheck shell=bash
# Sourced by tools/gpu-check.sh on the GPU machine: the deadline, the bundle's unpacking, the
# libraries and tools CTest expects, and the steps (info, cuda, pytest, bench, ctest, examples).
# ---- running checks -----------------------------------------------------------------------------

time_left() { echo $((DEADLINE - (SECONDS - START) - RESERVE)); }
# limit_for CAP: CAP seconds, or what is left before the deadline when less (at least 1).
limit_for() {
  local left
  left=$(time_left)
  [[ $left -lt $1 ]] || left=$1
  [[ $left -ge 1 ]] || left=1
  echo "$left"
}

# run_check GROUP NAME CAP LOGFILE COMMAND...: runs the command for at most CAP seconds (less if
# the deadline is nearer), its output appended to LOGFILE (and kept in $WORK/last.out); records
# passed, failed, or skipped when the exit code is 77 or the output says SKIPPED:/SKIP:.
run_check() {
  local group="$1" name="$2" cap="$3" logfile="$4"
  shift 4
  local limit start end rc status detail
  limit=$(time_left)
  [[ $limit -gt $cap ]] && limit=$cap
  if [[ $limit -lt 3 ]]; then  # a step that could not even start
    skip "$group" "$name" "no time left before the ${DEADLINE}s deadline"
    return 0
  fi
  start=$(date +%s.%N)
  printf '\n== [%s] %s (limit %ss): %s\n' "$group" "$name" "$limit" "$*" >> "$logfile"
  timeout --kill-after=5 "$limit" "$@" > "$WORK/last.out" 2>&1 < /dev/null
  rc=$?
  end=$(date +%s.%N)
  cat "$WORK/last.out" >> "$logfile"
  echo "== exit $rc" >> "$logfile"
  if [[ $rc -eq 77 ]] || { [[ $rc -eq 0 ]] && grep -qE '(^|[^A-Za-z])SKIP(PED)?:' "$WORK/last.out"; }; then
    status=skipped
    detail="$(grep -m1 -E 'SKIP(PED)?:' "$WORK/last.out")"
  elif [[ $rc -eq 0 ]]; then
    status=passed
    detail="$(grep -v '^\s*$' "$WORK/last.out" | tail -n 1)"
  else
    status=failed
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      detail="timed out after ${limit}s"
    else
      detail="exit $rc: $(grep -v '^\s*$' "$WORK/last.out" | tail -n 3 | tr '\n' ' ')"
    fi
  fi
  record "$group" "$name" "$status" "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')" "$detail"
  return $rc
}

record() {  # record GROUP NAME STATUS SECONDS DETAIL
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(tr '\t\n' '  ' <<<"$5" | cut -c1-400)" >> "$RESULTS"
  printf 'gpu-check: %-7s [%s] %s (%ss)\n' "$3" "$1" "$2" "$4"
}

skip() {  # skip GROUP NAME REASON
  printf '%s\t%s\tskipped\t0\t%s\n' "$1" "$2" "$3" >> "$RESULTS"
  log "== [$1] $2: skipped: $3"
  printf 'gpu-check: %-7s [%s] %s (%s)\n' skipped "$1" "$2" "$3"
}

# ---- setup: the bundle, the libraries, the tools CTest expects -------------------------------

MANIFEST=""
manifest_value() { [[ -n "$MANIFEST" ]] && sed -n "s/^$1=//p" "$MANIFEST" | head -1; }

unpack_bundle() {
  local tarball="$FROM_TARBALL" src here build start
  start=$(date +%s.%N)
  timeout "$(limit_for 60)" tar -xzf "$tarball" -C "$WORK" strata-bundle ||
    die "--from: cannot unpack $tarball (strata-bundle/): is it a bundle of this version?" 1
  MANIFEST="$WORK/strata-bundle/bundle.txt"
  src="$(manifest_value source_dir)"
  build="$(manifest_value build_dir)"
  [[ -n "$src" && -n "$build" ]] || die "--from: $MANIFEST names no source_dir or build_dir" 1
  # CTest's files name the sources and the build by the absolute paths they had there.
  here="$(cd "$SOURCE_DIR" && pwd -P)"
  if [[ "$src" -ef "$here" ]]; then
    :
  elif [[ -e "$src" || -L "$src" ]]; then
    die "--from: the build's sources were at $src, which exists here and is another folder: move it away, or run from that checkout" 1
  else
    if ! { mkdir -p "$(dirname "$src")" && ln -s "$here" "$src"; }; then
      die "--from: cannot link $src to this checkout ($here)" 1
    fi
    note "linked $src -> $here (the path the build was made at)"
  fi
  mkdir -p "$build" || die "--from: cannot create $build" 1
  timeout "$(limit_for 120)" tar -xzf "$tarball" -C "$build" --strip-components=1 build ||
    die "--from: cannot unpack the build of $tarball into $build" 1
  BUILD_DIR="$build"
  LIBS_DIR="$WORK/strata-bundle"
  add_libs "$LIBS_DIR"
  record setup "unpack $(basename "$tarball")" passed \
    "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" \
    "commit $(manifest_value commit); made $(manifest_value made); build at $build"
}

# The directory of torch's NCCL (nvidia/nccl/lib of the interpreter's site-packages), if any.
torch_nccl_dir() {
  timeout "$(limit_for 30)" "$PYTHON" - <<'EOF' 2>/dev/null
import os, site
dirs = []
try:
    import nvidia.nccl as nccl
    dirs += [os.path.join(p, "lib") for p in nccl.__path__]
except Exception:
    pass
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    dirs.append(os.path.join(sp, "nvidia", "nccl", "lib"))
for d in dirs:
    if os.path.exists(os.path.join(d, "libnccl.so.2")):
        print(d)
        break
EOF
}

[[ -n "$FROM_DIR" ]] && unpack_bundle
require_build
BUILD_DIR="$(cd "$BUILD_DIR" && pwd)"
export STRATA_BACKEND=cuda
export PYTHONDONTWRITEBYTECODE=1
export PYTHONUNBUFFERED=1
say "GPU: $(head -1 <<<"$gpu_list"); build $BUILD_DIR; output $OUT_DIR; deadline ${DEADLINE}s"
log "$gpu_list"

PYTHON_PATH="$(command -v "$PYTHON" 2>/dev/null)"
if [[ -n "$PYTHON_PATH" ]]; then
  nccl_dir="$(torch_nccl_dir)"
  if [[ -n "$nccl_dir" ]]; then
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl_dir"
    note "NCCL: torch's, $nccl_dir/libnccl.so.2"
  fi
fi
log "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

# CTest tests run `cmake -P` by the path cmake had on the build machine (/usr/bin/cmake).
build_cmake="$(manifest_value cmake)"
[[ -n "$build_cmake" ]] || build_cmake="$(cache_value CMAKE_COMMAND)"
if [[ -n "$build_cmake" && ! -e "$build_cmake" ]]; then
  if command -v cmake >/dev/null 2>&1 && mkdir -p "$(dirname "$build_cmake")" 2>/dev/null &&
     ln -s "$(command -v cmake)" "$build_cmake" 2>/dev/null; then
    note "linked $build_cmake -> $(command -v cmake) (CTest runs cmake by that path)"
  else
    note "warning: $build_cmake (the build's cmake) is missing and cannot be linked: CTest tests that run cmake -P will fail"
  fi
fi
# The unpacked copy's CTest files name the build machine's interpreter: this one's instead (the
# module for its version is in the bundle).
build_python="$(manifest_value python)"
if [[ -n "$FROM_DIR" && -n "$build_python" && -n "$PYTHON_PATH" && "$build_python" != "$PYTHON_PATH" ]]; then
  find "$BUILD_DIR" -name CTestTestfile.cmake -exec sed -i "s|\"$build_python\"|\"$PYTHON_PATH\"|g" {} +
  note "CTest's Python: $PYTHON_PATH (the build's was $build_python)"
fi

# ---- the steps ------------------------------------------------------------------------------------

step_info() {
  run_check info nvidia-smi 20 "$LOG" nvidia-smi
  run_check info strata-info 30 "$LOG" "$BUILD_DIR/tools/strata-info"
  if [[ -x "$BUILD_DIR/tools/strata-info" ]]; then
    timeout "$(limit_for 30)" "$BUILD_DIR/tools/strata-info" --json > "$WORK/strata-info.json" 2>> "$LOG"
  fi
  missing="$(missing_libraries)"
  if [[ -n "$missing" ]]; then
    log "missing libraries:"
    log "$missing"
    record info libraries failed 0 "the build cannot load: $(tr '\n' ' ' <<<"$missing")"
  fi
}

catch_escape() { sed -e 's/\\/\\\\/g' -e 's/,/\\,/g' -e 's/\[/\\[/g' -e 's/\]/\\]/g' <<<"$1"; }

# One process per binary with [cuda] cases (a CUDA context each, not one per case); a binary
# that fails runs its cases again one by one, so that the summary names them.
step_cuda() {
  local bin names group_end=$((SECONDS + 150)) n=0 cap
  for bin in "$BUILD_DIR"/tests/*_test; do
    [[ -x "$bin" && -f "$bin" ]] || continue
    grep -qa -- --list-test-names-only "$bin" || continue  # a Catch2 binary (not c_api_c_test)
    names="$(timeout "$(limit_for 20)" "$bin" --list-test-names-only "[cuda]" 2>>"$LOG" | grep -v '^\s*$')"
    [[ -n "$names" ]] || continue
    n=$((n + 1))
    cap=$((group_end - SECONDS)); [[ $cap -gt 90 ]] && cap=90
    if run_check cuda "$(basename "$bin") [cuda]" "$cap" "$LOG" "$bin" "[cuda]" --durations yes; then
      continue
    fi
    while IFS= read -r test_name; do
      cap=$((group_end - SECONDS)); [[ $cap -gt 30 ]] && cap=30
      run_check cuda-case "$(basename "$bin"): $test_name" "$cap" "$LOG" "$bin" "$(catch_escape "$test_name")"
    done <<<"$names"
  done
  [[ $n -gt 0 ]] || skip cuda "[cuda] test cases" "no test binary lists a [cuda] test case"
}

step_pytest() {
  local module_dir="$BUILD_DIR/python" torch_cuda
  if [[ -z "$PYTHON_PATH" ]]; then
    skip python pytest "no Python interpreter '$PYTHON' (give --python)"
    return
  fi
  if [[ ! -d "$module_dir/strata" ]]; then
    skip python pytest "the build has no Python module ($module_dir/strata)"
    return
  fi
  export PYTHONPATH="$module_dir${PYTHONPATH:+:$PYTHONPATH}"
  if ! run_check python "import strata" 60 "$LOG" "$PYTHON" -c \
       'import strata, sys; print(sys.version.split()[0], strata._strata.__file__)'; then
    skip python pytest "'import strata' failed with $PYTHON (see gpu-check.log)"
    return
  fi
  torch_cuda="$(timeout "$(limit_for 60)" "$PYTHON" -c 'import torch; print("yes" if torch.cuda.is_available() else "no: torch " + torch.__version__ + " sees no CUDA device")' 2>&1 | tail -1)"
  log "torch: $torch_cuda"
  if [[ "$torch_cuda" != yes ]]; then
    skip python pytest "no CUDA torch for $PYTHON ($torch_cuda)"
  elif ! timeout "$(limit_for 30)" "$PYTHON" -c 'import pytest' >/dev/null 2>&1; then
    skip python pytest "pytest is not installed for $PYTHON"
  else
    run_check python pytest 120 "$OUT_DIR/pytest.log" "$PYTHON" -m pytest -q -p no:cacheprovider -rfEs \
      "$SOURCE_DIR/tests/python"
  fi
}

step_bench() {
  local bench="$BUILD_DIR/tools/offload-bench"
  if [[ ! -x "$bench" ]]; then
    skip bench offload-bench "the build has no tools/offload-bench"
    return
  fi
  run_check bench "offload-bench paths" 60 "$OUT_DIR/bench.txt" "$bench" --json="$WORK/bench-paths.json"
  run_check bench "offload-bench train-step" 45 "$OUT_DIR/bench.txt" "$bench" --workload=train-step \
    --json="$WORK/bench-train-step.json"
  run_check bench "offload-bench optimizer" 45 "$OUT_DIR/bench.txt" "$bench" --workload=optimizer \
    --json="$WORK/bench-optimizer.json"
  # Issue 26: the overlapped optimizer step on CUDA (exposed time with and without overlap,
  # forced rollbacks), with a backward long enough for the early Adam.
  run_check bench "offload-bench overlapped step" 60 "$OUT_DIR/bench.txt" "$bench" \
    --workload=train-step --policies=belady --steps=5 --home=cpu --layers=16 --layer-bytes=8MiB \
    --compute-ms=16 --json="$WORK/bench-overlap-step.json"
}

step_ctest() {
  if ! command -v ctest >/dev/null 2>&1; then
    skip ctest "CTest suite" "ctest is not on PATH"
    return
  fi
  # STRATA_BACKEND unset: every test picks its backend as a user's program would (auto: cuda).
  # The tests labelled needs_dev_packages build a project against the installed package, which
  # needs the -dev packages (Abseil, TBB, ...) a carried bundle does not have: left out, by name.
  run_check ctest "CTest suite" 200 "$OUT_DIR/ctest.log" env -u STRATA_BACKEND \
    ctest --test-dir "$BUILD_DIR" -j "$(nproc)" --timeout 60 --output-on-failure --no-tests=error \
    -LE needs_dev_packages
}

step_examples() {
  if [[ -z "$PYTHON_PATH" || ! -d "$BUILD_DIR/python/strata" ]]; then
    skip example torch_trainer "no Python interpreter '$PYTHON' or no Python module in the build"
    return
  fi
  export PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
  run_check example torch_trainer 60 "$LOG" "$PYTHON" "$SOURCE_DIR/examples/torch_trainer/train.py" --device=cuda
  # strata.torch.zero_shard on the GPU (issue 25, never run on one when written): the GPT at
  # stage 3, its shards and AdamW states in the CPU tier, gathered into the GPU arena on torch's
  # stream; every step's loss against torch's AdamW on the same GPU (--tolerance's default).
  # pytest (step_pytest) runs tests/python/test_torch_zero_streams.py's test_zero_shard_on_cuda.
  run_check example "torch_trainer gpt-tiny --zero-stage=3" 90 "$LOG" env STRATA_NVME_PATHS= \
    "$PYTHON" "$SOURCE_DIR/examples/torch_trainer/train.py" --model=gpt-tiny --zero-stage=3 \
    --device=cuda --steps=10
  # Activation offload against plain torch and save_on_cpu(pin_memory=True): step time and peak
  # torch.cuda.max_memory_allocated (docs/activations.md).
  run_check example activations_compare 60 "$LOG" "$PYTHON" \
    "$SOURCE_DIR/examples/torch_trainer/activations_compare.py" --device=cuda \
    --json="$WORK/torch-activations.json"
}

# The GPT trained by strata ZeRO-3 (CPU tier and NVMe), FSDP2 (with and without
# CPUOffloadPolicy) and plain torch after a smoke stage, and each one's largest model
# (docs/bench.md): 300 s, so only with --only info,compare.
# compare.py's own deadline ends it 15 s before the step's limit, so that its JSON and SVG are
# written; NVMe under $WORK unless STRATA_NVME_PATHS names a drive.
step_compare() {
  local limit nvme="${STRATA_NVME_PATHS:-}"
  nvme="${nvme%%,*}"
  if [[ -z "$PYTHON_PATH" || ! -d "$BUILD_DIR/python/strata" ]]; then
    skip compare "GPT compare" "no Python interpreter '$PYTHON' or no Python module in the build"
    return
  fi
  limit=$(limit_for 300)
  if [[ $limit -lt 40 ]]; then
    skip compare "GPT compare" "${limit}s left before the ${DEADLINE}s deadline; it needs 300 (--only info,compare)"
    return
  fi
  if [[ -z "$nvme" ]]; then
    nvme="$WORK/nvme"
    mkdir -p "$nvme"
  fi
  export PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
  # Its summary (the smoke stage's verdict, the phases' times, the table, the agreement and the
  # largest models) goes into summary.txt (report.sh): one of the few files that come back.
  run_check compare "GPT compare" 300 "$LOG" "$PYTHON" \
    "$SOURCE_DIR/examples/torch_trainer/compare.py" --device=cuda --deadline-s=$((limit - 15)) \
    --nvme-path="$nvme" --json="$OUT_DIR/compare.json" --svg="$OUT_DIR/compare.svg" \
    --summary="$WORK/compare-summary.txt"
}

for s in "${STEPS[@]}"; do
  "step_$s"
done
