# mlxkern — `make demo` runs the main job, `make test` runs every test. Both set up what they
# need (scripts/bootstrap.sh makes .venv with the pinned MLX, mlx-lm and numpy).

SHELL := /bin/bash
.DEFAULT_GOAL := demo

CARGO ?= cargo
CC ?= cc
CXX ?= c++
PY := .venv/bin/python3
BUILD := build
UNAME := $(shell uname -s)
LIBDIR := $(abspath target/debug)
ifeq ($(UNAME),Darwin)
  LIB := $(LIBDIR)/libmlxkern.dylib
else
  LIB := $(LIBDIR)/libmlxkern.so
endif
LINK := -L$(LIBDIR) -lmlxkern -Wl,-rpath,$(LIBDIR)

.PHONY: test-consumers bootstrap build header demo bench bench-cuda test-cuda cuda-carry train-example install test test-rust test-doc test-rust-examples test-oracle test-c test-cpp test-interop test-host-mlx test-bun bun-pack test-metal-emu test-arm64 test-swift test-mlx-swift test-sanitizers fuzz clean

bootstrap:
	@./scripts/bootstrap.sh

build: bootstrap
	$(CARGO) build --lib

# Refresh the committed header from the one the build generates.
header: bootstrap
	MLXK_UPDATE_HEADER=1 $(CARGO) test --test header

# The C demo (the recurrence through the C ABI, checked against float64), then the engine layer
# demo (examples/cpp/qwen35_demo.cpp: a whole Qwen3.5 layer as MLX ops + mlxkern kernels, one
# eval per step), compiled against the MLX in .venv (or MLX_DIR), the libmlx mlxkern links.
demo: build
	@mkdir -p $(BUILD)
	$(CC) -O2 -std=c11 -Wall -Wextra -Werror -Iinclude -Itests/common examples/c/demo.c \
	  $(LINK) -lm -o $(BUILD)/demo
	$(BUILD)/demo
	@echo
	MLX=$${MLX_DIR:-$$($(PY) -m mlx --cmake-dir)} && \
	  $(CXX) -O2 -std=c++20 -Wall -Wextra -Werror -Iinclude -isystem "$$MLX/include" \
	  examples/cpp/qwen35_demo.cpp $(LINK) -L"$$MLX/lib" -lmlx -Wl,-rpath,"$$MLX/lib" \
	  -o $(BUILD)/qwen35_demo
	$(BUILD)/qwen35_demo

test: bootstrap test-rust test-doc test-rust-examples test-oracle test-c test-sanitizers test-cpp test-interop test-host-mlx test-bun test-metal-emu test-arm64 test-swift test-mlx-swift test-consumers

test-rust:
	$(CARGO) test

# The crate's documentation (the safe Rust API) builds without a warning; `cargo test` runs its
# examples (doctests).
test-doc: bootstrap
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps

# The Rust examples (examples/rust/), each checking its own results.
test-rust-examples: bootstrap
	$(CARGO) run --example decode_loop
	$(CARGO) run --example gated_norm_grad

test-oracle: build
	$(PY) tests/oracle/run.py

test-c: build
	@mkdir -p $(BUILD)
	CC=$(CC) CXX=$(CXX) LIBDIR=$(LIBDIR) BUILD=$(abspath $(BUILD)) ./tests/c/run.sh

test-cpp: build
	@mkdir -p $(BUILD)
	CXX=$(CXX) LIBDIR=$(LIBDIR) BUILD=$(abspath $(BUILD)) ./scripts/test-cpp.sh

# Hosts that share their MLX arrays with mlxkern (C++ on libmlx, C on mlx-c, dlclose).
test-interop: build
	@mkdir -p $(BUILD)
	CC=$(CC) CXX=$(CXX) LIBDIR=$(LIBDIR) BUILD=$(abspath $(BUILD)) ./scripts/test-interop.sh

