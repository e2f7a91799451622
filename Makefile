# onnxfuse: `make demo` installs everything and optimizes a bundled model; `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   ?= models/lstm_cell.onnx

.PHONY: install aarch64-deps view-deps test test-fast lint demo bench models clean fuzz

install: $(STAMP) aarch64-deps view-deps

# --target aarch64 and its qemu test: cross gcc, qemu-user, arm64 libonnxruntime (npm) in .cache/aarch64/.
# A no-op (no apt-get update, no npm) when all are present.
aarch64-deps:
	@scripts/install-aarch64.sh

# The HTML plan view (--html): graphviz lays it out, chromium runs its tests headless. Only what is
# missing is installed; the package lists are refreshed only if the install needs it.
view-deps:
	@missing="$$(command -v dot >/dev/null || echo graphviz) $$(command -v chromium >/dev/null || echo chromium)"; \
	  [ -z "$$(echo $$missing)" ] || apt-get install -y -qq $$missing || \
	  (apt-get update -qq && apt-get install -y -qq $$missing)

# System packages first (only what is missing), then the virtualenv with the project in it.
$(STAMP): pyproject.toml
	@command -v gcc >/dev/null || (apt-get update -qq && apt-get install -y -qq gcc)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

test: install lint
	$(BIN)/pytest -n 2 -q

lint: install
	$(BIN)/ruff check .

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
# bench-corpus times the exported corpus (benchmarks/corpus.py --time, docs/corpus.md);
# corpus-check only optimizes and verifies it (exit 1 on a mismatch).
.PHONY: bench-recurrent bench-trees bench-cells bench-repeat bench-corpus corpus-check bench-install bench-peers bench-default bench-dense
bench: install bench-install bench-corpus
	$(BIN)/python benchmarks/run.py models
	$(BIN)/python benchmarks/run.py repeat

# The `bench` extra: IREE and OpenVINO, the peers `make bench` times beside onnxruntime and TVM.
BENCH_STAMP := $(VENV)/.bench-installed
bench-install: $(BENCH_STAMP)
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,bench]'
	@touch $@

# onnxfuse against IREE and OpenVINO alone (1 thread, no TVM): benchmarks/results/peers.md.
bench-peers: install bench-install
	$(BIN)/python benchmarks/run.py peers

bench-corpus: install
	$(BIN)/python benchmarks/corpus.py --time

corpus-check: install
	$(BIN)/python benchmarks/corpus.py

# The default output against onnxruntime on every bundled, corpus and light model (docs/selection.md).
bench-default: install
	$(BIN)/python benchmarks/default_sweep.py

# Dense layers of many K x N (MLP shapes the bundled models lack) under the default (docs/benchmarks.md).
bench-dense: install
	$(BIN)/python benchmarks/dense_layers.py

bench-trees: install
	$(BIN)/python benchmarks/run.py trees

bench-cells: install
	$(BIN)/python benchmarks/run.py cells

bench-recurrent: install
	$(BIN)/python benchmarks/run.py recurrent

bench-repeat: install
	$(BIN)/python benchmarks/run.py repeat

# The corpus of real exporter outputs (models/exported/README.md). Not run by CI, which tests the
# committed files. The exporters live in three virtualenvs outside the repository (their pins
# conflict with each other and with the project's); created on first use, paths overridable.
CORPUS_VENV    ?= $(HOME)/.cache/onnxfuse-corpus/torch-venv
CORPUS_HB_VENV ?= $(HOME)/.cache/onnxfuse-corpus/hb-venv
CORPUS_TF_VENV ?= $(HOME)/.cache/onnxfuse-corpus/tf-venv
.PHONY: corpus
corpus:
	@test -x $(CORPUS_VENV)/bin/python || ($(PYTHON) -m venv $(CORPUS_VENV) && \
	  $(CORPUS_VENV)/bin/pip install -q torch==2.13.0 onnxscript==0.7.2 onnx-ir==1.1.0 \
	    transformers==5.23.0 onnx==1.23.2 onnxruntime==1.32.0 numpy==2.4.6)
	@test -x $(CORPUS_HB_VENV)/bin/python || ($(PYTHON) -m venv $(CORPUS_HB_VENV) && \
	  $(CORPUS_HB_VENV)/bin/pip install -q torch==2.13.0 hummingbird-ml==0.4.12 \
	    scikit-learn==1.9.1 lightgbm==4.7.0 xgboost==3.2.0 onnx==1.16.1 onnxruntime==1.32.0 \
	    onnxconverter-common==1.16.0 skl2onnx==1.20.0 numpy==2.4.6 scipy==1.17.1)
	@test -x $(CORPUS_TF_VENV)/bin/python || ($(PYTHON) -m venv $(CORPUS_TF_VENV) && \
	  $(CORPUS_TF_VENV)/bin/pip install -q tensorflow-cpu==2.19.1 keras==3.15.1 tf2onnx==1.17.0 \
	    onnx==1.22.0 onnxruntime==1.32.0 numpy==2.1.3 protobuf==5.29.6)
	HF_HUB_OFFLINE=1 $(CORPUS_VENV)/bin/python models/exported/make_corpus.py torch
	$(CORPUS_HB_VENV)/bin/python models/exported/make_corpus.py trees
	$(CORPUS_TF_VENV)/bin/python models/exported/make_corpus.py keras
