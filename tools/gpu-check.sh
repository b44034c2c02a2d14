#!/usr/bin/env bash
# gpu-check.sh: runs strata's GPU paths on a machine with an NVIDIA GPU and writes one JSON
# (what passed, failed and was skipped, and the figures) and one log. See docs/gpu-check.md.
#
# It needs only bash, coreutils and the build: no Debian -dev packages and no network. The build
# folder may come from another machine (then carry the shared libraries it needs: --bundle
# there, --libs here); with cmake, ninja and nvcc present it can also build here (--build-here).
#
#   tools/gpu-check.sh [--build DIR] [--out DIR] [--libs DIR] [--python PY] [--all-tests]
#   tools/gpu-check.sh --bundle DIR [--build DIR]    # on the build machine: libraries to carry
#   tools/gpu-check.sh --missing [--build DIR] [--libs DIR]  # here: what the build lacks
#
# Exit codes: 0 every check passed or was skipped; 1 a check failed; 2 bad command line or no
# usable build; 3 no GPU (nvidia-smi missing, or it lists no device).
set -uo pipefail

# Builtins only until the GPU check, so that it also answers under an empty PATH.
script_dir="${BASH_SOURCE[0]%/*}"
[[ "$script_dir" == "${BASH_SOURCE[0]}" ]] && script_dir=.
SOURCE_DIR="$(cd "$script_dir/.." && pwd)"
BUILD_DIR="${SOURCE_DIR}/build"
OUT_DIR="${OUT:-./gpu-check-out}"
LIBS_DIR=""
BUNDLE_DIR=""
PYTHON="${PYTHON:-python3}"
MODE=check
BUILD_HERE=0
ALL_TESTS=0
TEST_TIMEOUT=900
NO_GPU_EXIT=3

