#!/usr/bin/env bash
# tools/gpu-check.sh without a GPU (docs/gpu-check.md):
#   help         its help, --list-outputs (at most 8 files) and a bad flag
#   no_gpu       its clear refusal (exit 3) when nvidia-smi is missing or lists no device
#   bundle       --bundle of a small fake build in a fake checkout: the tarball (no objects), the
#                libraries (not libstdc++, libgcc_s, libnccl), the device tool's call; and its
#                refusals (a folder git does not ignore, outside the checkout, over 64 MiB)
#   bundle_real  --bundle of this build (not rebuilt): it fits the device tool's 64 MiB
#   run          the GPU machine's side with a fake nvidia-smi, fake binaries and a fake python:
#                --from unpacks the bundle at the path the build was made at, links cmake,
#                every step runs and is recorded, failures do not stop it, at most 8 files;
#                --only compare runs compare.py within its deadline and returns its JSON/SVG
#   deadline     a step that hangs is killed at the deadline and the rest is skipped
#   check_gpu_check.sh SCRIPT BUILD_DIR WORK_DIR MODE
set -euo pipefail
script="$1" build="$2" work="$3" mode="$4"
rm -rf "$work"
mkdir -p "$work"
work="$(cd "$work" && pwd -P)"
fail() { echo "check_gpu_check: $*" >&2; exit 1; }
expect() {  # expect FILE TEXT: FILE holds TEXT (fixed string)
  grep -qF -- "$2" "$1" || fail "$1 does not say '$2':"$'\n'"$(cat "$1")"
}

# A checkout with the script and its halves (git init, out/ ignored) and a fake build made in it: one real ELF
# file of this build (for its libraries), fake Catch2/strata-info/offload-bench scripts, a CTest
# file whose tests run the build machine's cmake and python by absolute paths, and objects.
make_checkout() {  # make_checkout DIR
  local repo="$1" b="$1/build"
  command -v git > /dev/null || { echo "SKIPPED: git is not installed"; exit 77; }
  mkdir -p "$repo/tools" "$repo/tests/python" "$repo/examples/torch_trainer"
  cp "$script" "$repo/tools/gpu-check.sh"
  cp -r "$(dirname "$script")/gpu-check" "$repo/tools/"
  printf '/out/\n/build/\n' > "$repo/.gitignore"
  : > "$repo/examples/torch_trainer/train.py"
  : > "$repo/examples/torch_trainer/activations_compare.py"
  git -C "$repo" init -q
  git -C "$repo" add .
  mkdir -p "$b/tests" "$b/tools" "$b/bin" "$b/python/strata" "$b/CMakeFiles/x.dir" "$b/sub/CMakeFiles"
  cat > "$b/CMakeCache.txt" <<EOF
CMAKE_HOME_DIRECTORY:INTERNAL=$repo
CMAKE_COMMAND:INTERNAL=$work/usr/bin/cmake
STRATA_PYTHON_EXECUTABLE:INTERNAL=$work/usr/bin/python3
EOF
  cp "$build/tools/strata-info" "$b/bin/real-elf"
  : > "$b/python/strata/__init__.py"
  : > "$b/python/strata/_strata.cpython-312-x86_64-linux-gnu.so"
  echo object > "$b/CMakeFiles/x.dir/a.o"
  echo archive > "$b/libx.a"
  echo rules > "$b/sub/CMakeFiles/rules.ninja"
  cat > "$b/tests/fake_test" <<'EOF'
#!/bin/bash
# A fake Catch2 binary (--list-test-names-only): "cuda two" fails.
case "$1" in
  --list-test-names-only) echo "cuda one"; echo "cuda two"; exit 2 ;;
  "[cuda]") echo "cuda two failed"; exit 1 ;;
  "cuda two") echo "cuda two failed"; exit 1 ;;
  *) echo "All tests passed"; exit 0 ;;
esac
EOF
  cat > "$b/tools/strata-info" <<'EOF'
#!/bin/bash
if [[ "${1:-}" == --json ]]; then echo '{"backend": "cuda"}'; else echo "backend: $STRATA_BACKEND"; fi
EOF
  cat > "$b/tools/offload-bench" <<'EOF'
