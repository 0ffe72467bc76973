# rlx — set-up, build and test entry points.
#
#   make demo    set up (apt, .venv, editable build) and generate text
#   make test    set up and run every test: pytest, C tests under valgrind and TSan, ASan+UBSan, Vulkan,
#                fuzz (5 s a target), lint
#   make format  rewrite the C files with clang-format (.clang-format) and fix what ruff can; make lint checks
#   make fuzz    fuzz the config / weights / tokenizer / GGUF loaders and the TCP wire, 1,000,000 inputs a target
#   make build   set up and build the extension in place (rlx/_C*.so)
#   make bench   set up the benchmark extras and run rlx beside llama.cpp (benchmarks/bench_fair.py:
#                short and long contexts, the plot) and transformers (hours)
#   make bench-quick   rlx beside llama.cpp, reduced (Qwen3-0.6B bf16, 2 threads, 3 rounds: minutes)
#   make bench-smoke   the fair harness end to end, both suites, 2 rounds (a check, not a measurement)
#   make clean   remove build outputs (keeps .venv; `make distclean` removes it too)
#
# Every step is keyed on stamp files so that a second run with nothing changed
# takes seconds:
#   build/stamps/apt.mk      system packages present   (Makefile: APT_PACKAGES)
#   .venv/.rlx-deps          venv + Python deps        (pyproject.toml, setup.py)
#   .venv/.rlx-bench         benchmark extras [bench]  (pyproject.toml, setup.py)
#   build/stamps/csrc-list   the set of files under csrc/ (rewritten only when it changes)
#   rlx/_C<suffix>.so        the in-place extension    (every csrc/ source and header)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
VPIP   := $(VPY) -m pip --disable-pip-version-check
STAMPS := build/stamps

# System packages (Debian names). Add new ones here. Vulkan: headers + loader, Mesa's lavapipe
# (the CPU driver the tests run on), the shader compiler and validator, the validation layer.
# clang-15: libFuzzer for the C fuzz target tcp_wire (tools/fuzz.mk); 15 because Mesa already brings
# its libllvm15 (clang-15 adds ~29 MB to download; clang-14 would add libllvm14 too).
APT_PACKAGES := build-essential pkg-config libopenblas-dev libssl-dev valgrind openmpi-bin libopenmpi-dev \
                libvulkan-dev mesa-vulkan-drivers glslc spirv-tools vulkan-validationlayers clang-15 \
                clang-format-14
# A Debian system Python (or none at all) needs python3, its venv module and
# its headers as packages too; a pyenv/other Python brings its own.
PY_IS_OTHER := $(shell $(PYTHON) -c 'import sys; print(int(sys.base_prefix != "/usr"))' 2>/dev/null)
ifneq ($(PY_IS_OTHER),1)
APT_PACKAGES += python3 python3-dev python3-venv
endif

