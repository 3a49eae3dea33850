#!/usr/bin/env bash
# The one script for the accelerator machine (shared/DEVICE.md): build against the machine's
# torch with the carried libraries, run the whole suite, the benchmarks, and print a table.
# Everything lands under $OUT. It also runs here, on the CPU:
#   PYTHON=build-cuda/venv/bin/python OUT=/tmp/out bash scripts/device/check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/headroom-device-out}
PYTHON=${PYTHON:-python3}
BUILD=${BUILD:-build-device}
mkdir -p "$OUT"
t0=$(date +%s)
status() { printf '%-28s %s\n' "$1" "$2" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

torch_dir=$("$PYTHON" -W ignore -c 'import os, torch; print(os.path.dirname(torch.__file__))') || { status torch "not importable with $PYTHON"; exit 1; }
prefix="$torch_dir/share/cmake;$torch_dir"
if [[ -d .device-deps/usr ]]; then
  deps=$PWD/.device-deps/usr
  prefix="$prefix;$deps"
  export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no nvidia-smi") > "$OUT/gpu.txt" 2>&1
status gpu "$(tail -n +2 "$OUT/gpu.txt" | head -1)"

if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
     -DCUDAToolkit_ROOT=/usr/local/cuda -DHEADROOM_CUDA_ARCHS=9.0 > "$OUT/configure.log" 2>&1; then
  status configure ok
else
  status configure "FAILED (configure.log)"; tail -30 "$OUT/configure.log"; exit 1
fi
if ninja -C "$BUILD" -j "$(nproc)" > "$OUT/build.log" 2>&1; then
  status build "ok ($(( $(date +%s) - t0 )) s)"
else
  status build "FAILED (build.log)"; grep -m 20 -A 5 'error' "$OUT/build.log"; exit 1
fi
"$BUILD/trainer" version --json > "$OUT/version.json" 2>&1
status version "$(grep -o '"available": [a-z]*' "$OUT/version.json" | head -1)"
ctest --test-dir "$BUILD" -j "$(nproc)" --output-on-failure > "$OUT/ctest.log" 2>&1
status tests "$(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
grep -E '\*\*\*Skipped|Skipped' "$OUT/ctest.log" | head -5 >> "$OUT/summary.txt"
if "$BUILD/bench_loader" --out /tmp/headroom-bench-data --images 256 > "$OUT/bench_loader.jsonl" 2> "$OUT/bench_loader.err"; then
  status bench_loader "$(wc -l < "$OUT/bench_loader.jsonl") lines"
else
  status bench_loader "FAILED (bench_loader.err)"
fi
# augmentation on the GPU against per-image OpenCV on the machine's CPU threads
if "$BUILD/bench_augment" --device cuda > "$OUT/bench_augment.jsonl" 2> "$OUT/bench_augment.err"; then
  status bench_augment "$(wc -l < "$OUT/bench_augment.jsonl") lines"
else
  status bench_augment "FAILED (bench_augment.err)"
fi
# memory: estimator vs measured peak, auto batch vs the true largest batch
if "$BUILD/bench_memory" --device cuda --data /tmp/headroom-bench-memory > "$OUT/bench_memory.jsonl" 2> "$OUT/bench_memory.err"; then
  status bench_memory "$(wc -l < "$OUT/bench_memory.jsonl") lines"
else
  status bench_memory "FAILED (bench_memory.err)"
fi
# The seed user's case under an 8 GiB budget: HG104 at 512 and yolov8s at 640 on synthetic data,
# the estimate table, then a governed run with the automatic batch, AMP and planned checkpointing.
"$BUILD/trainer" data synth --out /tmp/headroom-synth640 --images 600 --size 640 --max-objects 20 > /dev/null 2>&1
for cfg in centernet_hg104 yolov8s; do
  over="data.dataset=/tmp/headroom-synth640/data.yaml device=cuda memory.budget=8GiB"
  timeout 120 "$BUILD/trainer" memory --config configs/$cfg.yaml $over > "$OUT/memory_$cfg.txt" 2>&1
  timeout 240 "$BUILD/trainer" train --config configs/$cfg.yaml $over train.batch=auto train.amp=auto \
    memory.activation_checkpointing=auto train.steps=300 train.val_every=0 train.plots=false \
    project=/tmp/headroom-runs name=$cfg exist_ok=true > "$OUT/train_$cfg.log" 2>&1
  status "governed $cfg" "rc=$? $(grep -o 'train.batch auto: [0-9]*' "$OUT/train_$cfg.log" | head -1); $(grep -c 'memory governor' "$OUT/train_$cfg.log") decisions; $(grep -o 'memory, epoch [0-9]*: peak [^;]*' "$OUT/train_$cfg.log" | tail -1)"
done
status total "$(( $(date +%s) - t0 )) s"
cat "$OUT/bench_loader.jsonl" "$OUT/bench_augment.jsonl" "$OUT/bench_memory.jsonl"