#!/bin/bash
[[ -n "${FAKE_BENCH_HANG:-}" ]] && { echo $$ > "$FAKE_BENCH_HANG"; exec sleep 600; }
for a in "$@"; do [[ "$a" == --json=* ]] && echo '{"rows": [], "fake": true}' > "${a#--json=}"; done
echo "fake bench table $*"
EOF
  cat > "$b/CTestTestfile.cmake" <<EOF
add_test([=[fake.python]=] "$work/usr/bin/python3" "-c" "ctest-ok")
add_test([=[fake.cmake]=] "$work/usr/bin/cmake" "-E" "true")
add_test([=[fake.fail]=] "/bin/false")
add_test([=[fake.install]=] "/bin/false")
set_tests_properties([=[fake.install]=] PROPERTIES LABELS needs_dev_packages)
EOF
  chmod +x "$b/tests/fake_test" "$b/tools/strata-info" "$b/tools/offload-bench"
}

# What the GPU machine has: nvidia-smi listing a GPU, and a Python with torch's NCCL.
make_machine() {
  mkdir -p "$work/bin" "$work/nccl"
  : > "$work/nccl/libnccl.so.2"
  cat > "$work/bin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$1" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)" ;;
  --query-gpu*) echo "580.0" ;;
  *) echo "fake nvidia-smi" ;;
esac
EOF
  cat > "$work/bin/python3" <<EOF
#!/bin/bash
# A fake interpreter with a CUDA torch: pytest fails one test.
case "\$*" in
  -) cat > /dev/null; echo "$work/nccl" ;;
  *"import strata"*) echo "3.12.3 fake" ;;
  *"import torch"*) echo yes ;;
  "-c import pytest") ;;
  "-m pytest"*) echo "FAILED tests/python/test_core.py::test_gpu - AssertionError"
                echo "1 failed, 2 passed in 0.10s"; exit 1 ;;
  "-c ctest-ok") echo ok ;;
  *train.py*|*activations_compare.py*) echo "step 1 loss 1.0" ;;
  *compare.py*) for a in "\$@"; do
                  case "\$a" in
                    --json=*) echo '{"tool": "strata-gpt-compare", "fake": true}' > "\${a#--json=}" ;;
                    --svg=*) echo '<svg xmlns="http://www.w3.org/2000/svg"/>' > "\${a#--svg=}" ;;
                    --summary=*) printf 'phases: smoke 9 s, comparison 120 s\nFAKE TABLE ROW\n' > "\${a#--summary=}" ;;
                  esac
                done
                echo "compare args: \$*"; echo PASS ;;
  *) echo "fake python: \$*" >&2; exit 9 ;;
esac
EOF
  chmod +x "$work/bin/nvidia-smi" "$work/bin/python3"
}

