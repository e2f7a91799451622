# onnxfuse: `make demo` installs everything and optimizes a bundled model; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   ?= models/lstm_cell.onnx

.PHONY: install aarch64-deps test test-fast demo bench models clean fuzz

install: $(STAMP) aarch64-deps

# --target aarch64 and its qemu test: cross gcc, qemu-user, arm64 libonnxruntime (npm) in .cache/aarch64/.
# A no-op (no apt-get update, no npm) when all are present.
aarch64-deps:
	@scripts/install-aarch64.sh

# System packages first (only what is missing), then the virtualenv with the project in it.
$(STAMP): pyproject.toml
	@command -v gcc >/dev/null || (apt-get update -qq && apt-get install -y -qq gcc)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

test: install
	$(BIN)/pytest -n 2 -q

test-fast: install
	$(BIN)/pytest -q -m "not slow"

models: install
	$(BIN)/python models/make_models.py

demo: install
	$(BIN)/onnxfuse inspect $(DEMO)
	$(BIN)/onnxfuse optimize $(DEMO) -o out/demo.fused.onnx --report out/demo.report.json
	$(BIN)/onnxfuse verify $(DEMO) out/demo.fused.onnx

# Differential fuzzing against onnxruntime (tests/fuzz/): FUZZ_SECONDS (default 1500), FUZZ_SEED,
# FUZZ_BATCH, FUZZ_JOBS, FUZZ_OUT (default out/fuzz). Fails on any finding that is not a known bug.
fuzz: install
	cd tests && FUZZ_OUT=$${FUZZ_OUT:-$(CURDIR)/out/fuzz} PYTHONPATH=. ../$(BIN)/python -m fuzz

clean:
	rm -rf out build *.egg-info .pytest_cache

# Benchmarks (benchmarks/run.py): tables on stdout, JSON + markdown in benchmarks/results/.
.PHONY: bench-trees bench-cells
bench: install
	$(BIN)/python benchmarks/run.py models

bench-trees: install
	$(BIN)/python benchmarks/run.py trees

bench-cells: install
	$(BIN)/python benchmarks/run.py cells
