# The single definition of every check. `make help` lists the targets.
# Everything runs inside .venv, which `make venv` creates from scratch on a fresh clone.

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.installed
FUZZ_SECONDS ?= 60
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.DEFAULT_GOAL := help
.PHONY: help venv build build-examples bench-wake run run-echo bench-http bench-wsgi bench-tls bench-ws bench-workers bench-isolation bench-instructions test test-py312 test-py313 test-py314 test-py315 test-py314t test-portable test-rust test-python test-cpython test-cpython-asyncio-task record-cpython test-uvicorn test-h2spec lint fmt stubtest bench fuzz clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "maturin>=1.7,<2" "pytest>=8" "pytest-timeout>=2.3" ruff mypy "httpx[http2]" fastapi starlette \
		aiohttp websockets anyio trustme gunicorn flask django prometheus_client
	touch $(STAMP)

venv: $(STAMP) ## Create .venv with the build and test tools

build: $(STAMP) ## Build the extension (release) and install ferroloop into .venv
	$(VENV)/bin/maturin develop --release -q

build-examples: build ## Build examples/wake_ext (the C API example extension) into .venv (~10 s after build)
	$(VENV)/bin/maturin develop --release -q -m examples/wake_ext/Cargo.toml

run: build ## The main job: serve examples/app.py with the ferroloop server on http://127.0.0.1:8000
	$(PY) -m ferroloop app:app --app-dir examples --host 127.0.0.1 --port $${PORT:-8000}

run-echo: build ## The loop demo: an echo server and 64 clients on ferroloop (examples/echo.py)
	$(PY) examples/echo.py

test: build test-rust test-cpython test-cpython-asyncio-task test-python ## The whole test suite: Rust units, our tests, CPython's asyncio suite

test-rust: ## Rust unit tests of the core and of the C API layout (no Python needed)
	cargo test -q -p ferroloop-core
	cargo test -q -p ferroloop-embed --no-default-features

test-python: build build-examples ## Our Python tests: each case on asyncio's loop and on ferroloop, plus leak tests
	$(PY) -m pytest -q

test-cpython: build ## CPython's test.test_asyncio against ferroloop; fails if the pass count drops
	$(PY) tests/external/run_cpython_asyncio.py --check tests/external/cpython_asyncio_baseline.json

test-cpython-asyncio-task: build ## CPython's asyncio suite with FERROLOOP_NATIVE_TASKS=0 (create_task makes asyncio's C Task); fails if the count drops
	FERROLOOP_NATIVE_TASKS=0 $(PY) tests/external/run_cpython_asyncio.py --check tests/external/cpython_asyncio_asyncio_task_baseline.json

record-cpython: build ## Re-record the CPython suite's pass counts, asyncio's and ferroloop's tasks (only ever upwards)
	$(PY) tests/external/run_cpython_asyncio.py --record tests/external/cpython_asyncio_baseline.json
	FERROLOOP_NATIVE_TASKS=0 $(PY) tests/external/run_cpython_asyncio.py --record tests/external/cpython_asyncio_asyncio_task_baseline.json

test-py312: ## Our tests and CPython 3.12's asyncio suite under CPython 3.12 (built once from source; ~6 min the first time)
	tests/pyver/run.sh 3.12

test-py313: ## Our tests and CPython 3.13's asyncio suite under CPython 3.13 (built once from source; ~6 min the first time)
	tests/pyver/run.sh 3.13

test-py314: ## Our tests and CPython 3.14's asyncio suite under CPython 3.14 (built once from source; ~8 min the first time)
	tests/pyver/run.sh 3.14

test-py315: ## The same under CPython 3.15 (a release candidate, 3.15.0rc2; built once from source)
	tests/pyver/run.sh 3.15

test-py314t: ## The same under free-threaded CPython 3.14.4 (--disable-gil; ferroloop turns the GIL on)
	tests/pyver/run.sh 3.14t

test-portable: build build-examples ## Our pytest suite with every CPython loan's fallback forced (FERROLOOP_PORTABLE=1)
	FERROLOOP_PORTABLE=1 $(PY) -m pytest -q

test-h2spec: build ## h2spec (HTTP/2 conformance) on h2c and TLS; installs h2spec with go once; fails below tests/external/h2spec/baseline.json
	$(PY) tests/external/h2spec/run.py --check

test-uvicorn: ## uvicorn's own test suite on asyncio and on ferroloop; fails on a regression
	$(PYTHON) tests/external/uvicorn/run.py --check

