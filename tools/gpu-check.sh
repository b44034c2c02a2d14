#!/usr/bin/env bash
# gpu-check.sh: runs strata's checks on a machine with an NVIDIA GPU, within a deadline, and
# writes at most 8 files (a summary, one JSON, the logs). See docs/gpu-check.md.
#
# It needs only bash, coreutils, tar and the build: no Debian -dev packages and no network. A
# build made elsewhere travels as one bundle (--bundle there, --from here). The halves are in
# tools/gpu-check/: bundle.sh (the build machine's), run.sh (the steps), report.sh (the outputs).
#
#   tools/gpu-check.sh --bundle DIR [--build DIR] [--for-python X.Y|none] [--no-build]
#   tools/gpu-check.sh --from DIR [--out DIR] [--python PY] [--deadline S] [--only STEPS]
#   tools/gpu-check.sh [--build DIR] [--libs DIR] [--out DIR] [--python PY] [--deadline S]
#   tools/gpu-check.sh --missing [--build DIR] [--libs DIR]
#   tools/gpu-check.sh --list-outputs
#
# Exit codes: 0 every check passed or was skipped; 1 a check failed (or the bundle is over the
# device tool's limits); 2 bad command line or no usable build; 3 no GPU.
set -uo pipefail

# Builtins only until the GPU check, so that it also answers under an empty PATH.
script_dir="${BASH_SOURCE[0]%/*}"
[[ "$script_dir" == "${BASH_SOURCE[0]}" ]] && script_dir=.
SOURCE_DIR="$(cd "$script_dir/.." && pwd)"
BUILD_DIR="${SOURCE_DIR}/build"
OUT_DIR="${OUT:-./gpu-check-out}"
LIBS_DIR=""
BUNDLE_DIR=""
FROM_DIR=""
PYTHON="${PYTHON:-python3}"
MODE=check
BUILD_HERE=0
NO_BUILD=0
FOR_PYTHON=3.12
ONLY=""
STEPS=(info cuda pytest bench ctest examples)
# Steps run only when --only names them: compare takes 300 s of its own (docs/bench.md).
EXTRA_STEPS=(compare)
# The device tool: at most 8 files come back from $OUT, a command is at most 2,000 characters and
# what travels (the working tree and the carried paths) at most 64 MiB.
MAX_OUT_FILES=8
MAX_CARRY_MIB="${GPU_CHECK_MAX_CARRY_MIB:-64}"
# The whole run, unpacking included, ends within --deadline seconds (under 6 minutes, with a
# margin for the summary); each step also has its own cap (below).
DEADLINE=330
RESERVE=8
NO_GPU_EXIT=3
BUNDLE_NAME=strata-gpu-bundle.tar.gz
# What a run writes into the output folder, and nothing else.
OUTPUT_FILES=(summary.txt gpu-check.json gpu-check.log ctest.log pytest.log bench.txt compare.json
              compare.svg)

