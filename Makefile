# Thin wrapper: installs missing packages, configures with CMake + Ninja, builds, runs.
#   make demo       synthesise the demo data set, check it, train configs/demo.yaml, print the val mAP
#   make test       the GoogleTest suite against Debian's LibTorch 1.13 (CPU)
#   make test-cuda  the same suite against LibTorch 2.x with CUDA from the PyPI torch wheel
#                   (a virtual environment under build-cuda/; CUDA code compiles and links,
#                   the tests run on the CPU where there is no GPU)
#   make onnxruntime  build/onnxruntime: a Python with ONNX Runtime, the tests' ONNX oracle
#   make bench      the benchmarks, one JSON line per measurement
#   make install    trainer into $(PREFIX)/bin, models and example configs into $(PREFIX)/share/headroom

BUILD       ?= build
CUDA_BUILD  ?= build-cuda
TORCH_WHEEL ?= torch==2.11.0
ONNXRUNTIME ?= onnxruntime==1.32.0
CUDA_HOME   ?= /usr/local/cuda
PYTHON      ?= python3
JOBS        ?= $(shell nproc)
CMAKE_FLAGS ?=
PREFIX      ?= /usr/local

.PHONY: all deps build demo test bench install cuda-build test-cuda onnxruntime clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/trainer data synth --out build/demo-data --images 800 --size 160 --seed 0
	$(BUILD)/trainer data check --config configs/demo.yaml --quick
	$(BUILD)/trainer train --config configs/demo.yaml

test: build onnxruntime
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The exported graphs are checked by ONNX Runtime (tests/onnxruntime_run.py), from PyPI.
onnxruntime: build/onnxruntime/.installed
build/onnxruntime/.installed:
	bash scripts/install-deps.sh
	$(PYTHON) -m venv build/onnxruntime
	build/onnxruntime/bin/pip install --quiet $(ONNXRUNTIME) numpy
	build/onnxruntime/bin/python -c 'import onnxruntime; print("onnxruntime", onnxruntime.__version__)'
	touch $@

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

bench: build
	$(BUILD)/bench_loader --out $(BUILD)/bench-data
	$(BUILD)/bench_augment
	$(BUILD)/bench_models
	$(BUILD)/bench_memory --data $(BUILD)/bench-memory-data
	$(BUILD)/bench_checkpoint --dir $(BUILD)/bench-checkpoint
	$(BUILD)/bench_checkpoint --dir $(BUILD)/bench-checkpoint --async
	$(BUILD)/bench_train --plain --data $(BUILD)/bench-train-data device=cpu
	$(BUILD)/bench_train --plain --data $(BUILD)/bench-train-data --config configs/yolov5s.yaml model.file=models/yolov5n.yaml data.imgsz=320 device=cpu

$(CUDA_BUILD)/venv/.torch-installed:
	bash scripts/install-deps.sh --cuda
	$(PYTHON) -m venv $(CUDA_BUILD)/venv
	$(CUDA_BUILD)/venv/bin/pip install --upgrade --quiet pip
	$(CUDA_BUILD)/venv/bin/pip install --quiet $(TORCH_WHEEL)
	$(CUDA_BUILD)/venv/bin/python -W ignore -c 'import torch, sys; print("torch", torch.__version__, "CUDA", torch.version.cuda); sys.exit(0 if torch.version.cuda else 1)'
	touch $@

# The torch folder itself is on the prefix path too, so that its lib/ is searched before the
# system's: otherwise TorchConfig's find_library picks Debian's libtorch.so.
$(CUDA_BUILD)/build.ninja: $(CUDA_BUILD)/venv/.torch-installed
	torch_dir="$$($(CUDA_BUILD)/venv/bin/python -W ignore -c 'import os, torch; print(os.path.dirname(torch.__file__))')"; \
	cmake -S . -B $(CUDA_BUILD) -G Ninja $(CMAKE_FLAGS) \
	  -DCMAKE_PREFIX_PATH="$$torch_dir/share/cmake;$$torch_dir" \
	  -DCUDAToolkit_ROOT=$(CUDA_HOME) -DCMAKE_CUDA_COMPILER=$(CUDA_HOME)/bin/nvcc

cuda-build: deps $(CUDA_BUILD)/build.ninja
	cmake --build $(CUDA_BUILD) -j $(JOBS)

test-cuda: cuda-build onnxruntime
	ctest --test-dir $(CUDA_BUILD) --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(CUDA_BUILD)
