# make run: set up and run the whole benchmark on this machine (CPU-simulated devices).
# make test: set up and run the whole test suite (.ci/run calls exactly this).
# make bench: set up and print the performance figures (benchmarks/run.py).
# make gpu-check: on a machine with a CUDA GPU, the GPU tests and the pipeline on its GPUs
#   (GPU_CHECK_PYTHON=python3: with that interpreter, no venv).
# make status: per topology and repeat, not started, queued, running, done or failed (scripts/status.py).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell sha1sum requirements.txt | cut -c1-12)
TEST_STAMP := $(VENV)/.test-installed-$(shell cat requirements.txt requirements-test.txt | sha1sum | cut -c1-12)

.PHONY: run test bench gpu-check status setup lint fmt screenshot clean

setup: $(STAMP)

# The interpreter first (3.11+, with venv): on a login node the system's is often older, and
# apt is no fix there; scripts/setup_python.sh names the fix in one line.
$(VENV)/bin/python:
	@bash scripts/setup_python.sh '$(PYTHON)'
	$(PYTHON) -m venv $(VENV)

# The stamp names the requirements' hash, so editing requirements.txt reinstalls.
$(STAMP): requirements.txt $(VENV)/bin/python
	@# pip's "Location ... is ignored" lines are noise from this machine's extra indexes.
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# Test-only packages (requirements-test.txt), on top of the stack; its stamp names both files.
$(TEST_STAMP): requirements-test.txt $(STAMP)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-test.txt 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
	rm -f $(VENV)/.test-installed-*
	touch $(TEST_STAMP)

run: $(STAMP)
	$(VENV)/bin/snakemake --profile profiles/local

# Three workers (pytest-xdist): the SLURM tests, which mostly wait on the cluster, run on one
# while two run the rest; conftest.py keeps the SLURM tests together, in order. With two, the
# cores sat idle a third of the suite (user time 64 of 2 x 55 minutes).
test: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest -n 3 --dist loadgroup

# Performance figures (a printed table, never pass/fail): docs/performance.md explains them.
bench: $(STAMP)
	$(VENV)/bin/python benchmarks/run.py

# GPU tests, then the reference and transformer workloads on this machine's GPUs, with figures.
# GPU_CHECK_PYTHON=python3 runs it with that interpreter and no venv: a GPU node's own Python
# with torch, Lightning and snakemake importable, where no package index can fill a venv.
ifeq ($(GPU_CHECK_PYTHON),)
gpu-check: $(STAMP)
	$(VENV)/bin/python benchmarks/gpu_check.py
else
gpu-check:
	'$(GPU_CHECK_PYTHON)' benchmarks/gpu_check.py
endif

# What the benchmark is doing now, from the plan its workflow wrote, the logs and squeue; never
# imports torch. The overrides the run was started with go in ARGS, as snakemake takes them:
# make status ARGS='--configfile config/transformer_tiny.yaml --config experiment=NAME'.
status: $(STAMP)
	$(VENV)/bin/python scripts/status.py $(ARGS)

# snakemake --lint exits 1 on any lint, the one kept on purpose too (no conda env per rule, see
# the Snakefile): the lint tests accept that one only, and check snakefmt's formatting.
lint: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests/workflow/test_lint.py

# docs/report.png, the README's picture: the first screen (1280 x 900) of the sample report that
# tests/workflow/report_sample.py builds from made-up records, captured in headless Chromium.
screenshot: $(STAMP)
	$(VENV)/bin/python tests/workflow/report_sample.py results/screenshot --screenshot docs/report.png

# Rewrites workflow/ as snakefmt formats it (width in pyproject.toml); tests/workflow/test_lint.py checks it.
fmt: $(STAMP)
	$(VENV)/bin/snakefmt workflow/

clean:
	rm -rf results .snakemake
