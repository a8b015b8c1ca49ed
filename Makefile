# mlxkern — `make demo` runs the main job, `make test` runs every test. Both set up what they
# need (scripts/bootstrap.sh makes .venv with the pinned MLX, mlx-lm and numpy).
#
# This file is the one entry; each target runs one script, which finds the library
# (target/debug), the build folder (build/) and the compilers (CC, CXX) itself:
#   scripts/test/     a suite each (make test-*, fuzz)     scripts/bench/    make bench, train-example
#   scripts/package/  make install, bun-pack               scripts/setup/    tools the suites fetch
#   scripts/swift/    the Swift toolchain (Linux chroot)   scripts/cuda/     test-cuda, bench-cuda, cuda-carry

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

.PHONY: test-consumers bootstrap build header demo bench bench-cuda test-cuda cuda-carry train-example install test test-rust test-doc test-rust-examples test-oracle test-c test-cpp test-interop test-host-mlx test-bun bun-pack test-metal-emu test-swift test-mlx-swift test-sanitizers test-layers test-arm64 fuzz clean

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
	$(CC) -O2 -std=c11 -Wall -Wextra -Werror -Iinclude -Iexamples/common examples/c/demo.c \
	  $(LINK) -lm -o $(BUILD)/demo
	$(BUILD)/demo
	@echo
	MLX=$${MLX_DIR:-$$($(PY) -m mlx --cmake-dir)} && \
	  $(CXX) -O2 -std=c++20 -Wall -Wextra -Werror -Iinclude -isystem "$$MLX/include" \
	  examples/cpp/qwen35_demo.cpp $(LINK) -L"$$MLX/lib" -lmlx -Wl,-rpath,"$$MLX/lib" \
	  -o $(BUILD)/qwen35_demo
	$(BUILD)/qwen35_demo

test: bootstrap test-layers test-rust test-doc test-rust-examples test-oracle test-c test-sanitizers test-cpp test-interop test-host-mlx test-bun test-metal-emu test-arm64 test-swift test-mlx-swift test-consumers test-python test-distributed test-soak

test-rust:
	$(CARGO) test

# docs/layers.md is what scripts/docs/layers.py prints from the code, and no import breaks the
# layer rule; every path the READMEs and docs/ pages name in backticks exists
# (scripts/docs/paths.py).
test-layers:
	python3 scripts/docs/layers.py --check
	python3 scripts/docs/paths.py

# The crate's documentation (the safe Rust API) builds without a warning; `cargo test` runs its
# examples (doctests).
test-doc: bootstrap
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps

# The Rust examples (examples/rust/), each checking its own results.
test-rust-examples: bootstrap
	$(CARGO) run --example decode_loop
	$(CARGO) run --example gated_norm_grad

# The serving soak (tests/soak/, docs/serving.md "Soak"): simulated servers on state pools from
# several threads, every pool call checked bit for bit against the dense per-sequence calls;
# zero live handles and flat resident memory at the end. test-soak: 45 s; soak: SOAK_SECONDS
# (default 300; SOAK_SECONDS=14400 for four hours), SOAK_SEED replays.
.PHONY: soak test-soak
test-soak: bootstrap
	SOAK_SECONDS=45 $(CARGO) test --test soak

soak: bootstrap
	SOAK_SECONDS=$${SOAK_SECONDS:-300} $(CARGO) test --test soak

test-oracle: build
	$(PY) tests/oracle/run.py

test-c: build
	./tests/c/run.sh

test-cpp: build
	./scripts/test/cpp.sh

# Hosts that share their MLX arrays with mlxkern (C++ on libmlx, C on mlx-c, dlclose).
test-interop: build
	./scripts/test/interop.sh

# A second MLX (0.31.1, in .venv-mlx-0.31.1, built into target/mlx031): the C ABI and interop
# suites on it; engines that bring their own MLX (find_package(MLX) of the pip 0.31.1 and
# 0.32.4 wheels; MLX 0.31.1 built from source, static, where ../shared has its sources) linking
# host-MLX installs of mlxkern through CMake (docs/DESIGN.md §2.2, "Link modes").
test-host-mlx: build
	./scripts/test/host-mlx.sh

test-metal-emu: build
	./scripts/test/metal-emu.sh

# The CPU kernels on arm64: NEON against portable, bit for bit, and the CPU modules' unit tests
# (tests/arm64; under qemu-aarch64 on x86-64, natively on arm64 Linux). Needs no MLX; installs
# the cross toolchain and qemu-user when missing (scripts/test-arm64.sh).
test-arm64:
	CARGO=$(CARGO) ./scripts/test-arm64.sh

test-swift: build
	./scripts/test/swift.sh

# mlxkern inside an mlx-swift program, on its one MLX (swift/MLXKernMLX; needs
# ../shared/vendor/mlx-swift or MLX_SWIFT_PATH, else it says so and skips).
test-mlx-swift: build
	./scripts/test/mlx-swift.sh

# Benchmarks: the C ABI against MLX's own CPU path, side by side (table, JSON and a PNG chart
# in build/bench/). MLXK_BENCH_QUICK=1 for a short run.
bench: build
	./scripts/bench/run.sh

