# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv themselves:
# `make demo` with only what the demo needs (the package's dependencies: no web server, no test
# tools), `make test` with the whole development set; `make dev` adds the web extra and serves
# the example app.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo dev test lint typecheck bench bench-compare clean install browser dist

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.demo-installed $(VENV)/.web-installed $@

# The demo runs from the checkout: its venv gets the package's dependencies only (building and
# installing the package itself would cost a build backend in an isolated environment first).
$(VENV)/.demo-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > $(VENV)/demo-requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r $(VENV)/demo-requirements.txt
	touch $@

$(VENV)/.web-installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[web]'
	touch $(VENV)/.demo-installed $@

install: $(VENV)/.installed

demo: $(VENV)/.demo-installed
	PYTHONPATH=. $(BIN)/python -m mscheduler demo

dev: $(VENV)/.web-installed
	$(BIN)/mscheduler dev examples.shop:app

# An sdist and a wheel in dist/, checked as PyPI would (twine check: metadata, README rendering).
dist: $(VENV)/.installed
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/twine check --strict dist/*

# On every core (pytest-xdist): a test file's tests stay together on one worker (--dist loadfile),
# as the module fixtures (a browser, a built package, a served API) ask.
test: $(VENV)/.installed
	$(BIN)/python -m pytest -n auto --dist loadfile

# Debian's chromium for the dashboard's browser tests (tests/browser skip without it, and fail if
# it is installed but cannot be launched). Playwright drives it; `playwright install` is never
# used (its browser downloads need the internet).
CHROMIUM ?= /usr/bin/chromium
browser:
	test -x $(CHROMIUM) || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

lint: $(VENV)/.installed
	$(BIN)/ruff check mscheduler tests benchmarks examples
	$(BIN)/ruff format --check mscheduler tests benchmarks examples
	$(BIN)/lint-imports  # the layers and no import cycles (pyproject.toml [tool.importlinter])

typecheck: $(VENV)/.installed
	$(BIN)/mypy

bench: $(VENV)/.installed
	$(BIN)/python -m benchmarks.run_all

# This checkout against another commit, alternating (benchmarks/compare.py): the burn-down, the
# 1 ms round trip and publishing, e.g. `make bench-compare REF=3e04b83` (ROUNDS, SCENARIOS, TASKS).
REF ?= HEAD
ROUNDS ?= 3
SCENARIOS ?= burn_down,burn_down_rtt,send_many,send
TASKS ?= 10000
bench-compare: $(VENV)/.installed
	rm -rf .bench-ref && git worktree prune && git worktree add --detach .bench-ref $(REF)
	$(BIN)/python -m benchmarks.compare --build ref=.bench-ref --build now=. \
		--rounds $(ROUNDS) --scenarios $(SCENARIOS) --tasks $(TASKS); \
		status=$$?; git worktree remove --force .bench-ref; exit $$status

clean:
	rm -rf $(VENV) dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
