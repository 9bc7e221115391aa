# The two commands of the README: `make run` and `make test`. Both set themselves up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NODE_STAMP := node_modules/.installed

.PHONY: setup run test test-unit bench lint clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

setup: $(STAMP) $(NODE_STAMP)

run: setup
	$(PY) -m local.stack

test: setup
	$(PY) -m pytest

test-unit: setup
	$(PY) -m pytest -m "not integration"

bench: setup
	$(PY) -m bench

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

clean:
	rm -rf $(VENV) node_modules .local .pytest_cache
