# shellcheck shell=bash
# Sourced by tools/gpu-check.sh (--bundle): the build machine's half. Builds the module for the
# GPU machine's Python, copies the libraries, writes the tarball and checks it against the device
# tool's limits.
# ---- --bundle: everything a GPU machine without -dev packages needs ------------------------

# An interpreter of Python X.Y here: pyenv's (it has the headers), else pythonX.Y on PATH.
find_python_version() {
  local version="$1" prefix py
  if command -v pyenv >/dev/null 2>&1; then
    prefix="$(pyenv prefix "$version" 2>/dev/null ||
              pyenv prefix "$(pyenv versions --bare 2>/dev/null | grep -E "^${version//./\\.}\.[0-9]+$" | tail -1)" 2>/dev/null)"
    py="${prefix%%:*}/bin/python$version"
    [[ -n "$prefix" && -x "$py" ]] && { echo "$py"; return 0; }
  fi
  command -v "python$version" 2>/dev/null
}

module_tag() {  # module_tag 3.12 -> cpython-312
  echo "cpython-${1//./}"
}

make_bundle() {
  local top dir rel tarball stage base parent py main_tag="" tag modules="" m
  require_build
  command -v ldd >/dev/null || die "ldd is missing; it is needed to list the libraries"
  top="$(git -C "$SOURCE_DIR" rev-parse --show-toplevel 2>/dev/null)" ||
    die "$SOURCE_DIR is not a git checkout: the device tool sends a checkout's working tree"
  mkdir -p "$BUNDLE_DIR" || die "cannot create '$BUNDLE_DIR'"
  dir="$(cd "$BUNDLE_DIR" && pwd -P)"
  top="$(cd "$top" && pwd -P)"
  case "$dir/" in
    "$top"/*) rel="${dir#"$top"/}" ;;
    *) die "--bundle $BUNDLE_DIR is outside the checkout $top: only the checkout's files travel to the GPU machine; give a git-ignored folder inside it (e.g. out/gpu-bundle)" ;;
  esac
  [[ -n "$rel" ]] || die "--bundle needs a folder inside the checkout, not the checkout itself"
  git -C "$top" check-ignore -q "$rel/" ||
    die "--bundle $rel is not ignored by git: give a folder that .gitignore ignores (e.g. out/gpu-bundle) or list it in .git/info/exclude, so that it travels only as a carried path"
  BUILD_DIR="$(cd "$BUILD_DIR" && pwd -P)"

  # The Python module for the GPU machine's interpreter, next to the build's own.
  # The build's own module: the first (and before --bundle, only) _strata.cpython-3XY-*.so.
  for m in "$BUILD_DIR"/python/strata/_strata.cpython-*.so; do
    [[ -f "$m" ]] || continue
    main_tag="$(basename "$m" | sed -n 's/^_strata\.\(cpython-[0-9]*\).*/\1/p')"
    break
  done
  if [[ $NO_BUILD -eq 0 ]]; then
    local cmake_args=()
    if [[ "$FOR_PYTHON" != none && "$(module_tag "$FOR_PYTHON")" != "$main_tag" ]]; then
      py="$(find_python_version "$FOR_PYTHON")" ||
        die "no Python $FOR_PYTHON here to build the module for the GPU machine's interpreter: install it (pyenv install $FOR_PYTHON; its headers come with it), or give --for-python none to carry only the build's own module"
      cmake_args=("-DSTRATA_EXTRA_PYTHONS=$py")
      echo "gpu-check: configuring $BUILD_DIR with STRATA_EXTRA_PYTHONS=$py"
    fi
    if [[ ${#cmake_args[@]} -gt 0 ]]; then
      cmake -S "$(cache_value CMAKE_HOME_DIRECTORY)" -B "$BUILD_DIR" "${cmake_args[@]}" >/dev/null ||
        die "configuring $BUILD_DIR failed (run the cmake line above by hand to see why)" 1
    fi
    echo "gpu-check: building $BUILD_DIR"
    cmake --build "$BUILD_DIR" -j "$(nproc)" || die "the build of $BUILD_DIR failed" 1
  fi
  for m in "$BUILD_DIR"/python/strata/_strata.*.so; do
    [[ -f "$m" ]] && modules+="$(basename "$m") "
  done
  if [[ "$FOR_PYTHON" != none ]]; then
    tag="$(module_tag "$FOR_PYTHON")"
    if [[ " $modules" != *" _strata.$tag-"* ]]; then
      [[ $NO_BUILD -eq 1 ]] || die "the build has no Python module for Python $FOR_PYTHON (_strata.$tag-*.so)" 1
      echo "gpu-check: warning: the build has no Python module for Python $FOR_PYTHON (_strata.$tag-*.so): the Python checks will fail there" >&2
    fi
  fi

  stage="$(mktemp -d)" || die "cannot create a temporary folder"
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/strata-bundle/lib"
  : > "$stage/strata-bundle/libs.txt"
  local copied=0 name path
  while read -r name path; do
    is_system_library "$name" && continue
    if is_machine_library "$name"; then
      echo "# left out (the GPU machine's): $name $path" >> "$stage/strata-bundle/libs.txt"
      continue
    fi
    cp -L "$path" "$stage/strata-bundle/lib/$name" || die "cannot copy $path into the bundle"
    echo "$name $path" >> "$stage/strata-bundle/libs.txt"
    copied=$((copied + 1))
  done < <(ldd_report | awk '$3 == "=>" && $4 ~ /^\// { print $2, $4 }' | sort -u)

  # The paths the build was made at: CTest's files hold them (absolute), so the GPU machine puts
  # the build and the sources there again (--from).
  {
    echo "format=1"
    echo "source_dir=$(src="$(cache_value CMAKE_HOME_DIRECTORY)"; echo "${src:-$top}")"
    echo "build_dir=$BUILD_DIR"
    echo "commit=$(git -C "$top" rev-parse HEAD 2>/dev/null)$(git -C "$top" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "cmake=$(cache_value CMAKE_COMMAND)"
    echo "python=$(cache_value STRATA_PYTHON_EXECUTABLE)"
    echo "modules=$modules"
  } > "$stage/strata-bundle/bundle.txt"

  tarball="$dir/$BUNDLE_NAME"
  rm -f "$tarball" "$tarball.tmp"
  parent="$(dirname "$BUILD_DIR")"
  base="$(basename "$BUILD_DIR")"
  local excludes=(--exclude='*.o' --exclude='*.a' --exclude=CMakeFiles --exclude=.ninja_deps
                  --exclude=.ninja_log --exclude=Testing)
  case "$dir/" in "$BUILD_DIR"/*) excludes+=(--exclude="$base/${dir#"$BUILD_DIR"/}") ;; esac
  # The build's own folder name becomes build/ in the archive (member names only, not the
  # targets of symbolic links).
  local base_re
  base_re="$(printf '%s' "$base" | sed 's/[][\.*^$|]/\\&/g')"
  # A file that a running test changes or removes meanwhile is no error (tar's exit 1).
  tar -cf "$tarball.tmp" -C "$parent" "${excludes[@]}" --ignore-failed-read \
      --warning=no-file-changed --warning=no-file-removed \
      --transform "s|^$base_re/|build/|S" --transform "s|^$base_re\$|build|S" "$base"
  [[ $? -le 1 ]] || die "cannot archive $BUILD_DIR into $tarball.tmp" 1
  if ! { tar -rf "$tarball.tmp" -C "$stage" strata-bundle && gzip -6 < "$tarball.tmp" > "$tarball"; }; then
    die "cannot write $tarball" 1
  fi
  rm -f "$tarball.tmp"

  # Against the device tool's limit: this folder and the working tree travel together.
  local bundle_bytes tree_bytes total limit
  bundle_bytes="$(du -sb "$dir" | cut -f1)"
  tree_bytes="$(cd "$top" && git ls-files -z --cached --others --exclude-standard |
                du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)"
  total=$((bundle_bytes + ${tree_bytes:-0}))
  limit=$((MAX_CARRY_MIB * 1048576))
  echo "gpu-check: $rel/$BUNDLE_NAME: $(mib "$bundle_bytes") MiB ($base without objects," \
       "$copied libraries, modules: ${modules:-none}); with the working tree ($(mib "${tree_bytes:-0}") MiB)" \
       "$(mib "$total") of the ${MAX_CARRY_MIB} MiB that travel"
  if [[ $total -gt $limit ]]; then
    die "the bundle ($(mib "$bundle_bytes") MiB in $rel) and the working tree ($(mib "${tree_bytes:-0}") MiB) are $(mib "$total") MiB, over the device tool's ${MAX_CARRY_MIB} MiB: remove other files from $rel, what is large in the build (tar tvzf $rel/$BUNDLE_NAME | sort -k3 -n | tail) or untracked files of the checkout (git status)" 1
  fi
  local command="bash tools/gpu-check.sh --from $rel"
  [[ ${#command} -le 2000 ]] || die "the command line would be over the device tool's 2,000 characters" 1
  echo "gpu-check: on the GPU machine, the device tool's call (ends within $((DEADLINE / 60))m$((DEADLINE % 60))s):"
  echo "  run(command=\"$command\", carry=[\"$rel\"], timeout_s=420)"
  local missing
  missing="$(missing_libraries)"
  if [[ -n "$missing" ]]; then
    echo "gpu-check: the build cannot load these here either:" >&2
    echo "${missing//$'\n'/$'\n'  }" | sed '1s/^/  /' >&2
    exit 1
  fi
  exit 0
}
