# The two commands: `make demo` and `make test`. Each creates .venv/ if missing and installs into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SF     := $(BIN)/shardfuse
# tiktoken reads its BPE file from here before it tries the network (see ../shared/data/tiktoken/SOURCE.md).
export TIKTOKEN_CACHE_DIR ?= $(CURDIR)/.cache/tiktoken
TIKTOKEN_CL100K := $(TIKTOKEN_CACHE_DIR)/9b5ad71b2ce5302211f9c61530b329a4922fc6a4
SHARED_TIKTOKEN := $(CURDIR)/../shared/data/tiktoken/cl100k_base.tiktoken
CHROMIUM := /usr/bin/chromium
PROMTOOL := /usr/bin/promtool
REDIS_SERVER := /usr/bin/redis-server
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The local embedder's model ships inside a pip package: never reach for a model hub.
export HF_HUB_OFFLINE ?= 1

DEMO_ZONE    := demo
DEMO_SOURCES := pipeline query workers docs config tests README.md Makefile pyproject.toml

.PHONY: demo test test-faults bench bench-ab bench-ab-ingest bench-scale install lint typecheck down clean flower-screenshot prometheus-screenshot

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# CPU torch first, so that sentence-transformers does not pull the CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[local,dev]'
	touch $@

install: $(VENV)/.installed $(TIKTOKEN_CL100K) $(CHROMIUM) $(PROMTOOL) $(REDIS_SERVER)

# Debian's Chromium, which the Flower dashboard test drives (tests/integration/test_flower_browser.py).
$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium

# Debian's prometheus, for promtool: the metrics test checks each pool's exposition with `promtool check metrics`,
# the monitoring tests check and test config/prometheus/ with it, and the scrape test runs the server itself.
$(PROMTOOL):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus

# Debian's redis-server, built with TLS: the TLS broker test (tests/integration/test_tls_broker.py) runs it.
$(REDIS_SERVER):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server

$(TIKTOKEN_CL100K):
	mkdir -p $(TIKTOKEN_CACHE_DIR)
	if [ -f $(SHARED_TIKTOKEN) ]; then cp $(SHARED_TIKTOKEN) $@; \
	else echo "no local copy of cl100k_base: tiktoken will download it on first use"; fi

demo: install
	$(SF) up
	$(SF) publish $(DEMO_SOURCES) --zone $(DEMO_ZONE)
	$(SF) wait --timeout 900
	$(SF) search "how are a document's old chunks replaced atomically" --zone $(DEMO_ZONE) -k 3
	$(SF) search "reciprocal rank fusion" --zone $(DEMO_ZONE) -k 3
	$(SF) search "gitignore" --zone $(DEMO_ZONE) --mode keyword -k 3
	$(SF) search "prepare_chunks" --zone $(DEMO_ZONE) -k 3    # a function's name finds its definition
	@echo
	@echo "The stack is still running (see .venv/bin/shardfuse status)."
	@echo "Query it:  .venv/bin/shardfuse search 'your question' --zone $(DEMO_ZONE)"
	@echo "Stop it:   .venv/bin/shardfuse down"

# The whole suite: unit and integration tests, and beside them the fault-injection tests (each starts a stack
# of its own and breaks it: kill -9 workers, restart Redis, stop PostgreSQL, a failing provider). The fault
# tests spend most of their time waiting (visibility timeouts, restarts: ~90 % of the cores idle), so they run
# in a second pytest process from the start; their log is printed when both are done. The integration tests
# wait too (alone, 45 % of 2 cores busy on average; sampled in session 29), so the main suite runs in
# $(TEST_WORKERS) pytest-xdist workers, a test file to each (module fixtures start one stack per file), every
# worker with a session stack of its own. Each process draws loopback ports from its own range
# (tests/integration/ports.py). The files go out in collection order, the integration tests (a few long tests
# a file) before the unit tests (many short ones), so that the short ones even out the two workers' ends;
# xdist's default order, most tests first, left the long files for last (main suite alone: 791 s that way,
# 740 s this way; session 32).
# Either failing fails `make test`; lint failing or Ctrl-C stops the fault tests at once, their stacks torn down
# (tests/support/faults_pass.py: a background command starts with SIGINT ignored). Lint runs as $(LINT), not as
# a sub-make, so that `make -n test` only prints.
FAULTS_LOG := .cache/faults.log
TEST_WORKERS ?= 2
test: install
	@mkdir -p .cache
	@echo "fault-injection tests: running beside lint and the main suite (follow them: tail -f $(FAULTS_LOG))"
	@$(BIN)/python -m tests.support.faults_pass > $(FAULTS_LOG) 2>&1 & \
	faults=$$!; trap 'kill -TERM $$faults 2>/dev/null' INT TERM; \
	if $(LINT); then $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder; main=$$?; \
	else main=1; kill -TERM $$faults; fi; \
	wait $$faults; faults_rc=$$?; \
	echo; echo "==== fault-injection tests (exit $$faults_rc; $(FAULTS_LOG)) ===="; cat $(FAULTS_LOG); \
	[ $$main -eq 0 ] && [ $$faults_rc -eq 0 ]

