# Entry points. `make demo` and `make test` do all set-up on a fresh machine (see README.md).
PYTHON ?= python3
export PYTHONUNBUFFERED := 1
# grape imports from the checkout too where an editable install is impossible (see build).
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: setup build demo test test-cpp test-python gpu-check bench clean

# Installs what is missing: torch (the CUDA 13 build where pip offers it), pytest, transformers
# (tests and benchmarks of Hugging Face models), GoogleTest.
setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "torch>=2.4"
	@$(PYTHON) -c "import pytest" 2>/dev/null || $(PYTHON) -m pip install pytest
	@$(PYTHON) -c "import transformers" 2>/dev/null || $(PYTHON) -m pip install "transformers>=5"
	@command -v cmake >/dev/null || $(PYTHON) -m pip install cmake ninja
	@test -f /usr/include/gtest/gtest.h || test -f /usr/local/include/gtest/gtest.h || \
		{ apt-get update -qq && apt-get install -y -qq libgtest-dev; }

# Builds grape/_C and the GoogleTest binary (build/cmake) through setup.py -> CMake. Without a pip
# that can make editable installs (old pip, no network), it builds in place instead.
build: setup
	$(PYTHON) -m pip install --no-build-isolation --no-deps -q -e . || \
		$(PYTHON) setup.py -q build_ext --inplace

demo: build
	$(PYTHON) -m benchmarks.demo_gpt2

test-cpp: build
	ctest --test-dir build/cmake --output-on-failure

test-python: build
	$(PYTHON) -m pytest tests/python -q -rs

test: test-cpp test-python

# On the GPU machine: build, the whole suite with GPU tests, and a benchmark smoke run.
# Logs and results go to $(OUT) when it is set.
gpu-check:
	bash tools/gpu_check.sh

bench: build
	$(PYTHON) -m benchmarks.gpt2_decode

clean:
	rm -rf build grape/_C*.so *.egg-info
