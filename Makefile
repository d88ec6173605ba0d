# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck bench clean install browser

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/mscheduler demo

test: $(VENV)/.installed
	$(BIN)/python -m pytest

# Debian's chromium for the dashboard's browser tests (tests/browser skip without it). Playwright
# drives it; `playwright install` is never used (its browser downloads need the internet).
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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
