# The two commands: `make demo` (run the demo batch) and `make test` (the test suite).
# Each creates .venv from the repo's own files when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.agentbatch-installed
BFCL_EVAL := bfcl-eval==2026.3.23

.PHONY: demo test install lint typecheck bench clean-demo

$(STAMP): pyproject.toml examples/plugin_toolbench/pyproject.toml integrations/inspect_agentbatch/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# bfcl-eval with its data but without its heavy ML extras (torch, transformers, faiss, CUDA)
	$(BIN)/python -m pip install -q --no-deps '$(BFCL_EVAL)'
	# the example plugin package (docs/plugins.md); the tests run it through the stock CLI
	$(BIN)/python -m pip install -q --no-deps -e examples/plugin_toolbench
	# inspect_ai's `agentbatch/<model>` provider (docs/gateway.md); inspect_ai comes with the dev extra
	$(BIN)/python -m pip install -q --no-deps -e integrations/inspect_agentbatch
	touch $(STAMP)

# Install (or update) agentbatch into .venv without running anything.
install: $(STAMP)

demo: $(STAMP)
	mkdir -p runs
	$(BIN)/agentbatch run examples/bfcl_demo.yaml --db sqlite:///runs/demo.sqlite --report runs/demo-report

# The suite in TEST_WORKERS parallel pytest-xdist workers: most tests wait on subprocesses, servers
# and I/O, so more workers than cores pay off (measured: docs/architecture.md). Tests that share an
# expensive module fixture stay on one worker (xdist_group marks, --dist loadgroup).
TEST_WORKERS ?= 4
test: $(STAMP)
	# Bytecode written once: under PYTHONDONTWRITEBYTECODE each of the ~150 agentbatch processes that
	# the tests start would compile the package again (~0.25 s CPU each); stale files are never used.
	$(BIN)/python -m compileall -q agentbatch examples/plugin_toolbench integrations/inspect_agentbatch
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check agentbatch tests bench integrations

# mypy over the package, strict on scheduling/, protocols/, sim/ and db/ (pyproject.toml [tool.mypy])
typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/orchestration_overhead.py

clean-demo:
	rm -rf runs