usage() {
  cat <<'EOF'
usage: tools/gpu-check.sh [flags]

On a machine with an NVIDIA GPU, against a strata build, within --deadline seconds (default 330,
so that the whole run ends under 6 minutes), runs these steps, each bounded by `timeout`:
  info      nvidia-smi, and strata-info with STRATA_BACKEND=cuda (what strata sees)
  cuda      every [cuda] test case of the Catch2 binaries (build/tests/*_test), one process per
            binary; the cases of a failing binary again one by one, to name the failures
  pytest    import strata, then the Python tests (tests/python) with STRATA_BACKEND=cuda and
            the interpreter's CUDA torch
  bench     offload-bench on CUDA: the path sweep, --workload=train-step and
            --workload=optimizer, each with --json
  ctest     the whole CTest suite of the build (-j cores, 60 s per test; STRATA_BACKEND unset)
  examples  examples/torch_trainer/train.py and activations_compare.py with --device=cuda
  compare   (only when --only names it: --only info,compare) examples/torch_trainer/compare.py:
            the GPT by strata ZeRO-3 (CPU tier, NVMe), FSDP2 + CPUOffloadPolicy and plain
            torch, and each one's largest model, in 300 s; writes compare.json and compare.svg
A step that fails is recorded and the next one runs; a step that would start past the deadline
is recorded as skipped. It writes at most 8 files into the output folder: summary.txt (also
printed at the end), gpu-check.json (every check, the figures), gpu-check.log, ctest.log,
pytest.log and bench.txt; the compare step adds compare.json and compare.svg.

modes:
  --bundle DIR    on the build machine: the whole recipe for a GPU machine without -dev
                  packages. Builds --build (with the Python module also for the GPU machine's
                  Python, --for-python), copies the shared libraries its binaries load (not
                  glibc's, the NVIDIA driver's, libnccl, libstdc++ or libgcc_s: the GPU
                  machine's are used), and writes DIR/strata-gpu-bundle.tar.gz: the build
                  without *.o, *.a and CMakeFiles, the libraries and the paths it was built at.
                  DIR must be a git-ignored folder of this checkout; the bundle and the working
                  tree must fit the device tool's 64 MiB. Prints the device tool's call.
  --from DIR      on the GPU machine: unpack DIR's bundle so that the build sits at the absolute
                  path it was made at (linking the checkout's path to this checkout if needed),
                  then check it (as --build BUILD --libs DIR)
  --missing       list the libraries the build's binaries cannot load here (exit 1 if any)
  --list-outputs  print the names of the files a check writes, and exit

flags:
  --build DIR     the build folder (default: build/ next to this script's tools/)
  --libs DIR      a folder with lib/ (from a bundle): first on LD_LIBRARY_PATH
  --out DIR       output folder (default: $OUT if set, else ./gpu-check-out)
  --python PY     the interpreter with a CUDA torch (default: $PYTHON or python3); its torch's
                  NCCL (nvidia/nccl/lib in site-packages) goes on LD_LIBRARY_PATH
  --deadline S    the whole run's limit in seconds (default 330)
  --only LIST     comma-separated steps to run (default: info,cuda,pytest,bench,ctest,examples;
                  also compare)
  --build-here    configure and build --build first (needs cmake, ninja, nvcc and the
                  libraries; CMAKE_ARGS is passed to cmake; not counted in the deadline)
  --for-python V  --bundle: the GPU machine's Python version (default 3.12; found here with
                  pyenv or as pythonV, headers needed); 'none': only the build's own module
  --no-build      --bundle: take the build as it is (no configure, no build)
  -h, --help      this text

STRATA_* variables in the environment reach every check (STRATA_BACKEND is set to cuda, and
unset for ctest); STRATA_NVME_PATHS unset means temporary directories under $TMPDIR. If the
build's cmake (e.g. /usr/bin/cmake) is missing, it is linked to the cmake on PATH, for the CTest
tests that run `cmake -P`.
exit codes: 0 no check failed; 1 a check failed, or --bundle is over the limits; 2 bad
command line or no usable build; 3 no GPU (nvidia-smi missing or listing no device).
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
    --deadline) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die "--deadline needs seconds (a positive integer)"
                DEADLINE="$2"; shift 2 ;;
    --only) [[ $# -ge 2 ]] || die "--only needs a list of steps (${STEPS[*]})"; ONLY="$2"; shift 2 ;;
    --bundle) [[ $# -ge 2 ]] || die "--bundle needs a folder"; BUNDLE_DIR="$2"; MODE=bundle; shift 2 ;;
    --from) [[ $# -ge 2 ]] || die "--from needs the folder of a bundle"; FROM_DIR="$2"; shift 2 ;;
    --for-python) [[ $# -ge 2 && "$2" =~ ^([0-9]+\.[0-9]+|none)$ ]] ||
                    die "--for-python needs a Python version X.Y (e.g. 3.12) or 'none'"
                  FOR_PYTHON="$2"; shift 2 ;;
    --no-build) NO_BUILD=1; shift ;;
    --missing) MODE=missing; shift ;;
    --list-outputs) MODE=list; shift ;;
    --build-here) BUILD_HERE=1; shift ;;
    *) die "unknown argument '$1'; run 'tools/gpu-check.sh --help' for usage" ;;
  esac
done

[[ "$MAX_CARRY_MIB" =~ ^[0-9]+$ ]] || die "GPU_CHECK_MAX_CARRY_MIB='$MAX_CARRY_MIB' is not a number of MiB"
if [[ -n "$ONLY" ]]; then
  IFS=, read -r -a only_steps <<<"$ONLY"
  for s in "${only_steps[@]}"; do
    [[ " ${STEPS[*]} ${EXTRA_STEPS[*]} " == *" $s "* ]] ||
      die "--only: '$s' is not a step; the steps: $(IFS=,; echo "${STEPS[*]},${EXTRA_STEPS[*]}")"
  done
  STEPS=("${only_steps[@]}")
fi
want() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }

if [[ "$MODE" == list ]]; then
  printf '%s\n' "${OUTPUT_FILES[@]}"
  exit 0
fi

add_libs() {  # add_libs DIR: DIR/lib first on LD_LIBRARY_PATH
  [[ -d "$1/lib" ]] || die "--libs $1 has no lib/ folder; make it with --bundle"
  local lib
  lib="$(cd "$1/lib" && pwd)"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
[[ -n "$LIBS_DIR" ]] && add_libs "$LIBS_DIR"

# ---- the build's binaries -------------------------------------------------------------------

# Every ELF file of the build (not its objects), one per line.
build_elves() {
  local f magic
  while IFS= read -r -d '' f; do
    magic="$(head -c 4 "$f" 2>/dev/null | tr -d '\0')"
    [[ "$magic" == $'\177ELF' ]] && echo "$f"
  done < <(find "$BUILD_DIR" -path '*/CMakeFiles' -prune -o -type f \
             \( -perm -u+x -o -name '*.so' -o -name '*.so.*' \) -print0 2>/dev/null)
}

# Libraries that come with the machine, never carried: glibc's and the NVIDIA driver's.
is_system_library() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|\
    libutil.so*|libmvec.so*|libcuda.so*|libnvidia-*|libnvcuvid.so*) return 0 ;;
  esac
  return 1
}

