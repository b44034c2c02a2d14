#!/usr/bin/env bash
# tools/gpu-check.sh without a GPU: its help, its clear refusal (exit 3) when nvidia-smi is
# missing or lists no device, and --bundle / --missing on this build.
#   check_gpu_check.sh SCRIPT BUILD_DIR WORK_DIR MODE     MODE: help | no_gpu | bundle
set -euo pipefail
script="$1" build="$2" work="$3" mode="$4"
rm -rf "$work"
mkdir -p "$work"
fail() { echo "check_gpu_check: $*" >&2; exit 1; }

case "$mode" in
  help)
    out="$("$script" --help)"
    for word in "--bundle DIR" "--missing" "--libs DIR" "[cuda]" "--workload=train-step" \
                "--workload=optimizer" "gpu-check.json" "3 no GPU"; do
      grep -qF -- "$word" <<<"$out" || fail "--help does not mention '$word'"
    done
    set +e
    "$script" --bogus 2>"$work/err"
    rc=$?
    set -e
    [[ $rc -eq 2 ]] || fail "--bogus exited $rc, not 2"
    grep -q "unknown argument '--bogus'" "$work/err" || fail "--bogus: $(cat "$work/err")"
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
    # An nvidia-smi that finds no device (a driver without a GPU, a container without one).
    mkdir -p "$work/fake"
    printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' > "$work/fake/nvidia-smi"
    chmod +x "$work/fake/nvidia-smi"
    set +e
    PATH="$work/fake:$PATH" "$script" --build "$build" --out "$work/out" 2>"$work/err"
    rc=$?
    set -e
    [[ $rc -eq 3 ]] || fail "with no device: exit $rc, not 3: $(cat "$work/err")"
    grep -q "^gpu-check: no GPU: 'nvidia-smi -L' lists no device (exit 6: No devices were found)" \
      "$work/err" || fail "with no device: $(cat "$work/err")"
    [[ ! -e "$work/out" ]] || fail "wrote $work/out although there is no GPU"
    ;;
  bundle)
    "$script" --bundle "$work/bundle" --build "$build" > "$work/log"
    grep -q "^libabsl_" "$work/bundle/libs.txt" || fail "libs.txt lists no Abseil library"
    ! grep -qE "^(libc|libm|libpthread|ld-linux|libcuda)\.so" "$work/bundle/libs.txt" ||
      fail "libs.txt lists a glibc or driver library: $(cat "$work/bundle/libs.txt")"
    while read -r name _; do
      [[ -s "$work/bundle/lib/$name" ]] || fail "$name is listed but not copied"
    done < "$work/bundle/libs.txt"
    "$script" --missing --build "$build" --libs "$work/bundle" > "$work/missing"
    grep -q "every library the build needs is found" "$work/missing" || fail "$(cat "$work/missing")"
    ;;
  *) fail "unknown mode $mode" ;;
esac
echo "gpu-check $mode ok"
