# The README's commands. Each target does its own set-up on a fresh machine.
#   make setup   create .venv (CPU torch 2.13.0 on machines without a GPU) and install the project (+dev)
#   make test    setup + the embedded corpus + the full test suite (what CI runs)
#   make demo    setup + the end-to-end demo (corpus, TP=2 training, eval vs baseline, HF export)
#   make data    the embedded corpus: tokenizer + MDS shards from the Python stdlib sources
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.cplm-setup-stamp
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_GPU),1)
  PIP_CONSTRAINT_ARGS :=
  TORCH_REQ :=
  EXTRAS := dev,gpu
else
  PIP_CONSTRAINT_ARGS := -c requirements/constraints-cpu.txt
  TORCH_REQ := torch==2.13.0
  EXTRAS := dev
endif
PIP := $(BIN)/python -m pip -q --disable-pip-version-check
DATA_DIR ?= data/stdlib
PYTEST_ARGS ?=

.PHONY: setup test demo data lint clean-data

setup: $(STAMP)

$(STAMP): setup.py requirements/constraints-cpu.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	@if [ -n "$(TORCH_REQ)" ]; then $(PIP) install $(PIP_CONSTRAINT_ARGS) "$(TORCH_REQ)"; fi
	$(PIP) install $(PIP_CONSTRAINT_ARGS) --no-deps mosaicml-streaming==0.13.0
	DS_BUILD_OPS=0 $(PIP) install $(PIP_CONSTRAINT_ARGS) --no-build-isolation -e ".[$(EXTRAS)]"
	@touch $@
	@echo "[setup] environment ready in $(VENV)"

data: setup
	$(BIN)/python tools/build_stdlib_corpus.py --output $(DATA_DIR)

test: setup data
	@set +e; $(BIN)/python -m pytest tests $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "[test] pytest collected no tests"; fi; exit $$rc

demo: setup data
	$(BIN)/python tools/demo.py --data $(DATA_DIR)

lint: setup
	$(BIN)/ruff check cplm_megatron kernels pretrain tools tests benchmarks
	$(BIN)/shellcheck slurm/*.sh slurm/local_cluster/*.sh .ci/run

clean-data:
	rm -rf $(DATA_DIR)
