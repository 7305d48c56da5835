# kvspec: `make report` runs the default specs and prints the invariant report;
# `make test` runs the PR test tier. Both bootstrap .venv idempotently on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PYTHONHASHSEED := 0

.PHONY: venv report test test-full lint gate bench-guard clean sglang-env test-sglang vllm-env test-vllm

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU wheel that these machines provide; an unpinned torch pulls CUDA packages
	$(PY) -m pip install --quiet torch==2.13.0
	# ray: `--ray-address` (explore, campaign, report) and its tests on a local cluster
	$(PY) -m pip install --quiet -e '.[dev,ray]'
	touch $(STAMP)

# every spec × its matrix cells and the memory-layer cells, one worker per CPU; prints the table,
# writes report/{report.json,junit.xml,report.md,report.html}; exit 1 on any failure
report: $(STAMP)
	$(VENV)/bin/kvspec report --out report

# ruff (format + check, 100 columns: pyproject.toml) over the code, mypy over engine/ and
# invariants/ (its settings: pyproject.toml; the drivers run under other interpreters), then
# the catalog's YAML and fixtures; the size budgets and the layering are tests
# (tests/test_style_budget.py, tests/test_layers.py)
LINTED := engine kernels invariants tests
lint: $(STAMP)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/mypy
	$(VENV)/bin/kvspec invariants lint

test: $(STAMP)
	$(PY) -m pytest -n 2 --hypothesis-profile=ci -m "not slow"

# every bug-zoo mutant against the default gate alone (the report's cells and explore's default
# campaign, no trigger): exit 1 if one with a state effect is missed; ~6 min on 2 cores
gate: $(STAMP)
	$(VENV)/bin/kvspec bugs --gate --workers 2

# what checking costs, guarded: the sim engine's full ÷ off steps, paired within rounds of one
# run (never an absolute time), must stay at or under kvspec bench sim's --max-ratio (2.5; it
# measures 1.8-2.0 here, 3.1-4.3 before issue 31); exit 1 naming each cell over it; ~10 s
bench-guard: $(STAMP)
	$(VENV)/bin/kvspec bench sim --check --batch 8,32 --pool 65536 --modes off,full \
		--runs 5 --steps 200 --out /dev/null

test-full: $(STAMP)
	$(PY) -m pytest -n 2 --hypothesis-profile=full -m "slow or not slow"

# real SGLang on CPU: one venv per release, each a thin layer over .sglang-base (the CPU torch
# wheel and the default release's requirements), its recipe derived from the wheel's own declared
# requirements (invariants/targets/sglang_scheduler/requirements.py). 0.5.23 (default) in
# .sglang-venv, any other release from 0.5.10 in .sglang-venv-<version>, SGLANG_VERSION=all for
# every one; SGLANG_SRC=PATH builds a checkout over the nearest release. Idempotent.
SGLANG_VERSION ?= 0.5.23
SGLANG_SRC ?=
sglang-env: $(STAMP)
	$(VENV)/bin/kvspec sglang env $(if $(SGLANG_SRC),--src $(SGLANG_SRC),--version $(SGLANG_VERSION))

# the sglang targets (invariants/targets/sglang*/): brings 0.5.23 and 0.5.10.post1 up to their
# recipes (no-ops when built), then the adapter tests (real SGLang under the catalog, fault
# injection, one differential spec) and the real-scheduler tests (0.5.23 clean on the default
# specs; 0.5.10.post1's #22862 leak found; a checkout of 0.5.10.post1's source tree; the adapter
# probes under a development version)
test-sglang: $(STAMP)
	$(VENV)/bin/kvspec sglang env --version 0.5.23,0.5.10.post1
	$(PY) -m pytest -p no:cacheprovider -m sglang tests/invariants/targets

# real vLLM on CPU in its own venv, for the vllm target (invariants/targets/vllm/): its v1 Scheduler and
# KVCacheManager with a faked model runner. 0.33.0 (default) in .vllm-venv; `make vllm-env
# VLLM_VERSION=0.30.0` into .vllm-venv-0.30.0 (point $KVSPEC_VLLM_PYTHON at it). Idempotent.
VLLM_VERSION ?= 0.33.0
vllm-env:
	VLLM_VERSION=$(VLLM_VERSION) bash ci/vllm_env.sh

# the vllm target's tests: engine-neutral specs clean on vLLM, planted block-pool faults caught
test-vllm: $(STAMP)
	VLLM_VERSION=0.33.0 bash ci/vllm_env.sh
	$(PY) -m pytest -p no:cacheprovider -m vllm tests/invariants/targets

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis report
