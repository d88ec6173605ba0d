# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck bench bench-compare clean install browser

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/mscheduler demo

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
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
