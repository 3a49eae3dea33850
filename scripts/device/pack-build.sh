#!/usr/bin/env bash
# Packs this machine's LibTorch 2.x build (build-cuda: the PyPI torch wheel, the same version as
# the accelerator machine's) for `run --carry .device-bin.tar.gz`: stripped binaries and the
# libraries they need beyond glibc, LibTorch and CUDA, which the machine has, in .device-bin and
# gzipped (68 MB of files, 26 MB packed: a carry holds 64 MiB in all). Building there instead
# takes minutes of its 15 (about 4000 CPU-seconds of compiling). scripts/device/check.sh unpacks
# and runs them.
#   bash scripts/device/pack-build.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
dest=.device-bin
bash scripts/device/bundle-deps.sh  # Debian's reference BLAS and LAPACK, below
ninja -C "$build" trainer headroom_tests bench_memory bench_augment bench_train bench_checkpoint
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/libstdcxx"
for b in trainer tests/headroom_tests bench_memory bench_augment bench_train bench_checkpoint; do strip --strip-debug -o "$dest/bin/$(basename $b)" "$build/$b"; done
ldd "$dest"/bin/* | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case $lib in */torch/lib/*|*/nvidia/*|/usr/local/cuda*) continue ;; esac
  case $(basename "$lib") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*|ld-linux*|libgcc_s.so*) continue ;;
    libstdc++.so*) cp -L "$lib" "$dest/libstdcxx/" ;;  # used there only if the machine's is older
    # OpenCV links BLAS and LAPACK, which Debian's alternatives resolve to OpenBLAS (36 MB): the
    # reference libraries (8 MB) do, since nothing here calls them on a hot path.
    libopenblas.so*) ;;
    libblas.so.3) cp -L .device-deps/usr/lib/x86_64-linux-gnu/blas/libblas.so.3 "$dest/lib/" ;;
    liblapack.so.3) cp -L .device-deps/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3 "$dest/lib/" ;;
    *) cp -L "$lib" "$dest/lib/" ;;
  esac
done
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- src include bench tests || echo '+changes')" > "$dest/commit"
pwd > "$dest/source_dir"  # HEADROOM_SOURCE_DIR in the binaries: check.sh links it to its checkout
"$build/venv/bin/python" -W ignore -c 'import torch; print(torch.__version__, torch.version.cuda)' > "$dest/torch" 2>/dev/null ||
  rm -f "$dest/torch"  # check.sh compares it with the machine's where it is known
tar czf "$dest.tar.gz" "$dest"
echo "pack-build: $dest.tar.gz from $build ($(du -sh "$dest" | cut -f1), packed $(du -sh "$dest.tar.gz" | cut -f1), $(ls "$dest/lib" | wc -l) libraries)"
