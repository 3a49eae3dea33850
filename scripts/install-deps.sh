#!/usr/bin/env bash
# Installs the Debian packages Headroom builds with, only those missing. Idempotent; uses sudo
# when not root. `--cuda` adds what the LibTorch 2.x (PyPI wheel) build needs on top.
# third_party/README.md says what each package is for.
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev
  libturbojpeg0-dev libpng-dev
  libopencv-core-dev libopencv-imgproc-dev
  libopenblas0-pthread
  libonnx-dev libprotobuf-dev protobuf-compiler
)
if [[ "${1:-}" == "--cuda" ]]; then
  packages+=(python3 python3-venv python3-pip)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
