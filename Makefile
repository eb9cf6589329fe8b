# The README's commands. Each target does its own set-up on a fresh machine.
#   make setup              create .venv and install the project (+dev): CPU torch 2.13.0 on machines
#                           without a GPU; on GPU machines (nvidia-smi -L lists one) the gpu extra, pinned
#                           by requirements/constraints-gpu.txt; megatron-core per constraints-megatron-core.txt
#   make test               setup + the embedded corpus + the full test suite (what CI runs first)
#   make test-mcore-latest  a second venv (.venv-mcore-latest) with the newest tested megatron-core, and
#                           the megatron-core tests selected for it (pytest marker `mcore_latest`) on it
#   make demo               setup + the end-to-end demo (corpus, TP=2 training, eval vs baseline, HF export)
#   make gpu-dry-run OUT=DIR [STEPS=a,b | GROUP=g | LEASE=first|rest]  the GPU check (benchmarks/gpu/run_gpu_checks.sh,
#                           or the lease's command, benchmarks/gpu/lease.sh) at tiny sizes on CPU,
#                           as the GPU machine sees it: .venv-gpu-image (only the GPU image's packages, CPU torch)
#                           + the carried wheels (megatron-core 0.19.2's cp311 wheel, the project's own wheel)
#                           installed by the script's install step; nothing editable; bf16, SDPA -> DIR
#   make gpu-image-env      that environment alone (built once, cached in .venv-gpu-image/)
#   make data               the embedded corpus: tokenizer + MDS shards from the Python stdlib sources
#   make data-emergence     the emergence study's corpora: data/code_v4096 and data/prose_v4096 (English prose from
#                           Debian's documentation packages, installed through apt-get when missing)
#   make data-code          the code corpus for SmolLM2-135M runs (data/code): every installed Python source, split
#                           by distribution, BPE 49,152, every core; fails if its size rules do not hold
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.cplm-setup-stamp
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
MCORE_CONSTRAINTS := requirements/constraints-megatron-core.txt
ifeq ($(HAS_GPU),1)
  PIP_CONSTRAINT_ARGS := -c requirements/constraints-gpu.txt -c $(MCORE_CONSTRAINTS)
  TORCH_REQ :=
  EXTRAS := dev,gpu
else
  PIP_CONSTRAINT_ARGS := -c requirements/constraints-cpu.txt -c $(MCORE_CONSTRAINTS)
  TORCH_REQ := torch==2.13.0
  EXTRAS := dev
endif
# The newest megatron-core we test (the Python >= 3.12 line), installed into a CPU venv of this Python:
# its metadata asks for Python >= 3.12, but its cp311 wheel imports and passes the mcore tests on 3.11.
LATEST_VENV ?= .venv-mcore-latest
LATEST_STAMP := $(LATEST_VENV)/.cplm-setup-stamp
MCORE_LATEST := $(shell sed -n 's/^megatron-core==\([0-9.]*\); python_version >= "3.12"$$/\1/p' $(MCORE_CONSTRAINTS))
$(LATEST_STAMP): PIP_CONSTRAINT_ARGS := -c requirements/constraints-cpu.txt
$(LATEST_STAMP): TORCH_REQ := torch==2.13.0
$(LATEST_STAMP): EXTRAS := dev
$(LATEST_STAMP): MCORE_REQ := megatron-core==$(MCORE_LATEST)
PIP = $(@D)/bin/python -m pip -q --disable-pip-version-check
DATA_DIR ?= data/stdlib
CODE_DATA_DIR ?= data/code
PYTEST_ARGS ?=
# the suite's workers (pytest-xdist; tests/conftest.py keeps each file, and the SLURM tests, on one worker)
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadgroup

.PHONY: setup setup-mcore-latest test test-mcore-latest demo data data-code data-emergence lint clean-data gpu-dry-run gpu-image-env

setup: $(STAMP)

setup-mcore-latest: $(LATEST_STAMP)

# One recipe for both venvs ($(@D) is the venv); the latest one installs its megatron-core first,
# past pip's Python check, and the project install then keeps it. mosaicml-streaming comes last, without its
# declared dependencies (cloud SDKs, torchvision, transformers<5: cplm_megatron/install_check.py), so that no
# install after it has pip's resolver report them; the check then accepts exactly those.
$(STAMP) $(LATEST_STAMP): setup.py requirements/constraints-cpu.txt requirements/constraints-gpu.txt $(MCORE_CONSTRAINTS)
	@test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(PIP) install --upgrade pip setuptools wheel
	$(if $(TORCH_REQ),$(PIP) install $(PIP_CONSTRAINT_ARGS) "$(TORCH_REQ)")
	$(if $(MCORE_REQ),$(PIP) install --no-deps --ignore-requires-python "$(MCORE_REQ)")
	@$(PIP) uninstall -q -y mosaicml-streaming 2>/dev/null || true
	DS_BUILD_OPS=0 $(PIP) install $(PIP_CONSTRAINT_ARGS) --no-build-isolation -e ".[$(EXTRAS)]"
	$(PIP) install $(PIP_CONSTRAINT_ARGS) --no-deps mosaicml-streaming==0.13.0
	$(@D)/bin/python -m cplm_megatron.install_check
	@touch $@
	@echo "[setup] environment ready in $(@D)"

