import warnings

import pytest
import torch

import grape


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: GPU tests run on the GPU machine (make gpu-check)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def quiet_fallbacks():
    """Fallback warnings are expected where a test exercises a fallback; it asserts on stats."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", grape.FallbackWarning)
        yield