usage() {
  cat <<'EOF'
usage: tools/gpu-check.sh [flags]

Runs on a machine with an NVIDIA GPU, against a strata build folder:
  1. strata-info with STRATA_BACKEND=cuda (the backend and GPU strata sees)
  2. every [cuda] test case of the Catch2 binaries (build/tests/*_test), one by one
  3. the Python tests (tests/python) with STRATA_BACKEND=cuda and a CUDA torch
  4. examples/torch_trainer/train.py --device=cuda with STRATA_BACKEND=cuda, and
     activations_compare.py --device=cuda (plain torch, save_on_cpu, strata's activation
     offload: step time and peak torch.cuda.max_memory_allocated, with --json)
  5. offload-bench on CUDA: the path sweep (every path), --workload=train-step and
     --workload=optimizer, each with --json
and writes gpu-check.json (every check: passed/failed/skipped, seconds, detail; the bench
documents under "figures") and gpu-check.log (every command and its output) to the output
folder.

flags:
  --build DIR     the build folder (default: build/ next to this script's tools/)
  --out DIR       output folder (default: $OUT if set, else ./gpu-check-out)
  --build-here    configure and build DIR first (needs cmake, ninja, nvcc and the libraries;
                  CMAKE_ARGS in the environment is passed to cmake)
  --libs DIR      a folder made by --bundle: its lib/ goes first on LD_LIBRARY_PATH
  --python PY     the interpreter with a CUDA torch (default: $PYTHON or python3)
  --all-tests     run every test case of the Catch2 binaries, not only [cuda] ones (the rest
                  then run with STRATA_BACKEND=cuda where they read the environment)
  --timeout S     per-command limit in seconds (default 900)
  --bundle DIR    do not check: copy the shared libraries the build's binaries load, except
                  glibc and the NVIDIA driver's, into DIR/lib and list them in DIR/libs.txt
                  (run on the build machine; carry DIR to the GPU machine with the build)
  --missing       do not check: list the libraries the build's binaries cannot load here
                  (exit 1 when there are any)
  -h, --help      this text

STRATA_* variables in the environment reach every check (STRATA_BACKEND is set to cuda);
STRATA_NVME_PATHS unset means temporary directories under $TMPDIR.
exit codes: 0 no check failed; 1 a check failed; 2 bad command line or no usable build;
3 no GPU (nvidia-smi missing or listing no device).
EOF
}

die() {
  echo "gpu-check: $1" >&2
  exit "${2:-2}"
}

while [[ $# -gt 0 ]]; do
  arg="$1"
  case "$arg" in
    --*=*) value="${arg#*=}"; arg="${arg%%=*}"; shift; set -- "$arg" "$value" "$@" ;;
  esac
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --build) [[ $# -ge 2 ]] || die "--build needs a folder"; BUILD_DIR="$2"; shift 2 ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a folder"; OUT_DIR="$2"; shift 2 ;;
    --libs) [[ $# -ge 2 ]] || die "--libs needs a folder"; LIBS_DIR="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || die "--python needs an interpreter"; PYTHON="$2"; shift 2 ;;
    --timeout) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die "--timeout needs seconds (a positive integer)"
               TEST_TIMEOUT="$2"; shift 2 ;;
    --bundle) [[ $# -ge 2 ]] || die "--bundle needs a folder"; BUNDLE_DIR="$2"; MODE=bundle; shift 2 ;;
    --missing) MODE=missing; shift ;;
    --build-here) BUILD_HERE=1; shift ;;
    --all-tests) ALL_TESTS=1; shift ;;
    *) die "unknown argument '$1'; run 'tools/gpu-check.sh --help' for usage" ;;
  esac
done

if [[ -n "$LIBS_DIR" ]]; then
  [[ -d "$LIBS_DIR/lib" ]] || die "--libs $LIBS_DIR has no lib/ folder; make it with --bundle"
  libs_lib="$(cd "$LIBS_DIR/lib" && pwd)"
  export LD_LIBRARY_PATH="$libs_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---- the build's binaries -------------------------------------------------------------------

# Every ELF file of the build that gpu-check runs or loads, one per line.
build_binaries() {
  local f
  for f in "$BUILD_DIR"/tests/*_test "$BUILD_DIR"/tools/strata-info "$BUILD_DIR"/tools/offload-bench \
           "$BUILD_DIR"/tools/arena-replay "$BUILD_DIR"/tools/cpu-adam-bench \
           "$BUILD_DIR"/examples/cpp_trainer; do
    [[ -f "$f" && -x "$f" ]] && echo "$f"
  done
  find "$BUILD_DIR/python" -name '*.so' -type f 2>/dev/null
}

# Libraries that come with the machine, never carried: glibc's and the NVIDIA driver's.
is_system_library() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|\
    libutil.so*|libmvec.so*|libcuda.so*|libnvidia-*|libnvcuvid.so*) return 0 ;;
  esac
  return 1
}

require_build() {
  [[ -d "$BUILD_DIR" ]] || die "build folder '$BUILD_DIR' does not exist: give --build DIR, or --build-here to build it"
  [[ -n "$(build_binaries)" ]] || die "build folder '$BUILD_DIR' has no strata binaries (tests/*_test, tools/offload-bench): build it first, or give --build DIR"
}

# "name => path" lines the build's binaries load, and "name => not found" / version errors.
ldd_report() {
  local bin
  while read -r bin; do
    LC_ALL=C ldd "$bin" 2>&1 | sed "s|^|$bin: |"
  done < <(build_binaries)
}

missing_libraries() {
  ldd_report | awk '
    /=> not found/ { sub(/^[^:]*: */, ""); print $1 " (not found)"; next }
    /version .* not found/ { sub(/^[^:]*: *[^:]*: */, ""); print; next }' | sort -u
}

