# Entry points. `make demo` and `make test` do all set-up on a fresh machine (see README.md).
PYTHON ?= python3
export PYTHONUNBUFFERED := 1
# grape imports from the checkout too where an editable install is impossible (see build).
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: setup gtest build demo test test-cpp test-python gpu-check bench clean

# Installs what is missing: torch (the CUDA 13 build where pip offers it), pytest, transformers
# (tests and benchmarks of Hugging Face models), CMake and ninja. GoogleTest is the C++ tests'
# alone (target gtest): `make demo` needs neither it nor root.
setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "torch>=2.4"
	@$(PYTHON) -c "import pytest" 2>/dev/null || $(PYTHON) -m pip install pytest
	@$(PYTHON) -c "import transformers" 2>/dev/null || $(PYTHON) -m pip install "transformers>=5"
	@command -v cmake >/dev/null || $(PYTHON) -m pip install cmake ninja

have_gtest = test -f /usr/include/gtest/gtest.h || test -f /usr/local/include/gtest/gtest.h

# GoogleTest, where it is missing and can be installed (apt-get, as root); otherwise says how.
gtest:
	@$(have_gtest) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq libgtest-dev; } || \
		echo "GoogleTest is missing and cannot be installed here: the C++ tests will not run" \
			"(as root: apt-get install libgtest-dev; then make test again)"

# Builds grape/_C, and the GoogleTest binary (build/cmake) where GoogleTest is installed, through
# setup.py -> CMake. Without a pip that can make editable installs (old pip, no network), it builds
# in place instead.
build: setup
	@echo "building grape's C++ and CUDA code (a few minutes the first time on 2 cores; later builds" \
		"compile what changed)"
	@tests=0; if $(have_gtest); then tests=1; fi; \
	GRAPE_BUILD_TESTS=$$tests $(PYTHON) -m pip install --no-build-isolation --no-deps -q -e . || \
		GRAPE_BUILD_TESTS=$$tests $(PYTHON) setup.py -q build_ext --inplace

demo: build
	$(PYTHON) -m benchmarks.demo_gpt2

test-cpp: gtest build
	@if $(have_gtest); then ctest --test-dir build/cmake --output-on-failure; \
	else echo "C++ tests skipped: GoogleTest is not installed (see above)"; fi

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
