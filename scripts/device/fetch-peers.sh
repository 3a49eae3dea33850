#!/usr/bin/env bash
# Prepares .peers/ (ignored; carried to the accelerator machine with `run --carry .peers`) for
# scripts/device/peers.py: Ultralytics' wheels (the machine has no package registry) and
# large_hourglass.py from a copy of xingyizhou/CenterNet, whose git folder is the argument (the
# session's `fetch github:xingyizhou/CenterNet` gives it). The peers' code stays out of the project.
#   bash scripts/device/fetch-peers.sh /work/.mirror/xingyizhou+CenterNet/repo
set -euo pipefail
cd "$(dirname "$0")/../.."
centernet_git=${1:?the git folder of a copy of xingyizhou/CenterNet}
PIP=${PIP:-build-cuda/venv/bin/pip}
mkdir -p .peers/wheels .peers/centernet
# Ultralytics and what it imports that the machine's Python (3.12: torch, torchvision, OpenCV,
# numpy, matplotlib, scipy, psutil) may lack; polars is stubbed by peers.py.
"$PIP" download --quiet --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .peers/wheels \
  ultralytics==8.4.190 ultralytics-thop pyyaml requests urllib3 idna certifi charset_normalizer
git --git-dir "$centernet_git" show HEAD:src/lib/models/networks/large_hourglass.py > .peers/centernet/large_hourglass.py
echo "fetch-peers: $(ls .peers/wheels | tr '\n' ' ')and large_hourglass.py ($(git --git-dir "$centernet_git" rev-parse --short HEAD))"