if [[ "$MODE" == bundle ]]; then
  require_build
  command -v ldd >/dev/null || die "ldd is missing; it is needed to list the libraries"
  mkdir -p "$BUNDLE_DIR/lib" || die "cannot create '$BUNDLE_DIR/lib'"
  : > "$BUNDLE_DIR/libs.txt"
  copied=0
  while read -r name path; do
    is_system_library "$name" && continue
    cp -L "$path" "$BUNDLE_DIR/lib/$name" || die "cannot copy $path to $BUNDLE_DIR/lib"
    echo "$name $path" >> "$BUNDLE_DIR/libs.txt"
    copied=$((copied + 1))
  done < <(ldd_report | awk '$3 == "=>" && $4 ~ /^\// { print $2, $4 }' | sort -u)
  missing="$(missing_libraries)"
  echo "gpu-check: copied $copied libraries ($(du -sh "$BUNDLE_DIR/lib" | cut -f1)) into $BUNDLE_DIR/lib; listed in $BUNDLE_DIR/libs.txt"
  echo "gpu-check: on the GPU machine: tools/gpu-check.sh --build BUILD --libs $BUNDLE_DIR"
  if [[ -n "$missing" ]]; then
    echo "gpu-check: the build cannot load these here either:" >&2
    echo "${missing//$'\n'/$'\n'  }" | sed '1s/^/  /' >&2
    exit 1
  fi
  exit 0
fi

if [[ "$MODE" == missing ]]; then
  require_build
  command -v ldd >/dev/null || die "ldd is missing; it is needed to list the libraries"
  missing="$(missing_libraries)"
  if [[ -z "$missing" ]]; then
    echo "gpu-check: every library the build needs is found${LIBS_DIR:+ (with --libs $LIBS_DIR)}"
    exit 0
  fi
  echo "gpu-check: the build's binaries cannot load these libraries here:"
  echo "${missing//$'\n'/$'\n'  }" | sed '1s/^/  /'
  echo "gpu-check: run 'tools/gpu-check.sh --bundle DIR' on the build machine and pass --libs DIR here"
  exit 1
fi

# ---- a GPU, or a clear no ---------------------------------------------------------------------

command -v nvidia-smi >/dev/null 2>&1 ||
  die "no GPU: nvidia-smi is not installed (no NVIDIA driver on this machine); gpu-check needs a machine with an NVIDIA GPU" "$NO_GPU_EXIT"
gpu_list="$(nvidia-smi -L 2>&1)"
smi_rc=$?
if [[ $smi_rc -ne 0 ]] || ! grep -q '^GPU [0-9]' <<<"$gpu_list"; then
  die "no GPU: 'nvidia-smi -L' lists no device (exit $smi_rc: $(head -1 <<<"$gpu_list"))" "$NO_GPU_EXIT"
fi

mkdir -p "$OUT_DIR" || die "cannot create the output folder '$OUT_DIR'"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
LOG="$OUT_DIR/gpu-check.log"
RESULTS="$OUT_DIR/.results.tsv"
: > "$LOG"
: > "$RESULTS"
log() { echo "$*" >> "$LOG"; }
say() { echo "gpu-check: $*"; log "== $*"; }

if [[ $BUILD_HERE -eq 1 ]]; then
  for tool in cmake ninja nvcc; do
    command -v "$tool" >/dev/null 2>&1 || [[ $tool == nvcc && -x /usr/local/cuda/bin/nvcc ]] ||
      die "--build-here needs $tool on PATH"
  done
  say "building $BUILD_DIR (Release)"
  # shellcheck disable=SC2086
  { cmake -S "$SOURCE_DIR" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} &&
    cmake --build "$BUILD_DIR" -j "$(nproc)"; } >> "$LOG" 2>&1 ||
    die "the build failed; see $LOG" 1
fi
require_build
BUILD_DIR="$(cd "$BUILD_DIR" && pwd)"

# ---- running checks -----------------------------------------------------------------------------