data: setup
	$(BIN)/python tools/build_stdlib_corpus.py --output $(DATA_DIR)

data-code: setup
	$(BIN)/python tools/build_code_corpus.py --output $(CODE_DATA_DIR) --check-size-rules

# The emergence study's corpora (tools/emergence.py): code and English prose, vocabulary 4096, 256 tokens per sample;
# the prose corpus's Debian documentation packages are installed through apt-get when missing.
data-emergence: setup
	$(BIN)/python tools/build_code_corpus.py --output data/code_v4096 --vocab-size 4096 --seq-len 256 \
	  --max-bytes 60000000 --dev-fraction 0.05 --max-distribution-share 1.0 --quiet
	$(BIN)/python tools/build_prose_corpus.py --install --output data/prose_v4096 --code-corpus data/code_v4096 --quiet

test: setup data
	@set +e; $(BIN)/python -m pytest tests $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "[test] pytest collected no tests"; fi; exit $$rc

test-mcore-latest: data $(LATEST_STAMP)
	@$(LATEST_VENV)/bin/python -c "from importlib.metadata import version as v; \
	  assert v('megatron-core') == '$(MCORE_LATEST)', v('megatron-core'); print('[test-mcore-latest] megatron-core', v('megatron-core'))"
	$(LATEST_VENV)/bin/python -m pytest tests -m mcore_latest $(XDIST) $(PYTEST_ARGS)

demo: setup data
	$(BIN)/python tools/demo.py --data $(DATA_DIR)

# The GPU machine's image, emulated: only the packages the image has, nothing of the project, no megatron-core;
# built once (cached: .venv-gpu-image/, git-ignored; a changed package list rebuilds it). The image's triton 3.6.0
# and transformers 5.17.0; its torch 2.11.0 has no CPU build on PyPI (only the CUDA one, whose CUDA libraries are
# GBs): CPU torch 2.13.0 stands in. The dry run's wheels (what prepare_wheels.sh carries to the GPU machine, but
# megatron-core's cp311 wheel) go to its wheels/.
GPU_IMAGE_VENV ?= .venv-gpu-image
GPU_IMAGE_PACKAGES := torch==2.13.0 numpy pyyaml psutil packaging einops typing-extensions
GPU_IMAGE_PINS := triton==3.6.0 transformers==5.17.0
GPU_IMAGE_STAMP := $(GPU_IMAGE_VENV)/.cplm-image-$(shell echo '$(GPU_IMAGE_PACKAGES) $(GPU_IMAGE_PINS)' | cksum | cut -d' ' -f1)
STEPS ?=
GROUP ?=
LEASE ?=
gpu-image-env: $(GPU_IMAGE_STAMP)

$(GPU_IMAGE_STAMP): requirements/constraints-cpu.txt
	@test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(PIP) install -c requirements/constraints-cpu.txt $(GPU_IMAGE_PACKAGES)
	$(PIP) install $(GPU_IMAGE_PINS)  # not under the CPU constraints: they pin CI's triton
	@rm -f $(@D)/.cplm-image-*
	@touch $@
	@echo "[gpu-image-env] $(@D): $(GPU_IMAGE_PACKAGES) $(GPU_IMAGE_PINS)"

gpu-dry-run: $(GPU_IMAGE_STAMP)
	@test -n "$(OUT)" || { echo "usage: make gpu-dry-run OUT=DIR [STEPS=a,b | GROUP=check|perf|study | LEASE=first|rest]" >&2; exit 2; }
	WHEEL_DIR=$(GPU_IMAGE_VENV)/wheels WHEEL_PYTHON_VERSION=3.11 bash benchmarks/gpu/prepare_wheels.sh
	OUT="$(OUT)" PYTHON=$(GPU_IMAGE_VENV)/bin/python WHEEL_DIR=$(GPU_IMAGE_VENV)/wheels OMP_NUM_THREADS=1 \
	  $(if $(LEASE),bash benchmarks/gpu/lease.sh --cpu-dry-run $(if $(filter rest,$(LEASE)),--rest),\
	  bash benchmarks/gpu/run_gpu_checks.sh --cpu-dry-run $(if $(STEPS),--steps $(STEPS)) $(if $(GROUP),--group $(GROUP)))

lint: setup
	$(BIN)/ruff check cplm_megatron cplm_kernels pretrain tools tests benchmarks
	$(BIN)/shellcheck slurm/*.sh slurm/local_cluster/*.sh benchmarks/gpu/*.sh .ci/run

clean-data:
	rm -rf $(DATA_DIR)