# A second MLX (0.31.1, in .venv-mlx-0.31.1, built into target/mlx031): the C ABI and interop
# suites on it; engines that bring their own MLX (find_package(MLX) of the pip 0.31.1 and
# 0.32.4 wheels; MLX 0.31.1 built from source, static, where ../shared has its sources) linking
# host-MLX installs of mlxkern through CMake (docs/DESIGN.md §2.2, "Link modes").
test-host-mlx: build
	@mkdir -p $(BUILD)
	CC=$(CC) CXX=$(CXX) CARGO=$(CARGO) BUILD=$(abspath $(BUILD)) ./scripts/test-host-mlx.sh

test-metal-emu: build
	@mkdir -p $(BUILD)
	CXX=$(CXX) LIBDIR=$(LIBDIR) BUILD=$(abspath $(BUILD)) ./scripts/test-metal-emu.sh

# The CPU kernels on arm64: NEON against portable, bit for bit, and the CPU modules' unit tests
# (tests/arm64; under qemu-aarch64 on x86-64, natively on arm64 Linux). Needs no MLX; installs
# the cross toolchain and qemu-user when missing (scripts/test-arm64.sh).
test-arm64:
	CARGO=$(CARGO) ./scripts/test-arm64.sh

test-swift: build
	MLXKERN_LIB_DIR=$(LIBDIR) ./scripts/test-swift.sh

# mlxkern inside an mlx-swift program, on its one MLX (swift/MLXKernMLX; needs
# ../shared/vendor/mlx-swift or MLX_SWIFT_PATH, else it says so and skips).
test-mlx-swift: build
	@mkdir -p $(BUILD)
	CC=$(CC) CXX=$(CXX) LIBDIR=$(LIBDIR) BUILD=$(abspath $(BUILD)) ./scripts/test-mlx-swift.sh

# Benchmarks: the C ABI against MLX's own CPU path, side by side (table, JSON and a PNG chart
# in build/bench/). MLXK_BENCH_QUICK=1 for a short run.
bench: build
	CC=$(CC) LIBDIR=$(LIBDIR) ./scripts/bench.sh

# The training example: a LoRA adapter on one Qwen3.5 layer trained from C++ through the
# kernels' gradients (MLX autograd) next to the same training in mlx-lm; writes
# build/bench/train_loss.png and the curves (.csv, .json). MLXK_TRAIN_STEPS=N for another length.
train-example: build
	CXX=$(CXX) LIBDIR=$(LIBDIR) BUILD=$(abspath $(BUILD)) ./scripts/train-example.sh

# C clients under ASan/LSan and valgrind memcheck, 10 000 mixed calls, resident memory check.
test-sanitizers: build
	@mkdir -p $(BUILD)
	CC=$(CC) LIBDIR=$(LIBDIR) BUILD=$(abspath $(BUILD)) ./scripts/test-sanitizers.sh

# Long fuzzing under AddressSanitizer (FUZZ_SECONDS per target); `make test` replays the corpus.
FUZZ_SECONDS ?= 600
fuzz: bootstrap
	./scripts/fuzz.sh $(FUZZ_SECONDS)

# Installs the library, the headers, the pkg-config files and the CMake package
# (lib/cmake/mlxkern). MLXKERN_MLX=bundled (default): with a private copy of the .venv's MLX.
# MLXKERN_MLX=host MLX_DIR=<the host's MLX>: built against that MLX (target/host-mlx), no MLX
# copied: libmlxkern.so links the host's libmlx (where it is shared) and libmlxkern.a leaves
# MLX's symbols to the host's final link (docs/DESIGN.md §2.2, "Link modes").
PREFIX ?= /usr/local
MLXKERN_MLX ?= bundled
HOST_TARGET := target/host-mlx
ifeq ($(MLXKERN_MLX),host)
install:
	@test -n "$(MLX_DIR)" || { echo "install: MLXKERN_MLX=host needs MLX_DIR (the host's MLX: a pip mlx folder, an install prefix, its share/cmake/MLX or a source tree)"; exit 2; }
	MLX_DIR="$(MLX_DIR)" CARGO_TARGET_DIR=$(HOST_TARGET) $(CARGO) build --lib
	MLXKERN_MLX=host MLX_DIR="$(MLX_DIR)" LIBDIR=$(abspath $(HOST_TARGET))/debug ./scripts/install.sh $(PREFIX)
else
install: build
	LIBDIR=$(LIBDIR) ./scripts/install.sh $(PREFIX)
endif