lint: $(STAMP) ## rustfmt, clippy -D warnings, ruff, ruff format, and stubtest of the native module
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -q -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MAKE) --no-print-directory stubtest

stubtest: build ## Check python/ferroloop/_native.pyi against the built module
	$(PY) -m mypy.stubtest ferroloop._native

fmt: $(STAMP) ## Format Rust and Python sources
	cargo fmt --all
	$(VENV)/bin/ruff format .

bench: build ## Loop benchmarks against asyncio, uvloop and rloop (tables + PNG in benchmarks/results)
	@echo '#include <openssl/ssl.h>' | cc -E -x c - >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q libssl-dev >/dev/null; } || { \
		echo "OpenSSL headers not found (the echo client links OpenSSL): apt-get install -y libssl-dev"; exit 1; }
	$(PIP) install -q uvloop rloop matplotlib
	$(PY) benchmarks/loop/run.py

bench-wake: build build-examples ## Native threads completing futures: call_soon_threadsafe, a pipe, the C API (benchmarks/results/wake.md)
	$(PIP) install -q uvloop rloop
	$(PY) benchmarks/wake/run.py --out benchmarks/results/wake.md

bench-http: build ## HTTP server benchmarks against granian, uvicorn, hypercorn (tables + PNG in benchmarks/results)
	@command -v wrk >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; } || \
		{ echo "wrk not found: apt-get install -y wrk"; exit 1; }
	$(PIP) install -q granian uvicorn httptools uvloop hypercorn fastapi matplotlib
	$(PY) benchmarks/http/run.py

bench-wsgi: build ## WSGI server benchmarks against granian, uvicorn, hypercorn, gunicorn (~17 min; benchmarks/results/wsgi.*)
	@command -v wrk >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; } || \
		{ echo "wrk not found: apt-get install -y wrk"; exit 1; }
	$(PIP) install -q granian uvicorn httptools uvloop hypercorn gunicorn flask matplotlib
	$(PY) benchmarks/http/wsgi.py

bench-tls: build ## HTTPS (TLS) server benchmarks against granian, uvicorn, hypercorn (~13 min; benchmarks/results/tls.*)
	@command -v wrk >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; } || \
		{ echo "wrk not found: apt-get install -y wrk"; exit 1; }
	$(PIP) install -q granian uvicorn httptools uvloop hypercorn fastapi matplotlib trustme
	$(PY) benchmarks/http/tls.py

bench-ws: build ## WebSocket echo against granian, uvicorn, hypercorn (~3 min; benchmarks/results/ws.*)
	@command -v cc >/dev/null || { echo "a C compiler is needed for benchmarks/http/ws_client.c"; exit 1; }
	$(PIP) install -q granian uvicorn httptools uvloop hypercorn
	$(PY) benchmarks/http/ws.py

bench-workers: build ## --workers N: shared accept against SO_REUSEPORT (2 and 4 workers, ~5 min; benchmarks/results/workers.*)
	@command -v wrk >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q wrk >/dev/null; } || \
		{ echo "wrk not found: apt-get install -y wrk"; exit 1; }
	$(PY) benchmarks/http/workers.py $(ARGS)

bench-isolation: build ## FastAPI + 25 MB JSON uploads: do small requests stay fast? (4 servers, ~11 min; benchmarks/results/isolation.*)
	@command -v cc >/dev/null || { echo "a C compiler is needed for benchmarks/isolation/small_client.c"; exit 1; }
	$(PIP) install -q granian uvicorn uvicorn-worker httptools uvloop gunicorn fastapi matplotlib
	$(PY) benchmarks/isolation/run.py $(ARGS)

bench-instructions: build ## Instructions per request of the server under callgrind (hello and FastAPI; ~4 min)
	@command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install -y valgrind"; exit 1; }
	$(PY) benchmarks/http/instructions.py
	$(PY) benchmarks/http/instructions.py --app ping_fastapi:app --path /ping --requests 1000,4000

fuzz: ## Run each cargo-fuzz target for FUZZ_SECONDS (default 60); needs nightly and cargo-fuzz
	cd fuzz && for t in parse_head chunked_body ws_frames conversation; do \
		dict=; if [ -f dicts/$$t.dict ]; then dict=-dict=dicts/$$t.dict; fi; \
		cargo +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) $$dict || exit 1; done

clean: ## Remove build outputs and the venv
	cargo clean
	rm -rf $(VENV) .uvicorn-suite .pytest_cache .ruff_cache .mypy_cache
