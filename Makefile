# The few commands people need. Each installs what it needs first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python

.PHONY: run test test-slow test-reliability lint typecheck bench install install-dev clean-data

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --progress-bar on --upgrade pip

$(VENV)/.installed: $(BIN)/activate requirements.txt
	$(PY) -m pip install --progress-bar on -r requirements.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --progress-bar on -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

## First command: install and run everything on the embedded defaults.
run: install
	$(PY) manage.py runstack

## Second command: install test tools and run the test suite (not the slow marks).
test: install-dev
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: install-dev
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

## The whole fault-injection and security suite, slow parts included (the default run has a subset).
test-reliability: install-dev
	$(PY) -m pytest tests/reliability $(PYTEST_ARGS)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install-dev
	$(BIN)/mypy .

bench: install-dev
	$(PY) -m bench $(BENCH_ARGS)

clean-data:
	@echo "This deletes the embedded database and broker folders in .data/"; rm -rf .data
