# kvspec: `make report` runs the default specs and prints the invariant report;
# `make test` runs the PR test tier. Both bootstrap .venv idempotently on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PYTHONHASHSEED := 0

.PHONY: venv report test test-full lint clean sglang-env

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU wheel that these machines provide; an unpinned torch pulls CUDA packages
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

report: $(STAMP)
	$(VENV)/bin/kvspec report

lint: $(STAMP)
	$(VENV)/bin/kvspec invariants lint

test: $(STAMP)
	$(PY) -m pytest -n 2 --hypothesis-profile=ci

test-full: $(STAMP)
	$(PY) -m pytest -n 2 --hypothesis-profile=full -m "slow or not slow"

# real SGLang 0.5.23 on CPU, for `kvspec bench anchor --sglang` (not needed by report or test)
sglang-env:
	bash ci/sglang_env.sh

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
