"""grape.Predicate and grape.while_loop: argument checks and the host-side branch (no GPU needed);
their capture into CUDA conditional nodes is tested in test_predicate_gpu.py."""

import pytest
import torch

import grape
from grape._predicate import _HostBranch


def test_host_branch_runs_the_body_only_when_taken():
    ran = []
    with _HostBranch(True):
        ran.append("taken")
    with _HostBranch(False):
        ran.append("skipped")
        raise AssertionError("a skipped body must not run")
    ran.append("after")
    assert ran == ["taken", "after"]


def test_host_branches_nest_and_restore_tracing():
    import sys

    def tracer(frame, event, arg):
        return None

    sys.settrace(tracer)
    try:
        ran = []
        with _HostBranch(True):
            with _HostBranch(False):
                ran.append("inner")
            ran.append("outer")
            with _HostBranch(True):
                ran.append("inner taken")
        assert ran == ["outer", "inner taken"]
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


def test_host_branch_lets_exceptions_of_a_taken_body_through():
    with pytest.raises(KeyError):
        with _HostBranch(True):
            raise KeyError("x")


def test_skipped_body_leaves_names_unbound_like_if():
    with _HostBranch(False):
        name = 1  # noqa: F841
    assert "name" not in locals()


@pytest.mark.parametrize("condition, error, words", [
    (True, TypeError, "a Python bool needs no predication"),
    (torch.tensor(1), TypeError, "got dtype torch.int64"),
    (torch.tensor([True, False]), ValueError, "got 2 elements"),
])
def test_bad_conditions_are_refused_with_the_reason(condition, error, words):
    with pytest.raises(error, match=words):
        grape.Predicate(condition)
    with pytest.raises(error, match=words):
        grape.while_loop(lambda x: condition, lambda x: (x,), (torch.zeros(1),))


@pytest.mark.skipif(not grape._C.built_with_cuda, reason="grape was built without CUDA")
def test_feature_detection_names_the_versions_it_needs():
    for kind, needs in (("if", "12.4"), ("while", "12.4"), ("if_else", "12.8")):
        reason = grape._C.conditional_unsupported_reason(kind)
        if torch.cuda.is_available():
            assert reason == "", reason  # the GPU machine: CUDA 13 runtime and driver
        else:
            assert f"CUDA {needs} runtime and driver" in reason and "driver 0" in reason
    with pytest.raises(RuntimeError, match="unknown conditional kind"):
        grape._C.conditional_unsupported_reason("switch")


def test_cpu_conditions_run_eagerly_outside_capture():
    # As everything runs without a GPU: the condition is read on the host (under capture a CUDA
    # condition is needed, which the GPU tests check).
    out = torch.zeros(2)
    with grape.Predicate(torch.tensor(True)):
        out += 1
    branch = grape.Predicate(torch.tensor(False))
    with branch:
        out += 10
    with branch.otherwise():
        out += 100
    assert out.tolist() == [101.0, 101.0]
    (final,) = grape.while_loop(lambda x: x.sum() < 5, lambda x: (x + 1,), (torch.zeros(1),))
    assert final.item() == 5.0


def test_while_loop_carries_tensors_only():
    with pytest.raises(TypeError, match="carries tensors"):
        grape.while_loop(lambda x: x, lambda x: x, (1,))