# The training example: a LoRA adapter on one Qwen3.5 layer trained from C++ through the
# kernels' gradients (MLX autograd) next to the same training in mlx-lm; writes
# build/bench/train_loss.png and the curves (.csv, .json). MLXK_TRAIN_STEPS=N for another length.
train-example: build
	./scripts/bench/train-example.sh

# C clients under ASan/LSan and valgrind memcheck, 10 000 mixed calls, resident memory check.
test-sanitizers: build
	./scripts/test/sanitizers.sh

# Long fuzzing under AddressSanitizer (FUZZ_SECONDS per target); `make test` replays the corpus.
FUZZ_SECONDS ?= 600
fuzz: bootstrap
	./scripts/test/fuzz.sh $(FUZZ_SECONDS)

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
	MLXKERN_MLX=host MLX_DIR="$(MLX_DIR)" LIBDIR=$(abspath $(HOST_TARGET))/debug ./scripts/package/install.sh $(PREFIX)
else
install: build
	./scripts/package/install.sh $(PREFIX)
endif

# A consumer of each kind (CMake, cargo, Bun, SwiftPM), built from the installed or packed
# artifact in a fresh folder outside the repository, checked bit for bit against the C ABI
# (scripts/test/consumers.sh; CONSUMERS="cmake cargo" for some).
test-consumers: build
	./scripts/test/consumers.sh $(CONSUMERS)

test-bun: build
	./scripts/test/bun.sh

# The Bun binding as npm tarballs (build/npm/mlxkern-<v>.tgz and the platform package
# mlxkern-linux-x64-gnu-<v>.tgz carrying the library and its MLX): bun/README.md, "Installing".
bun-pack: build
	./scripts/package/bun-pack.sh

clean:
	$(CARGO) clean
	rm -rf $(BUILD)

# MLX CUDA (docs/DESIGN.md §3). On a machine with an NVIDIA GPU, Rust and an MLX CUDA install
# (pip mlx-cuda-13==0.32.4; MLX_DIR=its `mlx` package folder): `make test-cuda` runs every kernel
# on the GPU against the CPU kernels (tests/cuda/main.rs), the GPU backward against the CPU's
# (tests/gated_delta/vjp.rs) and MLX autograd through the GPU kernels
# (tests/cpp/gpu_autograd.cc), `make bench-cuda` the GPU benchmark beside
# MLX's own paths and fla (build/bench/bench-cuda.{log,jsonl,png}, tables-cuda.md). Where the
# GPU machine has no Rust, `make cuda-carry` builds the same programs here into build/cuda/carry
# and scripts/cuda/device.sh runs them there.
test-cuda:
	./scripts/cuda/test.sh

bench-cuda:
	./scripts/cuda/bench.sh

cuda-carry:
	./scripts/cuda/build.sh

# ---- Python package (python/, docs/python.md) --------------------------------------------------
# python-wheel: build/wheel/mlxkern-<v>-<python>-<platform>.whl, bundling the release library.
# test-python: the wheel bundling target/debug's library (the optimized profile `make build`
# made), its suite on .venv's MLX and mlx-lm (python/tests; mlx-lm's trainer's imports, rich and
# transformers, pinned into build/py-deps by scripts/python/trainer-deps.sh), then the wheel
# installed into a fresh virtual environment outside the repository with mlx[cpu]==0.32.4 from
# the package index.
# bench-python: mlx-lm prefill and generation tokens/s with and without mlxkern.mlx_lm.patch()
# (build/bench/python.{log,json}; MLXK_BENCH_QUICK=1 for a short run). `make bench` runs the
# short one as its last row (scripts/bench/run.sh; MLXK_BENCH_ONLY=python for it alone).
.PHONY: python-wheel test-python bench-python
python-wheel: bootstrap
	./scripts/python/dev-build.sh

test-python: build
	MLXKERN_LIB=$(LIB) ./scripts/python/dev-build.sh
	./scripts/python/trainer-deps.sh
	PYTHONPATH=build/py-site $(PY) -m unittest discover -s python/tests -v
	./scripts/python/test-fresh-venv.sh

bench-python: build
	MLXKERN_LIB=$(LIB) ./scripts/python/dev-build.sh
	@mkdir -p $(BUILD)/bench
	PYTHONPATH=build/py-site:python/tests $(PY) scripts/python/bench.py $(BUILD)/bench/python.json | tee $(BUILD)/bench/python.log

# ---- Heads sharded across processes (examples/cpp/qwen35_tp.cpp, docs/sharding.md) -------------
# test-distributed: the Gated DeltaNet layer tensor-parallel over MLX's ring backend on 127.0.0.1
# (2 and 4 processes, free ports, each under MLXK_DIST_TIMEOUT seconds), every rank with its own
# heads and state pools, compared with the one-process layer (scripts/test/distributed.sh;
# MLXK_DIST_CASES="RANKS:CONFIG:REDUCE ..." for other cases, MLXK_DIST_SEED to replay).
.PHONY: test-distributed
test-distributed: build
	@mkdir -p $(BUILD)
	CXX=$(CXX) LIBDIR=$(LIBDIR) BUILD=$(abspath $(BUILD)) ./scripts/test/distributed.sh
