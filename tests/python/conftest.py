import warnings

import pytest
import torch

import grape


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line(
        "markers",
        "expects_fallback: a GPU test in which a call of a compiled function may legitimately run "
        "eagerly; grape.FallbackWarning is not an error there (it is silenced: such a test asserts "
        "on grape.stats()['fallbacks'] or catches the warning itself)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: GPU tests run on the GPU machine (make gpu-check)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _is_gpu_test(node) -> bool:
    return node.get_closest_marker("gpu") is not None


def _expects_fallback(node) -> bool:
    return node.get_closest_marker("expects_fallback") is not None


@pytest.fixture(autouse=True)
def fallback_warnings_are_errors(request):
    """In GPU tests (those marked `gpu`: every tests/python/*_gpu.py module), a
    grape.FallbackWarning is an error unless the test is marked `expects_fallback`.

    A GPU test that only compares a compiled function with eager passes just as well when every
    call silently ran eagerly; making an unexpected fallback an error keeps such a test honest.
    Tests marked `expects_fallback` get the warning silenced instead (they assert on
    grape.stats()["fallbacks"], or record the warnings themselves: warnings.catch_warnings(
    record=True) with simplefilter("always"), or pytest.warns, both replace this filter inside
    their block).

    Only GPU tests: the CPU tests (test_compile_api.py, ...) run compiled functions without a
    GPU or on CPU tensors on purpose, where every call falls back by design, also on a machine
    that has CUDA. Processes a test starts (tests/python/ranks.py) do not inherit this filter."""
    if not _is_gpu_test(request.node):
        yield
        return
    with warnings.catch_warnings():
        if _expects_fallback(request.node):
            warnings.simplefilter("ignore", grape.FallbackWarning)
        else:
            warnings.simplefilter("error", grape.FallbackWarning)
        yield


@pytest.fixture
def quiet_fallbacks(request):
    """Silences grape.FallbackWarning, where a test exercises a fallback and asserts on stats.

    In a GPU test it silences them only if the test is marked `expects_fallback` (which already
    silences them): elsewhere in GPU tests fallbacks stay errors (see fallback_warnings_are_errors),
    so mark the test instead of using this fixture."""
    if _is_gpu_test(request.node) and not _expects_fallback(request.node):
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", grape.FallbackWarning)
        yield
