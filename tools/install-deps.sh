#!/usr/bin/env bash
# Installs the Debian packages strata builds with, if any are missing. Idempotent: when all are
# present it only checks and returns. Uses sudo only when not already root.
set -euo pipefail

# python3-dev, pybind11-dev: the Python module; python3-pytest, python3-numpy, python3-torch: its
# tests and the PyTorch example trainer (CPU torch; the same scripts run on CUDA elsewhere).
# python3-venv, python3-pip, python3-setuptools, python3-wheel: `pip install --no-build-isolation
# .` in a venv (pyproject.toml) and its test, python.pip_install. nlohmann-json3-dev: the JSON the
# tools, the examples and the store's Chrome trace write (docs/architecture.md, "Libraries").
packages=(g++ make cmake ninja-build pkg-config python3
          liburing-dev libtbb-dev libabsl-dev catch2 libxxhash-dev libgloo-dev nlohmann-json3-dev
          python3-dev pybind11-dev python3-pytest python3-numpy python3-torch
          python3-venv python3-pip python3-setuptools python3-wheel)

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "strata: not a Debian-based system; make sure these (or your distribution's equivalents)" \
       "are installed: ${packages[*]}" >&2
  exit 0
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "strata: installing missing Debian packages: ${missing[*]}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "strata: need root to install ${missing[*]}; run as root or install sudo" >&2
    exit 1
  fi
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