# The fault-injection tests alone (docs/reliability.md).
test-faults: install
	$(BIN)/python -m pytest -m faults tests/integration/faults

# The README's Flower screenshot, taken by the browser test on a fresh embedded stack.
flower-screenshot: install
	SHARDFUSE_SCREENSHOT=docs/images/flower.png $(BIN)/python -m pytest -q tests/integration/test_flower_browser.py

# The README's Prometheus screenshot: Debian's Prometheus scraping a fresh embedded stack, graphing queue depth
# and freshness while a few hundred documents load (tests/integration/test_prometheus_scrape.py).
prometheus-screenshot: install
	SHARDFUSE_SCREENSHOT=docs/images/prometheus.png $(BIN)/python -m pytest -q tests/integration/test_prometheus_scrape.py -k screenshot

bench: install
	@if ls tests/benchmarks/bench_*.py >/dev/null 2>&1; then \
		$(BIN)/python -m pytest tests/benchmarks -s -p no:cacheprovider -o python_files='bench_*.py'; \
	else echo "no benchmarks yet: tests/benchmarks/bench_*.py arrive with the performance work"; fi

# This working tree's query path against BASELINE's (a git revision), taking turns on one loaded stack
# (tests/benchmarks/query_ab.py): how a change to the query path is told from the host's drift. ~7 minutes.
bench-ab: install
	@[ -n "$(BASELINE)" ] || { echo "usage: make bench-ab BASELINE=<git revision>"; exit 2; }
	$(BIN)/python -m tests.benchmarks.query_ab $(BASELINE)

# The same for the ingest path: runs of bench_ingest's load (30,000 chunks) taking turns, ~3 minutes a pair.
bench-ab-ingest: install
	@[ -n "$(BASELINE)" ] || { echo "usage: make bench-ab-ingest BASELINE=<git revision>"; exit 2; }
	$(BIN)/python -m tests.benchmarks.ingest_ab $(BASELINE)

# How each figure grows with the corpus (docs/performance.md): one stack grown to each size, then the plot.
# Not part of `make bench`: ~15 minutes here (a million chunks). SHARDFUSE_SCALE_SIZES picks the sizes (chunks).
SHARDFUSE_SCALE_SIZES ?= 10000,100000,1000000
bench-scale: install
	SHARDFUSE_SCALE_SIZES=$(SHARDFUSE_SCALE_SIZES) $(BIN)/python -m pytest tests/benchmarks/scale_growth.py -s \
		-p no:cacheprovider
	$(BIN)/python -m tests.benchmarks.scale_plot  # docs/figures/scale.json -> docs/figures/scale.png

# ruff (with max-complexity 10) and mypy --strict over the whole package ([tool.mypy] in pyproject.toml names
# it). mypy cannot see the editable install: it reads the checkout through .cache/typecheck/shardfuse, a link to
# the repository root named like the package.
LINT := $(BIN)/ruff check pipeline query workers tests __init__.py && mkdir -p .cache/typecheck \
	&& ln -sfn ../.. .cache/typecheck/shardfuse && $(BIN)/mypy
lint: install
	$(LINT)

down:
	$(SF) down

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