case "$mode" in
  help)
    "$script" --help > "$work/help"
    for word in "--bundle DIR" "--from DIR" "--missing" "--libs DIR" "--deadline S" "--only LIST" \
                "--list-outputs" "--for-python" "[cuda]" "CTest suite" "--workload=train-step" \
                "--workload=optimizer" "gpu-check.json" "at most 8 files" "64 MiB" "3 no GPU"; do
      expect "$work/help" "$word"
    done
    "$script" --list-outputs > "$work/outputs"
    n=$(wc -l < "$work/outputs")
    [[ $n -ge 1 && $n -le 8 ]] || fail "--list-outputs lists $n files; the device tool returns at most 8"
    expect "$work/outputs" summary.txt
    set +e
    "$script" --bogus 2>"$work/err"
    rc=$?
    "$script" --only info,gpu 2>"$work/err_only"
    rc_only=$?
    set -e
    [[ $rc -eq 2 ]] || fail "--bogus exited $rc, not 2"
    expect "$work/err" "unknown argument '--bogus'"
    [[ $rc_only -eq 2 ]] || fail "--only info,gpu exited $rc_only, not 2"
    expect "$work/err_only" "--only: 'gpu' is not a step"
    ;;
  no_gpu)
    # No nvidia-smi at all (an empty PATH: the script uses builtins up to that check).
    mkdir -p "$work/empty"
    set +e
    PATH="$work/empty" /bin/bash "$script" --build "$build" --out "$work/out" 2>"$work/err"
    rc=$?
    set -e
    [[ $rc -eq 3 ]] || fail "without nvidia-smi: exit $rc, not 3: $(cat "$work/err")"
    grep -q "^gpu-check: no GPU: nvidia-smi is not installed" "$work/err" ||
      fail "without nvidia-smi: $(cat "$work/err")"
    # An nvidia-smi that finds no device (a driver without a GPU, a container without one), with
    # --from too: nothing is unpacked.
    mkdir -p "$work/fake"
    printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' > "$work/fake/nvidia-smi"
    chmod +x "$work/fake/nvidia-smi"
    set +e
    PATH="$work/fake:$PATH" "$script" --from "$work/no-bundle" --out "$work/out" 2>"$work/err"
    rc=$?
    set -e
    [[ $rc -eq 3 ]] || fail "with no device: exit $rc, not 3: $(cat "$work/err")"
    grep -q "^gpu-check: no GPU: 'nvidia-smi -L' lists no device (exit 6: No devices were found)" \
      "$work/err" || fail "with no device: $(cat "$work/err")"
    [[ ! -e "$work/out" ]] || fail "wrote $work/out although there is no GPU"
    # A GPU, but no bundle where --from says: refused before anything is written.
    printf '#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)"\n' > "$work/fake/nvidia-smi"
    set +e
    PATH="$work/fake:$PATH" "$script" --from "$work/no-bundle" --out "$work/out" 2>"$work/err"
    rc=$?
    set -e
    [[ $rc -eq 2 ]] || fail "--from without a bundle: exit $rc, not 2: $(cat "$work/err")"
    expect "$work/err" "--from: no bundle at $work/no-bundle: make it with 'tools/gpu-check.sh --bundle DIR'"
    [[ ! -e "$work/out" ]] || fail "wrote $work/out although there is no bundle"
    ;;
  bundle)
    repo="$work/a/repo"
    make_checkout "$repo"
    "$repo/tools/gpu-check.sh" --bundle "$repo/out/gpu-bundle" --build "$repo/build" --no-build \
      > "$work/log" 2>&1 || fail "--bundle failed: $(cat "$work/log")"
    expect "$work/log" 'run(command="bash tools/gpu-check.sh --from out/gpu-bundle", carry=["out/gpu-bundle"], timeout_s=420)'
    tarball="$repo/out/gpu-bundle/strata-gpu-bundle.tar.gz"
    [[ -s "$tarball" ]] || fail "no $tarball"
    [[ $(du -sb "$repo/out/gpu-bundle" | cut -f1) -le $((64 << 20)) ]] || fail "the bundle is over 64 MiB"
    tar -tzf "$tarball" > "$work/members"
    for want in build/bin/real-elf build/tests/fake_test build/CTestTestfile.cmake \
                build/python/strata/_strata.cpython-312-x86_64-linux-gnu.so \
                strata-bundle/bundle.txt strata-bundle/libs.txt; do
      grep -qx -- "$want" "$work/members" || fail "the bundle lacks $want"
    done
    ! grep -E '\.o$|\.a$|CMakeFiles' "$work/members" || fail "the bundle holds objects or CMakeFiles"
    grep -q '^strata-bundle/lib/libabsl_' "$work/members" || fail "the bundle carries no Abseil library"
    ! grep -E '^strata-bundle/lib/(libstdc\+\+|libgcc_s|libnccl|libc\.so|libm\.so|libcuda\.so)' \
      "$work/members" || fail "the bundle carries a library the GPU machine has"
    tar -xzf "$tarball" -O strata-bundle/bundle.txt > "$work/manifest"
    expect "$work/manifest" "source_dir=$repo"
    expect "$work/manifest" "build_dir=$repo/build"
    expect "$work/manifest" "cmake=$work/usr/bin/cmake"
    # Refused: a folder git does not ignore, one outside the checkout, a bundle over the limit.
    set +e
    "$repo/tools/gpu-check.sh" --bundle "$repo/carry" --build "$repo/build" --no-build 2>"$work/err1"
    rc1=$?
    "$repo/tools/gpu-check.sh" --bundle "$work/elsewhere" --build "$repo/build" --no-build 2>"$work/err2"
    rc2=$?
    head -c $((2 << 20)) /dev/zero > "$repo/big.bin"  # travels with the working tree
    GPU_CHECK_MAX_CARRY_MIB=1 "$repo/tools/gpu-check.sh" --bundle "$repo/out/gpu-bundle" \
      --build "$repo/build" --no-build > /dev/null 2>"$work/err3"
    rc3=$?
    set -e
    [[ $rc1 -eq 2 ]] || fail "a folder git does not ignore: exit $rc1, not 2"
    expect "$work/err1" "--bundle carry is not ignored by git"
    [[ $rc2 -eq 2 ]] || fail "a folder outside the checkout: exit $rc2, not 2"
    expect "$work/err2" "is outside the checkout"
    [[ $rc3 -eq 1 ]] || fail "over the limit: exit $rc3, not 1"
    expect "$work/err3" "and the working tree (2.0 MiB) are"
    expect "$work/err3" "over the device tool's 1 MiB"
    ;;
  bundle_real)
    # This build as it is, its bundle in a folder of the build (ignored when the build is).
    src="$(cd "$(dirname "$script")/.." && pwd -P)"
    if ! git -C "$src" check-ignore -q "$build/" 2>/dev/null; then
      echo "SKIPPED: $build is not a git-ignored folder of a checkout"
      exit 77
    fi
    set +e
    "$script" --bundle "$work/bundle" --build "$build" --no-build --for-python none > "$work/log" 2>&1
    rc=$?
    set -e
    size=$(du -sb "$work/bundle" 2>/dev/null | cut -f1)
    rm -rf "$work/bundle"  # not carried into the next bundle of this build
    [[ $rc -eq 0 ]] || fail "--bundle of $build: exit $rc: $(cat "$work/log")"
    expect "$work/log" "of the 64 MiB that travel"
    [[ $size -le $((64 << 20)) ]] || fail "the bundle of $build is $size bytes, over 64 MiB"
    ;;
  run)
    # The build machine: a checkout at a/repo with its build and bundle.
    make_checkout "$work/a/repo"
    make_machine
    "$work/a/repo/tools/gpu-check.sh" --bundle "$work/a/repo/out/gpu-bundle" \
      --build "$work/a/repo/build" --no-build > "$work/bundle.log" 2>&1 ||
      fail "--bundle failed: $(cat "$work/bundle.log")"
    # The GPU machine: the working tree and the carried bundle at b/repo; nothing at a/.
    mkdir -p "$work/b/repo"
    (cd "$work/a/repo" && cp -r .gitignore tools tests examples out "$work/b/repo/")
    rm -rf "$work/a"
    set +e
    (cd "$work/b/repo" && PATH="$work/bin:$PATH" OUT="$work/out" \
       bash tools/gpu-check.sh --from out/gpu-bundle --python "$work/bin/python3") > "$work/run.log" 2>&1
    rc=$?
    set -e
    [[ $rc -eq 1 ]] || fail "with failing checks: exit $rc, not 1: $(cat "$work/run.log")"
    [[ "$work/a/repo" -ef "$work/b/repo" ]] || fail "a/repo is not linked to the checkout b/repo"
    [[ -x "$work/a/repo/build/tests/fake_test" ]] || fail "the build is not at its old path"
    [[ -L "$work/usr/bin/cmake" ]] || fail "the build's cmake ($work/usr/bin/cmake) is not linked"
    n=$(find "$work/out" -type f | wc -l)
    [[ $n -le 8 ]] || fail "$n files under \$OUT; the device tool returns at most 8"
    while IFS= read -r f; do
      grep -qx -- "$(basename "$f")" <("$script" --list-outputs) || fail "wrote $f, not in --list-outputs"
    done < <(find "$work/out" -type f)
    s="$work/out/summary.txt"
    expect "$work/run.log" "gpu-check summary: GPU 0: NVIDIA H100 80GB HBM3"
    expect "$s" "setup: linked $work/a/repo -> $work/b/repo"
    expect "$s" "setup: NCCL: torch's, $work/nccl/libnccl.so.2"
    expect "$s" "setup: CTest's Python: $work/bin/python3"
    grep -qE '^passed +setup .*unpack strata-gpu-bundle.tar.gz' "$s" || fail "no unpack line: $(cat "$s")"
    grep -qE '^passed +info .*strata-info: backend: cuda' "$s" || fail "strata-info: $(cat "$s")"
    grep -qE '^failed +cuda .*fake_test \[cuda\]' "$s" || fail "[cuda]: $(cat "$s")"
    grep -qE '^passed +cuda-case +1 of the \[cuda\] cases run one by one' "$s" || fail "cuda one: $(cat "$s")"
    grep -qE '^failed +cuda-case .*fake_test: cuda two' "$s" || fail "cuda two: $(cat "$s")"
    grep -qE '^failed +python .*pytest' "$s" || fail "pytest: $(cat "$s")"
    grep -qE '^passed +bench .*offload-bench optimizer' "$s" || fail "bench: $(cat "$s")"
    grep -qE '^failed +ctest .*CTest suite' "$s" || fail "ctest: $(cat "$s")"
    grep -qE '^passed +example .*activations_compare' "$s" || fail "examples: $(cat "$s")"
    expect "$s" "ctest: 3 run of 3, 2 passed, 1 failed, 0 skipped"
    expect "$s" "  fake.fail ***Failed"
    # Nothing written into the checkout but the build it unpacked.
    top="$(cd "$work/b/repo" && find . -mindepth 1 -maxdepth 1 | sort | tr '\n' ' ')"
    [[ "$top" == "./.gitignore ./build ./examples ./out ./tests ./tools " ]] ||
      fail "the run wrote into the checkout: $top"
    expect "$s" "pytest: 1 failed, 2 passed"
    expect "$s" "FAILED tests/python/test_core.py::test_gpu"
    expect "$work/out/bench.txt" "fake bench table --workload=train-step"
    expect "$work/out/gpu-check.json" '"offload_bench_optimizer": {"rows": [], "fake": true}'
    if command -v python3 > /dev/null; then
      python3 -m json.tool "$work/out/gpu-check.json" > /dev/null || fail "gpu-check.json is not JSON"
    fi
    grep -qE '^[a-z]+ +compare ' "$s" && fail "the default steps ran compare: $(cat "$s")"
    # The compare step runs only when --only names it, with its own deadline inside the step's
    # limit; its JSON and SVG come back with the rest (still at most 8 files).
    (cd "$work/b/repo" && PATH="$work/bin:$PATH" OUT="$work/out2" \
       bash tools/gpu-check.sh --build "$work/a/repo/build" --python "$work/bin/python3" \
       --only compare) > "$work/run2.log" 2>&1 || fail "--only compare: $(cat "$work/run2.log")"
    s="$work/out2/summary.txt"
    grep -qE '^passed +compare .*GPT compare: PASS' "$s" || fail "compare: $(cat "$s")"
    grep -qE 'compare args: .*compare.py --device=cuda --deadline-s=(2[0-9][0-9]) ' \
      "$work/out2/gpu-check.log" || fail "compare's arguments: $(cat "$work/out2/gpu-check.log")"
    [[ -s "$work/out2/compare.json" && -s "$work/out2/compare.svg" ]] || fail "no compare.json/svg"
    # compare.py's summary (the table, the phases' times) travels in summary.txt.
    grep -q '^---- GPT compare' "$s" && grep -q '^phases: smoke 9 s' "$s" &&
      grep -q '^FAKE TABLE ROW' "$s" || fail "compare's summary not in summary.txt: $(cat "$s")"
    expect "$work/out2/gpu-check.json" '"gpt_compare": {"tool": "strata-gpt-compare", "fake": true}'
    n=$(find "$work/out2" -type f | wc -l)
    [[ $n -le 8 ]] || fail "$n files under \$OUT with compare; the device tool returns at most 8"
    ;;
  deadline)
    make_checkout "$work/a/repo"
    make_machine
    set +e
    PATH="$work/bin:$PATH" FAKE_BENCH_HANG="$work/bench.pid" "$work/a/repo/tools/gpu-check.sh" \
      --build "$work/a/repo/build" --python "$work/bin/python3" --out "$work/out" \
      --only info,bench,ctest --deadline 14 > "$work/run.log" 2>&1
    rc=$?
    set -e
    [[ $rc -eq 1 ]] || fail "a step timed out: exit $rc, not 1: $(cat "$work/run.log")"
    s="$work/out/summary.txt"
    grep -qE '^failed +bench .*offload-bench paths: timed out after [0-9]+s' "$s" ||
      fail "the hanging bench: $(cat "$s")"
    grep -qE '^skipped +ctest .*no time left before the 14s deadline' "$s" || fail "ctest: $(cat "$s")"
    ! kill -0 "$(cat "$work/bench.pid")" 2>/dev/null || fail "the hanging bench outlived gpu-check"
    ;;
  *) fail "unknown mode $mode" ;;
esac
rm -rf "$work"  # kept when a check fails; else it would travel in the next bundle of this build
echo "gpu-check $mode ok"
