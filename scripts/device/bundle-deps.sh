#!/usr/bin/env bash
# Unpacks the Debian runtime + -dev packages the build needs into .device-deps/ (ignored by
# git) so that `run --carry .device-deps` takes them to the accelerator machine, which has
# torch and CUDA but no package registry (shared/DEVICE.md). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.device-deps
packages=(
  libopencv-core406 libopencv-core-dev libopencv-imgproc406 libopencv-imgproc-dev
  libtbb12 libtbbmalloc2 libtbb-dev libblas3 liblapack3 libgfortran5 libglx0 libglvnd0
  libturbojpeg0 libturbojpeg0-dev libpng16-16 libpng-dev
  libyaml-cpp0.7 libyaml-cpp-dev libspdlog1.10 libspdlog-dev libfmt9 libfmt-dev
  libcli11-dev libgtest-dev
  libonnx1 libonnx-dev libprotobuf32 libprotobuf-dev libprotoc32 protobuf-compiler
  libgloo-dev
)
if [[ -f $dest/.complete && "$(cat $dest/.complete)" == "${packages[*]}" ]]; then
  echo "bundle-deps: $dest is complete ($(du -sh $dest | cut -f1))"
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest/debs"
(cd "$dest/debs" && apt-get download "${packages[@]}")
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest"; done
rm -rf "$dest/debs" "$dest/usr/share/doc" "$dest/usr/share/man"
# Static libraries other than GoogleTest's are not linked and would blow the carry limit.
find "$dest" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' -delete
# What Debian's alternatives would link: OpenCV needs libblas.so.3 and liblapack.so.3.
lib="$dest/usr/lib/x86_64-linux-gnu"
ln -sf blas/libblas.so.3 "$lib/libblas.so.3"
ln -sf lapack/liblapack.so.3 "$lib/liblapack.so.3"
echo "${packages[*]}" > "$dest/.complete"  # a changed list unpacks again
echo "bundle-deps: $dest ready ($(du -sh $dest | cut -f1))"
