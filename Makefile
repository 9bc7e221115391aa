# The two commands of the README: `make run` and `make test`. Both set themselves up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NODE_STAMP := node_modules/.installed

.PHONY: setup browser run test test-unit check bench lint clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

setup: $(STAMP) $(NODE_STAMP)

# The console's browser tests drive Debian's chromium through chromium-driver (explicit paths, no
# driver download): installed here when missing (apt-get, through sudo when not root and sudo exists).
CHROMIUM     ?= /usr/bin/chromium
CHROMEDRIVER ?= /usr/bin/chromedriver
browser:
	@if [ ! -x $(CHROMIUM) ] || [ ! -x $(CHROMEDRIVER) ]; then \
	  echo "installing chromium and chromium-driver (Debian) for the browser tests ..."; \
	  if [ "$$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends chromium chromium-driver; \
	fi

run: setup
	$(PY) -m local.stack

# REQUIRE_BROWSER=1: a browser missing after the browser step fails tests/browser instead of skipping them.
# -n 2 --dist loadfile: two workers, each running whole files, so a module's stack serves all its tests.
# HYPOTHESIS_PROFILE=ci: the same example counts, no per-example deadline (tests/conftest.py).
test: setup browser
	HYPOTHESIS_PROFILE=ci REQUIRE_BROWSER=1 $(PY) -m pytest -n 2 --dist loadfile

test-unit: setup
	$(PY) -m pytest -m "not integration"

# The fast inner loop: the unit tests and the linters (ruff, mypy, import-linter), no stack.
check: setup
	$(PY) -m pytest -q -m "not integration" tests/unit tests/test_lint.py

bench: setup
	$(PY) -m bench

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) node_modules .local .pytest_cache .import_linter_cache
