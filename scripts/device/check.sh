#!/usr/bin/env bash
# The one script for the accelerator machine (shared/DEVICE.md). With .device-bin.tar.gz
# (scripts/device/pack-build.sh: binaries built here against the same torch wheel) it runs them;
# without, it first builds against the machine's torch with the carried .device-deps
# (scripts/device/bundle-deps.sh), which costs minutes. Then, each under its own time limit so
# that one stage cannot eat the others': the GPU tests, the step's speed with and without each GPU
# default (bench_train), the peers beside Headroom (peers.py; carry .peers from fetch-peers.sh),
# the epoch boundaries' idle time, the 8 GiB Hourglass-104 proof, the
# estimator on Hourglass-104 at 512, the TF OD API user's pipeline, a --nproc larger than the GPU
# count, bench_augment and the rest of the suite in shards (asked for by name: the demo in each
# precision, named tests, YOLO26n against YOLOv8n at 300 epochs). $OUT gets three files (a call
# brings back at most 8): summary.txt (a short table), stages.log (each stage's output) and
# results.tar.gz (the JSON lines and samples, refreshed before each stage, so a cut call keeps them).
# The stages run in this file's order, which is their priority. All of them take more than one
# call: the lease's 15 minutes hold the machine's start (a minute or two), one full call
# (DEADLINE=540, timeout_s 600, kind nvidia-h200 named: the issues' figures are the H200's) with
# STAGES="gpu speed peers estimate" (about 450 s: SPEED_VARIANTS=";train.cuda_graphs=off" there),
# and a second one, sent at once (a machine waits 30 s after a call), sized to what status says
# is left: STAGES="hg104 boundary" DEADLINE=<budget_left_s - 60> (HG_PREFERS and BOUNDARY_ASYNC
# choose within them, e.g. HG_PREFERS=batch BOUNDARY_ASYNC=true when under 250 s are left).
# It also runs here, on the CPU, to check its logic (tiny steps, GPU parts skipped):
#   PYTHON=build-cuda/venv/bin/python OUT=/tmp/out QUICK=1 bash scripts/device/check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/headroom-device-out}
PYTHON=${PYTHON:-python3}
QUICK=${QUICK:-0}
RES=/tmp/headroom-device-results  # everything but the table and the log, packed into $OUT/results.tar.gz
rm -rf "$RES" && mkdir -p "$OUT" "$RES"
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
STAGES=" ${STAGES:-gpu speed peers boundary hg104 estimate pipeline nproc augment suite} "  # which of the stages below, e.g. STAGES="gpu demo tests"
want() { [[ $STAGES == *" $1 "* ]]; }
DEADLINE=${DEADLINE:-540}  # seconds: the run's 600 less the transfers
lim() {  # a stage's limit: at most $1 seconds, at least 1 (timeout 0 would mean none)
  local left=$(( DEADLINE - $(elapsed) ))
  (( left < 1 )) && left=1
  (( left < $1 )) && echo $left || echo $1
}
status() { printf '%-24s %s\n' "$1" "$2" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
log=$OUT/stages.log  # every stage's output, in order (at most 8 files come back)
: > "$log"
pack() { tar czf "$OUT/results.tar.gz.part" -C "$RES" . && mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"; }
stage() { pack; echo "=== $1 ($(elapsed) s)" >> "$log"; }
# the lines of a training log that say what happened, into the stages log
keep_lines() { grep -E 'train.batch auto|micro-batch .* img/s|memory governor|memory, epoch|data, epoch|done:|skipped|rror|Average Precision  \(AP\) @\[ IoU=0.50 ' "$1" | cut -c1-600 >> "$log"; }

torch_dir=$("$PYTHON" -W ignore -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null) ||
  { status torch "not importable with $PYTHON"; exit 1; }
site=$(dirname "$torch_dir")
libs="$torch_dir/lib:$(ls -d "$site"/nvidia/*/lib "$site"/nvidia/lib 2>/dev/null | tr '\n' ':')/usr/local/cuda/lib64:/usr/local/cuda/lib"
{ command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"; } > "$RES/gpu.txt" 2>&1
status gpu "$(head -1 "$RES/gpu.txt")"
[[ -f .device-bin.tar.gz ]] && { rm -rf .device-bin; tar xzf .device-bin.tar.gz; }  # the carried pack
# The binaries carry the packing checkout's path (HEADROOM_SOURCE_DIR: models/, the test fixtures).
src_dir=$(cat .device-bin/source_dir 2>/dev/null || strings -n 8 .device-bin/bin/trainer 2>/dev/null | grep -m1 -o '^/[^ ]*/main$' || true)
[[ -n $src_dir && ! -e $src_dir ]] && mkdir -p "$(dirname "$src_dir")" && ln -s "$PWD" "$src_dir"

if [[ -x .device-bin/bin/trainer ]]; then
  B=.device-bin/bin
  export LD_LIBRARY_PATH="$PWD/.device-bin/lib:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! $B/trainer version > /dev/null 2>&1; then  # the machine's libstdc++ may be older than ours
    export LD_LIBRARY_PATH="$PWD/.device-bin/libstdcxx:$LD_LIBRARY_PATH"
  fi
  # ... and the tests the trainer's path in that checkout's build folder
  t_path=$(strings -n 8 .device-bin/bin/headroom_tests | grep -m1 -o '^/[^ ]*/trainer$' || true)
  [[ -n $t_path && ! -e $t_path ]] && mkdir -p "$(dirname "$t_path")" && ln -s "$PWD/.device-bin/bin/trainer" "$t_path"
  # ... and the ONNX tests' oracle (build/onnxruntime/bin/python here) in this machine's Python
  mkdir -p build/onnxruntime/bin && ln -sf "$(command -v "$PYTHON")" build/onnxruntime/bin/python
  status build "carried ($(cat .device-bin/commit))"
  here_torch=$("$PYTHON" -W ignore -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null)
  [[ -f .device-bin/torch && "$(cat .device-bin/torch)" != "$here_torch" ]] &&
    status "  torch differs" "packed against $(cat .device-bin/torch), this machine has $here_torch"
else
  B=build-device
  prefix="$torch_dir/share/cmake;$torch_dir;$PWD/.device-deps/usr"
  export LD_LIBRARY_PATH="$PWD/.device-deps/usr/lib/x86_64-linux-gnu:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if cmake -S . -B $B -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
       -DCUDAToolkit_ROOT=/usr/local/cuda -DHEADROOM_CUDA_ARCHS=9.0 -DHEADROOM_ONNXRUNTIME_PYTHON="$(command -v "$PYTHON")" \
       > "$RES/build.log" 2>&1 &&
     ninja -C $B -j "$(nproc)" trainer headroom_tests bench_memory bench_augment bench_train bench_checkpoint >> "$RES/build.log" 2>&1; then
    mv $B/tests/headroom_tests $B/headroom_tests
    status build "ok ($(elapsed) s)"
  else
    status build "FAILED (build.log)"; grep -m 20 -A 5 'error' "$RES/build.log"; pack; exit 1
  fi
fi
$B/trainer version --json > "$RES/version.json" 2>&1
status version "$(grep -o '"available": [a-z]*' "$RES/version.json" | head -1)"
cuda=$(grep -q '"available": true' "$RES/version.json" && echo 1 || echo 0)
dev=$([[ $cuda == 1 ]] && echo cuda || echo cpu)
if [[ $QUICK == 1 ]]; then n_img=24; size=128; steps=3; hg_size=128; else n_img=600; size=512; steps=210; hg_size=512; fi

# 1. The GPU tests: CUDA against the CPU (augmentation, NMS), the budget and OOM recovery on CUDA,
#    pinned batches, and steps that never sync the host (sync-debug mode set to error).
gpu_tests='Augment.CudaEqualsCpu:Checkpoint.ACudaSnapshotIsQueuedOnTheStreamWithoutAHostSync:Checkpoint.ACudaTrainerStagesItsSnapshotWhereItFits:Device.CudaSideStreamMemoryWaitsForTheComputeStream:Device.CudaSideStreamWorkIsReadyForTheComputeStream:Governor.CudaBudgetIsEnforcedAndAnOomThereIsRecovered:Loader.PinsBatchesWhenTheRunUsesCuda:Nms.CudaKernelEqualsTheCpuKernel:Train.InputOnASideStreamTrainsAsOnTheComputeStream:Train.StepsOnCudaNeverSyncTheHost:StepGraph.ReplayedStepsTrainAsEagerOnes:StepGraph.ANewMicroBatchIsCapturedAgain:StepGraph.ValidationGivesTheGraphBack:StepGraph.TheNextEpochIsCapturedAtItsFirstStep:StepGraph.OneGraphServesYolo26sEpochsWithEachEpochsBranchWeight:StepGraph.AutoDecidesOnceAndTrainsAsEager:StepGraph.StepsThatRecomputeRunEagerly:StepGraph.ReplaysNeverSyncTheHost:StepGraph.ACudnnFailureInACaptureIsTheCapturesNotTheGovernors'
if want gpu; then
  stage "gpu tests"
  timeout $(lim 100) $B/headroom_tests --gtest_filter="$gpu_tests" > /tmp/gpu_tests.log 2>&1
  rc=$?
  cat /tmp/gpu_tests.log >> "$log"
  status "gpu tests" "rc=$rc; $(grep -E '^\[  (PASSED  |SKIPPED |FAILED  )\] [0-9]+ test' /tmp/gpu_tests.log | cut -c14- | tr '\n' ' ')"
  crashed=$(grep '^\[ RUN      \]' /tmp/gpu_tests.log | tail -1 | awk '{print $4}')
  if (( rc > 128 )) && command -v cuda-gdb > /dev/null; then  # a crash: where
    stage "backtrace of $crashed"
    timeout $(lim 90) cuda-gdb -q -batch -ex run -ex bt -ex 'info threads' --args $B/headroom_tests --gtest_filter="$crashed" >> "$log" 2>&1
    status "  crashed in" "$crashed: $(grep -m3 -E '^#[0-9]+ ' "$log" | awk '{for (i = 1; i <= NF; i++) if ($i == "in") {print $(i + 1); break}}' | tr '\n' ' ')"
  fi
fi

# 1b. Issue 26: the step's speed with each GPU default and without it, in one run (bench_train:
#     img/s, the device's busy share from CUDA events, the phases): YOLOv8n 640 b64 fp16 SGD
#     (goal >= 1000 img/s) and Hourglass-104 512 b16 fp16 Adam (goal >= 200 img/s), each as
#     configured, without CUDA graphs, in channels_last and in bf16 (SPEED_VARIANTS: override sets
#     separated by ';', the empty first one the configured run; add data.side_stream=false and
#     train.cudnn_benchmark=off where time allows). No warmup epochs: SGD's warmup moves the
#     momentum every step, which keeps its graphs from capturing (as in a real run's first epochs).
if want speed; then
  if [[ $QUICK == 1 ]]; then sp_steps=2; sp_warm=1; v8=(data.imgsz=128 train.batch=4 train.nominal_batch=4); hg=(data.imgsz=128 train.batch=2 train.nominal_batch=2)
  else sp_steps=30; sp_warm=8; v8=(data.imgsz=640 train.batch=64 train.nominal_batch=64); hg=(data.imgsz=512 train.batch=16 train.nominal_batch=16); fi
  amp=$([[ $cuda == 1 ]] && echo fp16 || echo off)
  IFS=';' read -ra variants <<< "${SPEED_VARIANTS-;train.cuda_graphs=off;model.channels_last=true;train.amp=bf16}"
  for variant in "${variants[@]}"; do
    for model in yolov8n hg104; do
      stage "bench_train $model $variant"
      # Mosaic in every measured epoch (the demo closes it for its last 3 of 10, which bench_train's
      # short epochs would reach at once).
      if [[ $model == yolov8n ]]; then args=(--config configs/demo.yaml --images 640 model.file=models/yolov8n.yaml "${v8[@]}" train.optimizer=sgd augment.close_mosaic=0)
      else args=(--config configs/centernet_hg104.yaml --images 160 "${hg[@]}"); fi
      # shellcheck disable=SC2086 # the variant is one override or none
      timeout $(lim 45) $B/bench_train "${args[@]}" --steps $sp_steps --warmup $sp_warm --data /tmp/headroom-bench-train device=$dev \
        train.amp=$amp train.warmup_epochs=0 $variant > /tmp/bench_train.jsonl 2>> "$log"
      rc=$?
      sed "s/^{/{\"variant\": \"$model ${variant:-default}\", /" /tmp/bench_train.jsonl >> "$RES/bench_train.jsonl"
      status "speed $model ${variant:-default}" "rc=$rc; $(grep -o '"img_per_s": *[0-9.]*\|"img_per_s_end_to_end": *[0-9.]*\|"outside_steps_s": *[0-9.e-]*\|"device_busy_pct": *[0-9.]*\|"graph_captures": *[0-9]*\|"graphs_kept": *[a-z]*\|"epoch_boundary_device_s": *[0-9.e-]*' /tmp/bench_train.jsonl | tr '\n' ' ')"
    done
  done
fi

# 1c. Issue 26's peers beside Headroom in the same run (scripts/device/peers.py; carry .peers,
#     made by scripts/device/fetch-peers.sh): YOLOv8n end to end on the same synthetic set with
#     Ultralytics' trainer and `trainer train` (640 px, batch 64, fp16, SGD, Ultralytics' default
#     augmentations, 4 epochs: img/s per epoch and mAP), Ultralytics' step alone, and CenterNet's
#     Hourglass-104 step at 512 b16 NCHW and channels_last (bench_train above has Headroom's).
if want peers; then
  if [[ ! -d .peers/wheels ]]; then status peers "no .peers (scripts/device/fetch-peers.sh, then carry it)"; else
    psite=/tmp/headroom-peers-site
    for w in .peers/wheels/*.whl; do  # only what this Python lacks
      mod=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z'); case $mod in pyyaml) mod=yaml ;; ultralytics_thop) mod=thop ;; esac
      "$PYTHON" -c "import $mod" 2> /dev/null || "$PYTHON" -m pip install --quiet --no-index --no-deps --target $psite "$w" >> "$log" 2>&1
    done
    if [[ $QUICK == 1 ]]; then pv=(--imgsz 128 --batch 8 --epochs 2 --workers 2); ps=(--steps 1 --warmup 1); pv8=(--imgsz 128 --batch 4); phg=(--imgsz 128 --batch 2); n_v8=40
    else pv=(--imgsz 640 --batch 64 --epochs 4 --workers 8); ps=(--steps 40 --warmup 10); pv8=(--imgsz 640 --batch 64); phg=(--imgsz 512 --batch 16); n_v8=${V8_IMAGES:-4000}; fi
    v8syn=/tmp/headroom-v8syn
    $B/trainer data synth --out $v8syn --images $n_v8 --size "${pv[1]}" --classes 1 --max-objects 20 > /dev/null 2>&1
    pdev=$([[ $cuda == 1 ]] && echo 0 || echo cpu)
    peer() {  # name, then peers.py's arguments
      local name=$1; shift
      stage "peer $name"
      PYTHONPATH=$psite${PYTHONPATH:+:$PYTHONPATH} timeout $(lim 120) "$PYTHON" scripts/device/peers.py "$@" --device $pdev > /tmp/peer.json 2>> "$log"
      local rc=$?
      tail -1 /tmp/peer.json >> "$RES/peers.jsonl"
      status "peer $name" "rc=$rc; $(tail -1 /tmp/peer.json | cut -c1-200)"
    }
    # Headroom first (the issue's goal), then Ultralytics on the same images (80% of them train):
    # no warmup on either side, or SGD's warmup keeps Headroom's step from being captured as a
    # CUDA graph in this short run. End to end = the images of epochs 2 to 4 over their whole time,
    # validation and checkpoints included (results.csv's time/epoch_s; Ultralytics' on_fit_epoch_end).
    stage "headroom e2e"
    e2e_t0=$(date +%s.%N)
    timeout $(lim 120) $B/trainer train --config configs/yolov8s.yaml model.file=models/yolov8n.yaml data.dataset=$v8syn/data.yaml device=$dev \
      data.imgsz="${pv[1]}" train.batch="${pv[3]}" train.nominal_batch="${pv[3]}" train.epochs="${pv[5]}" data.workers="${pv[7]}" \
      train.warmup_epochs=0 augment.close_mosaic=0 train.plots=false project=/tmp/headroom-runs name=v8e2e exist_ok=true > /tmp/train_v8e2e.log 2>&1
    rc=$?
    e2e_wall=$(awk -v a="$e2e_t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')
    keep_lines /tmp/train_v8e2e.log
    cp /tmp/train_v8e2e.log /tmp/headroom-runs/v8e2e/results.csv "$RES/" 2>/dev/null
    e2e=$(awk -F, 'NR == 1 {for (i = 1; i <= NF; i++) if ($i == "time/epoch_s") c = i} NR > 2 && c {s += $c; n++}
      END {if (n && s > 0) printf "%.1f", n * imgs / s}' imgs=$(( n_v8 * 4 / 5 )) /tmp/headroom-runs/v8e2e/results.csv 2>/dev/null)
    status "headroom e2e" "rc=$rc; epochs 2-4 end to end ${e2e:-?} img/s; run $e2e_wall s; $(grep -o '[0-9]* steps in [0-9:]* ([0-9.]* img/s' /tmp/train_v8e2e.log | tr '\n' ';' | cut -c1-160) $(grep -o 'AP50-95 [0-9.]* AP50 [0-9.]*' /tmp/train_v8e2e.log | tail -1)"
    rm -rf /tmp/headroom-runs/v8e2e/weights
    peer "ultralytics e2e" ultralytics --data $v8syn/data.yaml "${pv[@]}" --warmup-epochs 0
    peer "ultralytics step" ultralytics-step "${pv8[@]}" "${ps[@]}"
    peer "centernet step" centernet-step --centernet .peers/centernet "${phg[@]}" "${ps[@]}"
    peer "centernet step cl" centernet-step --centernet .peers/centernet --channels-last "${phg[@]}" "${ps[@]}"
  fi
fi

# 3. The estimator on Hourglass-104 at 512 against the measured peak at 7 images: fp32, bf16, bf16 + every stage recomputed.
if want estimate && [[ $QUICK != 1 ]]; then
  for mode in "train.amp=off" "train.amp=bf16" "train.amp=bf16 memory.activation_checkpointing=all"; do
    stage "bench_memory $mode"
    sets=(); for kv in $mode; do sets+=(--set "$kv"); done
    timeout $(lim 50) $B/bench_memory --device $dev --data /tmp/headroom-bench-memory --only centernet_hg104_512 --estimate-only "${sets[@]}" \
      >> "$RES/bench_memory.jsonl" 2>> "$log"
    status "  estimate $mode" "rc=$? $(tail -1 "$RES/bench_memory.jsonl" | grep -o '"error": *[-0-9.e]*')"
  done
fi

# 2. Issues 15 and 27: the seed user's model and size under an 8 GiB budget, fp16, automatic
#    micro-batch and recompute plan, 32 images per step, validation and checkpoints inside the
#    run, with each memory.prefer (goal: batch >= 16 images per micro-batch, throughput never
#    slower than batch, its timed img/s within 10% of the epochs', >= 100 img/s).
syn=/tmp/headroom-synth$size
if want hg104 || want boundary || want pipeline || want nproc; then
  $B/trainer data synth --out $syn --images $n_img --size $size --classes 1 --max-objects 20 > /dev/null 2>&1
fi
if want hg104; then
  for prefer in ${HG_PREFERS:-batch throughput}; do
    stage "hg104 governed, memory.prefer=$prefer"
    hg_log=/tmp/train_hg104_$prefer.log
    timeout $(lim 150) $B/trainer train --config configs/centernet_hg104.yaml data.dataset=$syn/data.yaml data.imgsz=$hg_size device=$dev \
      memory.budget=8GiB train.batch=auto train.nominal_batch=32 train.amp=$([[ $cuda == 1 ]] && echo fp16 || echo bf16) \
      memory.activation_checkpointing=auto memory.prefer=$prefer train.steps=$(( steps / 2 )) train.val_every_steps=$(( steps / 4 )) \
      train.save_every_steps=$(( steps / 4 )) train.plots=false project=/tmp/headroom-runs name=hg104_$prefer exist_ok=true > "$hg_log" 2>&1
    rc=$?
    keep_lines "$hg_log"
    status "hg104 8GiB $prefer" "rc=$rc; $(grep -o 'train.batch auto: micro-batch [0-9]*' "$hg_log" | head -1); $(grep -o '[0-9.]* img/s [a-z]*  (chosen)' "$hg_log" | head -1)"
    status "  epochs" "$(grep -c 'memory, epoch' "$hg_log"); governor decisions $(grep -c 'memory governor, step' "$hg_log"); OOMs $(grep -o '[0-9]* OOMs' "$hg_log" | tail -1); $(grep -o '[0-9]* steps in [0-9:]* ([0-9.]* img/s' "$hg_log" | tail -3 | tr '\n' ';')"
    status "  max reserved" "$(grep -o 'allocated, [0-9.]* [KMG]iB reserved' "$hg_log" | awk '{print $2 $3}' | sort -h | tail -1) (budget 8 GiB); host RSS $(grep -o 'host RSS [0-9.]* [KMG]iB' "$hg_log" | awk '{print $3 $4}' | tr '\n' ' ')"
    status "  device busy" "$(grep -o '[a-z:0-9]* busy [0-9]*% from the first step' "$hg_log" | awk '{print $3}' | tr '\n' ' ')"
    cp /tmp/headroom-runs/hg104_$prefer/results.csv "$RES/hg104_$prefer.csv" 2>/dev/null
    rm -rf /tmp/headroom-runs/hg104_$prefer/weights  # 2.3 GB a file: the disk is 64 GiB
  done
fi

# 2b. Issue 26: checkpoints behind the training. Hourglass-104 at 512, batch 16, fp16, short
#     epochs without validation, each ending in last.pt (2.3 GB with Adam and EMA): the GPU's
#     utilisation every 100 ms; the idle spans (< 10% busy) between the first and the last busy
#     sample are the epoch boundaries' cost (goal <= 0.2 s each), with and without the thread.
if want boundary; then
  for async in ${BOUNDARY_ASYNC:-true false}; do
    stage "boundary async_checkpoints=$async"
    util=$RES/boundary_util_$async.csv
    [[ $cuda == 1 ]] && { nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > "$util" 2>&1 & util_pid=$!; }
    timeout $(lim 90) $B/trainer train --config configs/centernet_hg104.yaml data.dataset=$syn/data.yaml data.imgsz=$hg_size device=$dev \
      train.steps=0 train.batch=16 train.nominal_batch=16 train.amp=$([[ $cuda == 1 ]] && echo fp16 || echo off) train.epochs=$([[ $QUICK == 1 ]] && echo 2 || echo 4) \
      train.val_every=0 train.async_checkpoints=$async train.plots=false project=/tmp/headroom-runs name=boundary_$async exist_ok=true \
      > /tmp/train_boundary.log 2>&1
    rc=$?
    [[ $cuda == 1 ]] && kill $util_pid 2>/dev/null
    keep_lines /tmp/train_boundary.log
    grep -E 'epoch [0-9]+/[0-9]+ .*steps in' /tmp/train_boundary.log | cut -c1-200 >> "$log"
    status "boundary async=$async" "rc=$rc; $(grep -o '[0-9]* steps in [0-9:]* ([0-9.]* img/s' /tmp/train_boundary.log | tr '\n' ';' | cut -c1-160)"
    cp /tmp/headroom-runs/boundary_$async/results.csv "$RES/boundary_$async.csv" 2>/dev/null
    rm -rf /tmp/headroom-runs/boundary_$async/weights
    # nvidia-smi averages over its own sample period: indicative only (bench_train's
    # epoch_boundary_device_s, from CUDA events, is the figure)
    [[ -s $util ]] && status "  idle spans (s, ~)" "$(awk '$1+0 >= 50 {if (first == "") first = NR; last = NR} {u[NR] = $1+0}
      END {run = 0; for (i = first; i <= last; i++) if (u[i] < 10) run++; else if (run) {printf "%.1f ", run / 10; run = 0}}' "$util")"
  done
  # The compute stream's time held by one Hourglass-104 snapshot (Adam, EMA): staged on the device
  # (a copy there, the transfer beside the steps) and unstaged (the transfer on the step's stream).
  for staging in "" --unstaged; do
    [[ $QUICK == 1 ]] && break  # a 3 GB model
    stage "bench_checkpoint $staging"
    timeout $(lim 60) $B/bench_checkpoint --async --device $dev $staging --dir /tmp/headroom-bench-checkpoint >> "$RES/bench_checkpoint.jsonl" 2>> "$log"
    status "  snapshot ${staging:-staged}" "rc=$? $(tail -1 "$RES/bench_checkpoint.jsonl" | grep -o '"[a-z]*_held_[a-z_]*seconds": *[0-9.e-]*' | tr '\n' ' ')"
  done
fi

# 4. Issue 14: the TF OD API user's pipeline.config as it is (Hourglass-104, 512, batch 2, their
#    seven augmentations), from scratch on a one-class TFRecord set, with the GPU's utilisation.
if want pipeline; then
  pl=/tmp/headroom-pipeline
  rm -rf $pl && mkdir -p $pl && cp tests/fixtures/tfod/pipeline.config $pl/
  $B/trainer data convert --from $syn/data.yaml --to tfrecord --out $pl/annotations > /dev/null 2>&1 && mv $pl/annotations/val.record $pl/annotations/test.record
  stage "pipeline"
  [[ $cuda == 1 ]] && { nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 > "$RES/pipeline_gpu_util.csv" 2>&1 & util_pid=$!; }
  (cd $pl && timeout $(lim 70) "$OLDPWD/$B/trainer" train --config pipeline.config device=$dev "model.init_from=''" train.steps=$(( steps / 2 )) \
    train.val_every_steps=0 train.plots=false project=/tmp/headroom-runs name=pipeline exist_ok=true) > /tmp/train_pipeline.log 2>&1
  rc=$?
  [[ $cuda == 1 ]] && kill $util_pid 2>/dev/null
  keep_lines /tmp/train_pipeline.log
  status "tfod pipeline" "rc=$rc; $(grep -o 'done: [0-9]* steps in [0-9:]* ([0-9.]* img/s, data wait [0-9]*%)' /tmp/train_pipeline.log | tail -1)"
  [[ -s $RES/pipeline_gpu_util.csv ]] &&
    status "  gpu utilisation" "$(awk -F', ' '{s+=$1; n++; if ($2>m) m=$2} END {if (n) printf "mean %.0f%% over %d samples, memory used up to %d MiB", s/n, n, m}' "$RES/pipeline_gpu_util.csv")"
fi

# 5. More processes than GPUs: NCCL cannot put two ranks on one GPU; the run must say so.
if want nproc && [[ $cuda == 1 ]]; then
  stage "nproc 2"
  timeout $(lim 30) $B/trainer train --nproc 2 --config configs/demo.yaml data.dataset=$syn/data.yaml device=cuda train.steps=2 \
    project=/tmp/headroom-runs name=nproc exist_ok=true >> "$log" 2>&1
  status "nproc 2 on 1 GPU" "rc=$? $(grep -o 'rank 1 takes cuda:1.*' "$log" | head -1 | cut -c1-80)"
fi

# 6. The short demo of Train.DemoConfigLearnsTheShapes (AP50 0.077-0.098 after 200 steps on the
#    CPU) on this device, in each precision (DEMO_RUNS: override sets, separated by ';').
if want demo; then
  $B/trainer data synth --out /tmp/headroom-demo-data --images 400 --size 160 --seed 3 > /dev/null 2>&1
  IFS=';' read -ra demo_runs <<< "${DEMO_RUNS:-train.amp=fp16;train.amp=off;train.amp=bf16}"
  for i in "${!demo_runs[@]}"; do
    sets=${demo_runs[$i]}
    stage "demo $sets"
    # shellcheck disable=SC2086 # one word per override
    timeout $(lim 60) $B/trainer train --config configs/demo.yaml data.dataset=/tmp/headroom-demo-data/data.yaml device=$dev \
      train.epochs=10 train.val_every=10 train.warmup_epochs=0 threads=1 data.workers=1 train.plots=false $sets \
      project=/tmp/headroom-runs name=demo_$i exist_ok=true > /tmp/demo_$i.log 2>&1
    rc=$?
    keep_lines /tmp/demo_$i.log
    status "demo $sets" "rc=$rc; $(grep -o 'box [0-9.]* cls [0-9.]* dfl [0-9.]* val AP50-95 [0-9.]* AP50 [0-9.]*; [0-9]* skipped steps' /tmp/demo_$i.log | tail -1)"
  done
fi

# 6b. Issue 28's last check, asked for by name (STAGES="ap26"; about 4 minutes per model on an
#     H200, estimated): YOLO26n and YOLOv8n from scratch on `make demo`'s set with the demo's
#     recipe for Ultralytics' default length (AP26_EPOCHS, 300; close_mosaic 10): does YOLO26n
#     reach YOLOv8n's AP in the same epochs? YOLO26n also validated through its one-to-many branch
#     with NMS (eval.end2end=false), as Ultralytics' validator does.
if want ap26; then
  ap_epochs=${AP26_EPOCHS:-$([[ $QUICK == 1 ]] && echo 2 || echo 300)}
  $B/trainer data synth --out /tmp/headroom-ap26-data --images 800 --size 160 --seed 0 > /dev/null 2>&1
  for model in yolo26n yolov8n; do
    stage "ap26 $model"
    ap_log=/tmp/train_ap26_$model.log
    timeout $(lim 300) $B/trainer train --config configs/demo.yaml data.dataset=/tmp/headroom-ap26-data/data.yaml device=$dev \
      model.file=models/$model.yaml train.epochs=$ap_epochs train.val_every=$(( ap_epochs > 50 ? 50 : ap_epochs )) \
      augment.close_mosaic=$(( ap_epochs > 30 ? 10 : 1 )) train.plots=false project=/tmp/headroom-runs name=ap26_$model exist_ok=true > "$ap_log" 2>&1
    rc=$?
    keep_lines "$ap_log"
    status "ap26 $model" "rc=$rc; $(grep -o 'val AP50-95 [0-9.]* AP50 [0-9.]*' "$ap_log" | tail -1); $(grep -o '[0-9]* steps in [0-9:]* ([0-9.]* img/s' "$ap_log" | tail -1)"
  done
  stage "ap26 yolo26n one-to-many"
  timeout $(lim 60) $B/trainer val --config configs/demo.yaml data.dataset=/tmp/headroom-ap26-data/data.yaml device=$dev \
    model.file=models/yolo26n.yaml --weights /tmp/headroom-runs/ap26_yolo26n/weights/last.pt eval.end2end=false > /tmp/val_ap26.log 2>&1
  rc=$?
  grep -E 'Average Precision  \(AP\) @\[ IoU=0.50(:0.95)? +\| area= +all' /tmp/val_ap26.log >> "$log"
  status "  yolo26n one-to-many" "rc=$rc; AP50-95 AP50 $(grep -E 'Average Precision  \(AP\) @\[ IoU=0.50(:0.95)? +\| area= +all' /tmp/val_ap26.log | awk '{print $NF}' | tr '\n' ' ')"
fi

# 7. Augmentation on the GPU against per-image OpenCV on this machine's cores.
if want augment && [[ $QUICK != 1 ]]; then
  timeout $(lim 30) $B/bench_augment --device $dev > "$RES/bench_augment.jsonl" 2>> "$log"
  status bench_augment "rc=$? $(wc -l < "$RES/bench_augment.jsonl") lines"
fi

# 8. Named tests with their whole output (TESTS, a gtest filter).
if want tests && [[ -n ${TESTS:-} ]]; then
  stage "tests $TESTS"
  timeout $(lim 200) $B/headroom_tests --gtest_filter="$TESTS" >> "$log" 2>&1
  status tests "rc=$?; failed: $(grep '^\[  FAILED  \] [A-Z].*\.' "$log" | grep -v listed | awk '{print $4}' | sort -u | tr '\n' ' ')"
fi

# 9. The rest of the suite on this machine, in shards over its cores, in what time is left.
left=$(lim 300)
if want suite && (( left > 30 )) && [[ $QUICK != 1 ]]; then
  stage "suite"
  shards=$(nproc)
  for i in $(seq 0 $(( shards - 1 ))); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout $left $B/headroom_tests --gtest_filter="-$gpu_tests" > /tmp/shard$i.log 2>&1 &
  done
  wait
  cat /tmp/shard*.log | grep -E '^\[  FAILED  \]|^\[  PASSED  \]|tests? ran' > "$RES/suite.txt"
  status suite "$(grep -L '^\[  FAILED  \]' /tmp/shard*.log | wc -l)/$shards shards without a failure; failed: $(grep '^\[  FAILED  \].*\.' "$RES/suite.txt" | grep -v listed | awk '{print $4}' | sort -u | tr '\n' ' ')"
  # each failed test's own output
  for f in /tmp/shard*.log; do awk '/^\[ RUN      \]/{buf=""} {buf=buf $0 "\n"} /^\[  FAILED  \] [A-Za-z0-9_]+\.[A-Za-z0-9_]+ \(/{printf "%s", buf}' "$f"; done | cut -c1-400 >> "$log"
fi
pack
status total "$(elapsed) s"
cat "$RES/bench_memory.jsonl" 2>/dev/null | cut -c1-600 || true
