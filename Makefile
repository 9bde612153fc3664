# make demo / make test: each sets everything up on a fresh machine with only
# Python 3.11 and a C++ compiler: the .venv, pinned dependencies, the build.
PYTHON ?= python3
VENV ?= .venv
TF_PACKAGE ?= tensorflow-cpu
TF_VERSION ?= 2.21.0
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# pytest arguments for `make test`, e.g. PYTEST_ARGS="-m slow"
PYTEST_ARGS ?=

SOURCES := $(shell find csrc cuda tfbigconv -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' -o -name '*.py' -o -name '*.json' \)) \
	CMakeLists.txt cuda/CMakeLists.txt setup.py pyproject.toml

.PHONY: all venv deps install lint test demo bench clean

all: install

$(PY):
	$(PYTHON) -m venv $(VENV)

# Dependencies, re-installed when the pins change.
$(VENV)/.deps-stamp: requirements-dev.txt Makefile | $(PY)
	$(PIP) install --upgrade pip
	$(PIP) install -r requirements-dev.txt "$(TF_PACKAGE)==$(TF_VERSION)"
	# tests/keras: the layers under Keras 2 (optional for users). tf-keras shares TF's
	# version and requires the `tensorflow` wheel by name, which would land beside
	# $(TF_PACKAGE): installed without its dependencies, which TF brings.
	$(PIP) install --no-deps "tf-keras==$(TF_VERSION)"
	# tests/test_portable.py: exports in every format Keras exports, run without the
	# library (optional for users: the extra 'export'). Keras' litert export converts
	# with TensorFlow's own tf.lite; the .tflite runs in ai-edge-litert's interpreter,
	# the .onnx (tf2onnx) in onnxruntime. None of them names a TensorFlow wheel.
	$(PIP) install "ai-edge-litert==2.3.0" "tf2onnx==1.17.0" "onnx==1.23.2" "onnxruntime==1.32.0"
	touch $@

deps: $(VENV)/.deps-stamp

# Build and install the package when any source changed.
$(VENV)/.install-stamp: $(VENV)/.deps-stamp $(SOURCES)
	$(PIP) install --no-build-isolation --no-deps .
	touch $@

install: $(VENV)/.install-stamp

# The conformance tests again on bigconv2d's pure-TensorFlow path (XLA's, and
# what runs without the compiled library); tests marked `native` skip there.
PURE_TF_TESTS = ops/test_conv2d.py ops/test_conv1d.py ops/test_conv3d.py ops/test_gradients.py \
	ops/test_depthwise.py \
	test_pure_tf.py ops/test_graph_mode.py test_arguments.py keras

# ruff, configured in pyproject.toml: any finding fails `make lint` and `make test`.
LINT = $(PY) -m ruff check tfbigconv tests benchmarks examples

lint: deps
	$(LINT)

test: install
	$(LINT)
	cd tests && ../$(PY) -m pytest -q $(PYTEST_ARGS)
	cd tests && ../$(PY) -m pytest -q --pure-tf $(PURE_TF_TESTS) $(PYTEST_ARGS)

demo: install
	$(PY) benchmarks/demo.py

bench: install
	$(PY) benchmarks/bench_direct.py

clean:
	rm -rf build *.egg-info $(VENV)/.install-stamp