# Ask the venv's Python when there is one (it may differ from $(PYTHON)).
EXT_SUFFIX := $(shell $(if $(wildcard $(VPY)),$(VPY),$(PYTHON)) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
EXT_SO     := rlx/_C$(EXT_SUFFIX)
CSRC_FILES := $(shell find csrc -type f \( -name '*.c' -o -name '*.h' -o -name '*.inc' -o -name '*.comp' -o -name '*.glsl' -o -name '*.list' \) 2>/dev/null | LC_ALL=C sort)

.PHONY: help setup build demo test format lint test-py test-c test-tsan test-asan test-vulkan fuzz bench bench-quick \
        bench-smoke clean \
        distclean FORCE

help:
	@sed -n '3,13p' Makefile | sed 's/^# \{0,1\}//'

# ---------------------------------------------------------------- set-up ----

# The apt stamp is an included makefile: GNU make remakes it first and then
# restarts, so values computed with $(shell ...) below see the new packages
# (e.g. python3 on a bare machine). Not for clean/help.
NO_SETUP_GOALS := clean distclean help
ifneq ($(filter-out $(NO_SETUP_GOALS),$(or $(MAKECMDGOALS),help)),)
include $(STAMPS)/apt.mk
endif

$(STAMPS)/apt.mk: Makefile
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "error: missing system packages:$$missing" >&2; \
	    echo "       run as root:  apt-get update && apt-get install -y$$missing" >&2; \
	    exit 1; \
	  fi; \
	  echo "== apt-get install -y$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq; \
	  apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p $(STAMPS) && echo '# system packages checked: $(APT_PACKAGES)' > $@

$(VPY): | $(STAMPS)/apt.mk
	$(PYTHON) -m venv $(VENV)

# Dependencies and the editable finder only (RLX_NO_EXT=1): a C compile error
# must not leave the venv half set up. The extension is built by the rule below.
$(VENV)/.rlx-deps: pyproject.toml setup.py | $(VPY)
	@echo "== pip: setuptools, numpy, then pip install -e .[test]"
	$(VPIP) install -q -U pip "setuptools>=64" wheel "numpy>=1.23"
	RLX_NO_EXT=1 $(VPIP) install -q --no-build-isolation -e '.[test]'
	@touch $@

# Benchmark extras (pyproject.toml [bench]). Built with isolation: llama-cpp-python
# compiles llama.cpp from source (several minutes on 2 cores) and needs its own build deps.
# GGML_NATIVE=ON builds the peer for this CPU, as a user compiling it here would.
$(VENV)/.rlx-bench: pyproject.toml setup.py $(VENV)/.rlx-deps
	@echo "== pip install -e .[test,bench] (llama-cpp-python compiles llama.cpp: minutes)"
	CMAKE_ARGS="$${CMAKE_ARGS:--DGGML_NATIVE=ON}" RLX_NO_EXT=1 $(VPIP) install -q -e '.[test,bench]'
	@touch $@

# The list of csrc/ files, rewritten only when a file appears or disappears, so
# that deleting a source also triggers a rebuild.
$(STAMPS)/csrc-list: FORCE
	@mkdir -p $(STAMPS)
	@printf '%s\n' $(CSRC_FILES) > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv -f $@.tmp $@; fi

$(EXT_SO): $(CSRC_FILES) $(STAMPS)/csrc-list setup.py tools/build_shaders.py $(VENV)/.rlx-deps
	@echo "== build_ext --inplace ($(EXT_SO))"
	$(VPY) setup.py -q build_ext --inplace --force --build-temp build/temp
	@touch $@

setup: $(VENV)/.rlx-deps
build: $(EXT_SO)

# ------------------------------------------------------------------ jobs ----

demo: build
	$(VPY) -m rlx demo

test: build
	PYTHON=$(VPY) tools/run_all_tests.sh

# Single phases, for working on one of them.
test-py: build
	$(VPY) -m pytest tests -q
test-c: $(STAMPS)/apt.mk
	PYTHON=$(VPY) tools/run_c_tests.sh
test-tsan: $(STAMPS)/apt.mk
	PYTHON=$(VPY) tools/run_c_tests.sh --tsan
test-asan: $(VENV)/.rlx-deps
	PYTHON=$(VPY) tools/run_asan_tests.sh
# tests/vulkan on lavapipe with validation (as `make test` runs it)
test-vulkan: build
	VK_DRIVER_FILES=$${VK_DRIVER_FILES:-$$(ls /usr/share/vulkan/icd.d/lvp_icd.*.json 2>/dev/null | head -1)} \
	RLX_VULKAN_VALIDATION=1 $(VPY) -m pytest tests/vulkan -q

# One C style and one Python lint (tools/lint.sh; the last phase of `make test` checks them).
format: $(VENV)/.rlx-deps $(STAMPS)/apt.mk
	PYTHON=$(VPY) tools/lint.sh --fix
lint: $(VENV)/.rlx-deps $(STAMPS)/apt.mk
	PYTHON=$(VPY) tools/lint.sh

# Coverage-guided fuzzing (tests/fuzz/, tests/README.md): each target for 1,000,000 inputs (the C target
# tcp_wire is built by tools/fuzz.mk with clang-15).
fuzz: build
	PYTHON=$(VPY) tools/run_fuzz.sh --runs 1000000

# Side-by-side benchmarks (benchmarks/README.md): rlx beside llama.cpp in the fair harness (each
# engine in its own process, taking turns; a logits gate first; it waits for a quiet machine),
# batched decode beside llama.cpp's, the plot of decode speed against context, then the
# transformers comparison and the matvec probe.
bench: build $(VENV)/.rlx-bench
	$(VPY) benchmarks/bench_fair.py --readme --wait-quiet 0.5
	$(VPY) benchmarks/bench_fair.py --suite long --profile --readme --wait-quiet 0.5
	$(VPY) benchmarks/bench_batch.py --readme --wait-quiet 0.5
	$(VPY) benchmarks/plot_fair.py
	$(VPY) benchmarks/bench_matvec.py
	$(VPY) benchmarks/bench_generate.py --check
bench-quick: build $(VENV)/.rlx-bench
	$(VPY) benchmarks/bench_fair.py --quick
bench-smoke: build $(VENV)/.rlx-bench
	$(VPY) benchmarks/bench_fair.py --smoke
	$(VPY) benchmarks/bench_fair.py --smoke --suite long
	$(VPY) benchmarks/bench_batch.py --smoke

# ----------------------------------------------------------------- clean ----

clean:
	rm -rf build *.egg-info
	find rlx \( -name '_C*.so' -o -name '_mpi*.so' \) -delete 2>/dev/null || true
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true

distclean: clean
	rm -rf $(VENV) .pytest_cache .hypothesis
