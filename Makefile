# fedpipe — the two commands of the quick start are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast test-exhaustive test-presets lint bench params clean-venv smoke ui exps estimate claims-docs sequential

# Every paper's smoke study (conf/study/*_smoke.yaml), each a `dvc exp run` named after its study, queued
# and run SMOKE_JOBS at a time (one per core, one torch thread each unless FEDPIPE_THREADS says
# otherwise: the README's numbers), then each one's claims. SMOKE_STUDIES and SMOKE_ARGS (extra -S
# overrides for every study) narrow it: make smoke SMOKE_STUDIES=fednh_smoke
SMOKE_STUDIES := $(patsubst conf/study/%.yaml,%,$(wildcard conf/study/*_smoke.yaml))
SMOKE_JOBS    ?= 2
SMOKE_ARGS    ?=

# Create .venv if missing, install the pinned lock, then the package itself (editable, no deps).
$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)

run: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro

smoke: $(STAMP)
	@export PATH="$(abspath $(BIN)):$$PATH" FEDPIPE_THREADS="$${FEDPIPE_THREADS:-1}"; \
	for s in $(SMOKE_STUDIES); do \
	  dvc exp remove $$s >/dev/null 2>&1; \
	  dvc exp run --queue --name $$s -S study=$$s $(SMOKE_ARGS) || exit 1; \
	done; \
	dvc exp run --run-all --jobs $(SMOKE_JOBS); \
	rc=0; for s in $(SMOKE_STUDIES); do \
	  echo "== study=$$s"; \
	  python -m fedpipe.claims --exp $$s || rc=1; \
	done; exit $$rc

# The per-study claims tables of docs/results.md, generated: each smoke (and mnist5k) study's
# claims.json from its DVC experiment to docs/runs/<study>.claims.json where one exists, then every
# `<!-- claims: <study> -->` block regenerated from those files (a study without one: "re-run").
CLAIMS_STUDIES := $(SMOKE_STUDIES) equitable_mnist5k
claims-docs: $(STAMP)
	$(BIN)/python -m fedpipe.claims --collect $(CLAIMS_STUDIES) --update-docs docs/results.md

# Sequential mode (docs/claims.md): one study's replicates added in steps until its papers' claims are
# held or contradicted, each look a `dvc exp run` of the first n replicates (only the new ones run).
# make sequential STUDY=fedddpm_smoke MIN=5 MAX=14 STEP=3 [ARGS="-S fl.rounds=5 --json PATH"]
# `make smoke` keeps its fixed replicate counts.
MIN  ?= 5
MAX  ?= 14
STEP ?= 3
sequential: $(STAMP)
	@test -n "$(STUDY)" || { echo "usage: make sequential STUDY=<study> [MIN=5 MAX=14 STEP=3 ARGS=\"-S override ...\"]"; exit 2; }
	PATH="$(abspath $(BIN)):$$PATH" FEDPIPE_THREADS="$${FEDPIPE_THREADS:-1}" $(BIN)/python -m fedpipe.sequential $(STUDY) --min $(MIN) --max $(MAX) --step $(STEP) $(ARGS)

# Two test processes (one per core), a test file per process (module fixtures and order kept), the
# files in tests/conftest.py's order, longest first (xdist's own reorder, by test count, would start
# the end-to-end DVC files last). A fault sweep runs a fixed sample of its cases (marker
# `exhaustive`: the rest; make test-exhaustive).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not at_size and not exhaustive"

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not at_size and not exhaustive"

# make test and the rest of every sweep (marker `exhaustive`)
test-exhaustive: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not at_size"

# Every paper preset's slice at full size on stand-in data (tests/test_presets_at_size.py): tens of
# minutes per preset on a 2-core CPU, so not part of make test; PRESETS=<study> narrows it.
test-presets: $(STAMP)
	$(BIN)/python -m pytest -q -m at_size tests/test_presets_at_size.py $(if $(PRESETS),-k "$(PRESETS)")

# The MLflow UI on the project's runs (artifact locations first moved to where the repository now is,
# the runs still spooled by stages replayed: fedpipe.tracking.sync).
# Options for `mlflow ui`: make ui UI_ARGS="--port 5001"
ui: $(STAMP)
	$(BIN)/python -m fedpipe.tracking.ui $(UI_ARGS)

# DVC's experiments in one table within 120 columns: each method's accuracy, the claim count.
exps: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m fedpipe.exps

# Cost of a study before a long run (fedpipe.estimate): one replicate of every stage at full size
# (stand-in data for torchvision datasets), measured and projected to the whole study.
# make estimate STUDY=fedptr_cifar10 ARGS="partition.alpha=0.04 --json est.json"  (ARGS: overrides as
# dvc exp run -S takes them, and python -m fedpipe.estimate --help's options)
estimate: $(STAMP)
	@test -n "$(STUDY)" || { echo "usage: make estimate STUDY=<study> [ARGS=\"override ... --json PATH\"]"; exit 2; }
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m fedpipe.estimate $(STUDY) $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src stages tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_overhead.py

clean-venv:
	rm -rf $(VENV)

# Recompose params.yaml from conf/ (as `dvc exp run` would) after editing a config group.
params: $(STAMP)
	$(BIN)/python -m fedpipe.pipeline.compose
