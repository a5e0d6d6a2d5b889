# One-command set-up: `make demo` runs the offline tiny demo, `make test` passes the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_DIR ?= runs/tiny-demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: install demo test lint clean

$(BIN)/rlctl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: a CPU wheel on CPU machines, the CUDA build on GPU machines.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/rlctl

install: $(BIN)/rlctl

demo: install
	$(BIN)/rlctl train --preset tiny-demo --run-dir $(RUN_DIR)

lint: install
	$(BIN)/ruff check rlctl tests

test: lint
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