# check GROUP NAME COMMAND...: runs the command (output to the log), records passed/failed, or
# skipped when the output says SKIPPED:/SKIP: or the exit code is 77.
check() {
  local group="$1" name="$2"
  shift 2
  local start end rc output status detail
  start=$(date +%s.%N)
  log ""
  log "== [$group] $name: $*"
  output="$(timeout --kill-after=30 "$TEST_TIMEOUT" "$@" 2>&1)"
  rc=$?
  end=$(date +%s.%N)
  printf '%s\n' "$output" >> "$LOG"
  log "== exit $rc"
  if [[ $rc -eq 77 ]] || { [[ $rc -eq 0 ]] && grep -qE '(^|[^A-Za-z])SKIP(PED)?:' <<<"$output"; }; then
    status=skipped
    detail="$(grep -m1 -E 'SKIP(PED)?:' <<<"$output")"
  elif [[ $rc -eq 0 ]]; then
    status=passed
    detail="$(tail -n 1 <<<"$output")"
  else
    status=failed
    [[ $rc -eq 124 || $rc -eq 137 ]] && detail="timed out after ${TEST_TIMEOUT}s" ||
      detail="exit $rc: $(grep -v '^\s*$' <<<"$output" | tail -n 3 | tr '\n' ' ')"
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$group" "$name" "$status" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')" \
    "$(tr '\t\n' '  ' <<<"$detail" | cut -c1-400)" >> "$RESULTS"
  printf 'gpu-check: %-7s [%s] %s\n' "$status" "$group" "$name"
}

skip() {  # skip GROUP NAME REASON
  printf '%s\t%s\tskipped\t0\t%s\n' "$1" "$2" "$3" >> "$RESULTS"
  log "== [$1] $2: skipped: $3"
  printf 'gpu-check: %-7s [%s] %s (%s)\n' skipped "$1" "$2" "$3"
}

export STRATA_BACKEND=cuda
export PYTHONDONTWRITEBYTECODE=1
say "GPU: $(head -1 <<<"$gpu_list"); build $BUILD_DIR; output $OUT_DIR"
log "$gpu_list"
nvidia-smi >> "$LOG" 2>&1

missing="$(missing_libraries)"
if [[ -n "$missing" ]]; then
  log "missing libraries:"
  log "$missing"
  echo "gpu-check: warning: the build cannot load some libraries here (see $LOG);" \
       "carry them with --bundle on the build machine and --libs here" >&2
fi

# 1. What strata sees.
check info strata-info "$BUILD_DIR/tools/strata-info"
"$BUILD_DIR/tools/strata-info" --json > "$OUT_DIR/strata-info.json" 2>> "$LOG" || true