# A consumer of each kind (CMake, cargo, Bun, SwiftPM), built from the installed or packed
# artifact in a fresh folder outside the repository, checked bit for bit against the C ABI
# (scripts/test-consumers.sh; CONSUMERS="cmake cargo" for some).
test-consumers: build
	LIBDIR=$(LIBDIR) ./scripts/test-consumers.sh $(CONSUMERS)

test-bun: build
	./scripts/test-bun.sh

# The Bun binding as npm tarballs (build/npm/mlxkern-<v>.tgz and the platform package
# mlxkern-linux-x64-gnu-<v>.tgz carrying the library and its MLX): bun/README.md, "Installing".
bun-pack: build
	LIBDIR=$(LIBDIR) ./scripts/bun-pack.sh

clean:
	$(CARGO) clean
	rm -rf $(BUILD)

# MLX CUDA (docs/DESIGN.md §3). On a machine with an NVIDIA GPU, Rust and an MLX CUDA install
# (pip mlx-cuda-13==0.32.4; MLX_DIR=its `mlx` package folder): `make test-cuda` runs every kernel
# on the GPU against the CPU kernels (tests/cuda.rs), the GPU backward against the CPU's
# (tests/gated_delta_update_vjp.rs) and MLX autograd through the GPU kernels
# (tests/cpp/gpu_autograd.cc), `make bench-cuda` the GPU benchmark beside
# MLX's own paths and fla (build/bench/bench-cuda.{log,jsonl,png}). Where the GPU machine has no
# Rust, `make cuda-carry` builds the same programs here into build/cuda/carry and
# scripts/cuda-device.sh runs them there.
CUDA_TARGET := target/cuda
test-cuda:
	@test -n "$$MLX_DIR" || { echo "test-cuda: set MLX_DIR to an MLX CUDA install's mlx folder"; exit 2; }
	CARGO_TARGET_DIR=$(CUDA_TARGET) $(CARGO) test --test cuda -- --test-threads=1 --nocapture
	CARGO_TARGET_DIR=$(CUDA_TARGET) $(CARGO) test --test gated_delta_update_vjp -- --test-threads=1
	@mkdir -p $(BUILD)/cuda
	$(CXX) -O2 -std=c++20 -Iinclude -isystem "$$MLX_DIR/include" tests/cpp/gpu_autograd.cc \
	  -L$(CUDA_TARGET)/debug -lmlxkern -Wl,-rpath,$(abspath $(CUDA_TARGET)/debug) \
	  -L"$$MLX_DIR/lib" -lmlx -Wl,-rpath,"$$MLX_DIR/lib" -o $(BUILD)/cuda/gpu_autograd
	$(BUILD)/cuda/gpu_autograd

bench-cuda:
	@test -n "$$MLX_DIR" || { echo "bench-cuda: set MLX_DIR to an MLX CUDA install's mlx folder"; exit 2; }
	CARGO_TARGET_DIR=$(CUDA_TARGET) $(CARGO) build --lib
	@mkdir -p $(BUILD)/bench
	$(CXX) -O2 -std=c++20 -Iinclude -isystem "$$MLX_DIR/include" benches/bench_cuda{,_layers,_dispatch,_pool}.cc \
	  -L$(CUDA_TARGET)/debug -lmlxkern -Wl,-rpath,$(abspath $(CUDA_TARGET)/debug) \
	  -L"$$MLX_DIR/lib" -lmlx -Wl,-rpath,"$$MLX_DIR/lib" -o $(BUILD)/bench/bench_cuda
	MLXK_BENCH_JSON=$(BUILD)/bench/bench-cuda.jsonl $(BUILD)/bench/bench_cuda | tee $(BUILD)/bench/bench-cuda.log
	rm -f $(BUILD)/bench/fla.jsonl
	-python3 benches/peer_fla.py $(BUILD)/bench/fla.jsonl
	-python3 benches/peer_fla_chunk.py $(BUILD)/bench/fla.jsonl
	python3 benches/chart_cuda.py $(BUILD)/bench/bench-cuda.png $(BUILD)/bench/bench-cuda.jsonl $(BUILD)/bench/fla.jsonl

cuda-carry:
	./scripts/cuda-build.sh