# Libraries a GPU machine with a CUDA torch has in newer versions: not carried. NCCL comes from
# torch's wheel (nvidia/nccl/lib); an older libstdc++ or libgcc_s first on LD_LIBRARY_PATH would
# break the machine's own Python extensions.
is_machine_library() {
  case "$1" in
    libnccl.so*|libstdc++.so*|libgcc_s.so*) return 0 ;;
  esac
  return 1
}

require_build() {
  [[ -d "$BUILD_DIR" ]] || die "build folder '$BUILD_DIR' does not exist: give --build DIR (or --from DIR with a bundle)"
  [[ -n "$(build_elves | head -1)" ]] ||
    die "build folder '$BUILD_DIR' has no binaries (tests/*_test, tools/offload-bench): build it first, or give --build DIR"
}

# "BINARY: name => path" lines of every binary of the build.
ldd_report() {
  local bin
  while read -r bin; do
    LC_ALL=C ldd "$bin" 2>&1 | sed "s|^|$bin: |"
  done < <(build_elves)
}

missing_libraries() {
  ldd_report | awk '
    /=> not found/ { sub(/^[^:]*: */, ""); print $1 " (not found)"; next }
    /version .* not found/ { sub(/^[^:]*: *[^:]*: */, ""); print; next }' | sort -u
}

cache_value() {  # cache_value NAME: a variable of the build's CMakeCache.txt
  sed -n "s/^$1:[A-Z]*=//p" "$BUILD_DIR/CMakeCache.txt" 2>/dev/null | head -1
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

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
  echo "gpu-check: run 'tools/gpu-check.sh --bundle DIR' on the build machine and pass --from DIR here"
  exit 1
fi

if [[ "$MODE" == bundle ]]; then
  # shellcheck source=gpu-check/bundle.sh
  source "$script_dir/gpu-check/bundle.sh"
  make_bundle
fi

# ---- a GPU, or a clear no ---------------------------------------------------------------------

command -v nvidia-smi >/dev/null 2>&1 ||
  die "no GPU: nvidia-smi is not installed (no NVIDIA driver on this machine); gpu-check needs a machine with an NVIDIA GPU" "$NO_GPU_EXIT"
gpu_list="$(nvidia-smi -L 2>&1)"
smi_rc=$?
if [[ $smi_rc -ne 0 ]] || ! grep -q '^GPU [0-9]' <<<"$gpu_list"; then
  die "no GPU: 'nvidia-smi -L' lists no device (exit $smi_rc: $(head -1 <<<"$gpu_list"))" "$NO_GPU_EXIT"
fi

FROM_TARBALL="$FROM_DIR"
[[ -d "$FROM_DIR" ]] && FROM_TARBALL="$FROM_DIR/$BUNDLE_NAME"
[[ -z "$FROM_DIR" || -f "$FROM_TARBALL" ]] ||
  die "--from: no bundle at $FROM_TARBALL: make it with 'tools/gpu-check.sh --bundle DIR' on the build machine and name DIR in the device tool's carry"

mkdir -p "$OUT_DIR" || die "cannot create the output folder '$OUT_DIR'"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
for f in "${OUTPUT_FILES[@]}"; do rm -f "$OUT_DIR/$f"; done
WORK="$(mktemp -d)" || die "cannot create a temporary folder"
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT_DIR/gpu-check.log"
RESULTS="$WORK/results.tsv"
SETUP_NOTES="$WORK/setup.txt"
: > "$LOG"
: > "$RESULTS"
: > "$SETUP_NOTES"
log() { echo "$*" >> "$LOG"; }
say() { echo "gpu-check: $*"; log "== $*"; }
note() { echo "gpu-check: $*"; echo "$*" >> "$SETUP_NOTES"; log "== $*"; }

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
START=$SECONDS

# shellcheck source=gpu-check/run.sh
source "$script_dir/gpu-check/run.sh"
# shellcheck source=gpu-check/report.sh
source "$script_dir/gpu-check/report.sh"