# 2. The [cuda] test cases of every Catch2 binary, one at a time (a crash names its test).
catch_escape() { sed -e 's/\\/\\\\/g' -e 's/,/\\,/g' -e 's/\[/\\[/g' -e 's/\]/\\]/g' <<<"$1"; }
spec=("[cuda]")
[[ $ALL_TESTS -eq 1 ]] && spec=()
for bin in "$BUILD_DIR"/tests/*_test; do
  [[ -x "$bin" && -f "$bin" ]] || continue
  names="$("$bin" --list-test-names-only "${spec[@]}" 2>>"$LOG")" || true
  while IFS= read -r test_name; do
    [[ -n "${test_name// /}" ]] || continue
    check tests "$(basename "$bin"): $test_name" "$bin" "$(catch_escape "$test_name")"
  done <<<"$names"
done
grep -q '^tests	' "$RESULTS" || skip tests "[cuda] test cases" "no test binary lists a [cuda] test case"

# 3 and 4. Python: the module in the build, a torch with CUDA.
PYTHON_MODULE_DIR="$BUILD_DIR/python"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  skip python pytest "no Python interpreter '$PYTHON' (give --python)"
  skip example torch_trainer "no Python interpreter '$PYTHON' (give --python)"
  skip example activations_compare "no Python interpreter '$PYTHON' (give --python)"
elif [[ ! -d "$PYTHON_MODULE_DIR/strata" ]]; then
  skip python pytest "the build has no Python module ($PYTHON_MODULE_DIR/strata)"
  skip example torch_trainer "the build has no Python module"
  skip example activations_compare "the build has no Python module"
else
  export PYTHONPATH="$PYTHON_MODULE_DIR${PYTHONPATH:+:$PYTHONPATH}"
  torch_cuda="$("$PYTHON" -c 'import torch; print("yes" if torch.cuda.is_available() else "no: torch " + torch.__version__ + " sees no CUDA device")' 2>&1 | tail -1)"
  log "torch: $torch_cuda"
  check python "import strata" "$PYTHON" -c 'import strata; rt = strata.Runtime(); print(rt.backend)'
  if [[ "$torch_cuda" != yes ]]; then
    skip python pytest "no CUDA torch for $PYTHON ($torch_cuda)"
    skip example torch_trainer "no CUDA torch for $PYTHON ($torch_cuda)"
    skip example activations_compare "no CUDA torch for $PYTHON ($torch_cuda)"
  else
    if "$PYTHON" -c 'import pytest' >/dev/null 2>&1; then
      check python pytest "$PYTHON" -m pytest -q -p no:cacheprovider -rs "$SOURCE_DIR/tests/python"
    else
      skip python pytest "pytest is not installed for $PYTHON"
    fi
    check example torch_trainer "$PYTHON" "$SOURCE_DIR/examples/torch_trainer/train.py" --device=cuda
    # Activation offload against plain torch and torch's save_on_cpu(pin_memory=True), one run:
    # step time and peak torch.cuda.max_memory_allocated (docs/activations.md).
    check example activations_compare "$PYTHON" \
      "$SOURCE_DIR/examples/torch_trainer/activations_compare.py" --device=cuda \
      --json="$OUT_DIR/torch-activations.json"
  fi
fi

# 5. offload-bench: every path, the train step, the optimizer step; their JSON are the figures.
BENCH="$BUILD_DIR/tools/offload-bench"
if [[ -x "$BENCH" ]]; then
  check bench "offload-bench paths" "$BENCH" --json="$OUT_DIR/bench-paths.json"
  check bench "offload-bench train-step" "$BENCH" --workload=train-step \
    --json="$OUT_DIR/bench-train-step.json"
  check bench "offload-bench optimizer" "$BENCH" --workload=optimizer \
    --json="$OUT_DIR/bench-optimizer.json"
  # The NCCL communicator's [cuda] tests run in step 2 (comm_test); the collective workload
  # has no NCCL baseline yet, so it is not a GPU figure.
  skip bench "offload-bench collective (nccl)" "the collective workload measures Gloo only so far"
else
  skip bench offload-bench "the build has no tools/offload-bench"
fi

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

passed=$(awk -F'\t' '$3 == "passed"' "$RESULTS" | wc -l)
failed=$(awk -F'\t' '$3 == "failed"' "$RESULTS" | wc -l)
skipped=$(awk -F'\t' '$3 == "skipped"' "$RESULTS" | wc -l)
JSON="$OUT_DIR/gpu-check.json"
{
  printf '{\n  "tool": "gpu-check",\n'
  printf '  "finished": %s,\n' "$(json_string "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
  printf '  "gpus": %s,\n' "$(json_string "$gpu_list")"
  printf '  "driver": %s,\n' "$(json_string "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)")"
  printf '  "build_dir": %s,\n' "$(json_string "$BUILD_DIR")"
  printf '  "commit": %s,\n' "$(json_string "$(git -C "$SOURCE_DIR" rev-parse HEAD 2>/dev/null || echo unknown)")"
  printf '  "missing_libraries": %s,\n' "$(json_string "$missing")"
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
  printf '    "strata_info": %s,\n' "$(json_file "$OUT_DIR/strata-info.json")"
  printf '    "offload_bench_paths": %s,\n' "$(json_file "$OUT_DIR/bench-paths.json")"
  printf '    "offload_bench_train_step": %s,\n' "$(json_file "$OUT_DIR/bench-train-step.json")"
  printf '    "offload_bench_optimizer": %s,\n' "$(json_file "$OUT_DIR/bench-optimizer.json")"
  printf '    "torch_activations": %s\n' "$(json_file "$OUT_DIR/torch-activations.json")"
  printf '  }\n}\n'
} > "$JSON"
rm -f "$RESULTS"

echo "gpu-check: $passed passed, $failed failed, $skipped skipped; $JSON and $LOG"
[[ $failed -eq 0 ]]
