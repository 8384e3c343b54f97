# The few commands people need. Each installs what it needs first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python

.PHONY: run test test-slow test-llm screenshots test-reliability lint typecheck bench install install-dev clean-data

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
	$(PY) -m pytest -m "not slow and not llm" $(PYTEST_ARGS)

test-slow: install-dev
	$(PY) -m pytest -m "slow and not llm" $(PYTEST_ARGS)

# A real model server (llama-cpp-python with Gemma 3 270M) in .venv-llm, apart from the app's environment.
# The first install compiles llama.cpp (5 to 10 minutes on 2 cores; longer on slower machines), for a portable
# x86-64 CPU: its AVX-512 and AMX kernels crash on some virtual machines. --no-cache-dir: pip's cache could
# hand back a wheel compiled with other flags.
LLM := .venv-llm
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_OPENMP=OFF
$(LLM)/.installed: requirements-llm.txt
	$(PYTHON) -m venv $(LLM)
	$(LLM)/bin/python -m pip install --progress-bar on --upgrade pip
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(LLM)/bin/python -m pip install --progress-bar on --no-cache-dir \
		-r requirements-llm.txt
	touch $@

## The app against a real local model server (not part of make test).
test-llm: install-dev $(LLM)/.installed
	LLAMA_SERVER_PYTHON=$(LLM)/bin/python $(PY) -m pytest -m llm tests/real_model $(PYTEST_ARGS)

## The pictures of docs/img/: the browser tests that take them, run against their throwaway test database.
SHOTS := long_chat or curation_desk or staff_reply_arrives or staff_live_chat or expired_sign_in or context_inspector or cut_off
screenshots: install-dev
	SCREENSHOTS_DIR=docs/img $(PY) -m pytest tests/browser -k "$(SHOTS)" $(PYTEST_ARGS)

## The whole fault-injection and security suite, slow parts included (the default run has a subset).
test-reliability: install-dev
	$(PY) -m pytest tests/reliability $(PYTEST_ARGS)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# mypy's Django plugin imports the settings; a database URL that is never opened keeps that import from
# starting the embedded PostgreSQL (which nothing would stop afterwards).
typecheck: install-dev
	DATABASE_URL=postgres://typecheck@127.0.0.1:1/never-opened $(BIN)/mypy .

# The peers (LangGraph, Mem0, locust) live in .venv-peers, layered over .venv: mem0ai needs protobuf<7.
PEERS := .venv-peers
$(PEERS)/.installed: $(VENV)/.installed-dev requirements-bench.txt
	$(PYTHON) -m venv $(PEERS)
	$(PY) -c "import site; print(site.getsitepackages()[0])" > $(PEERS)/lib/python3.11/site-packages/_app_venv.pth
	$(PEERS)/bin/python -m pip install --progress-bar on -r requirements-bench.txt
	touch $@

bench: install-dev $(PEERS)/.installed
	$(PEERS)/bin/python -m bench $(BENCH_ARGS)

clean-data:
	@echo "This deletes the embedded database and broker folders in .data/"; rm -rf .data
