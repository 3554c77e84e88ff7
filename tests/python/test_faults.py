"""Faults and threads without a GPU (docs/semantics.md, "Faults and threads"): the call lock's
contract (Note [One compiled call at a time]) and what the Python side tells the runtime of an
exception raised under capture (Note [Exceptions under capture]; the policy itself is tested in
tests/cpp/test_capture_policy.cpp). The GPU scenarios are in test_faults_gpu.py."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from grape import _C, _hooks, _predicate


def test_the_call_lock_is_re_entrant_and_held_per_thread():
    assert not _C._call_lock_held()
    with _C._CallLock() as outer:
        assert outer and _C._call_lock_held()
        with _C._CallLock() as inner:  # a compiled function calling another
            assert inner and _C._call_lock_held()
        assert _C._call_lock_held()
        seen = []
        thread = threading.Thread(target=lambda: seen.append(_C._call_lock_held()))
        thread.start()
        thread.join()
        assert seen == [False]
    assert not _C._call_lock_held()


def test_another_thread_waits_for_the_lock_without_holding_the_gil():
    # In a child process with a time limit: were the waiting thread to hold the GIL, the holder
    # could run no Python, and the child would hang instead of failing.
    code = textwrap.dedent("""
        import threading, time
        from grape import _C
        order, waiting = [], threading.Event()

        def other():
            waiting.set()
            with _C._CallLock() as held:
                order.append(("other", held))

        with _C._CallLock():
            thread = threading.Thread(target=other)
            thread.start()
            assert waiting.wait(10)
            time.sleep(0.2)  # the other thread now waits for the lock
            spins = 0
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:  # Python, which needs the GIL
                spins += 1
            assert ("other", True) not in order and spins > 1000
        thread.join(10)
        assert not thread.is_alive() and order == [("other", True)]
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=60)
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr


def test_a_call_that_must_not_wait_does_not():
    # From a backward pass: the holder may be waiting for it (the call runs eagerly instead).
    result = []

    def other():
        with _C._CallLock(unless_busy=True) as held:
            result.append(held)
            result.append(_C._call_lock_held())

    with _C._CallLock():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
    assert result == [False, False]
    with _C._CallLock(unless_busy=True) as held:  # free: taken as usual
        assert held and _C._call_lock_held()


def _in_child(check) -> int:
    """Runs `check()` in a forked child; its exit status (0: passed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1


def test_a_forked_child_takes_the_lock_that_a_parents_thread_held():
    held, release = threading.Event(), threading.Event()

    def hold():
        with _C._CallLock():
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    try:
        def child():
            with _C._CallLock(unless_busy=True) as taken:  # its holder is gone in the child
                return taken and _C._call_lock_held()

        assert _in_child(child) == 0
    finally:
        release.set()
        thread.join(10)


def test_a_call_that_forks_keeps_its_lock_in_the_child():
    with _C._CallLock():
        def child():
            with _C._CallLock(unless_busy=True) as again:
                inner = again and _C._call_lock_held()
            return inner and _C._call_lock_held()  # still held: the fork's own call

        assert _in_child(child) == 0


def test_only_a_fork_of_a_process_with_graphs_is_a_forked_child():
    # In an interpreter of its own, where grape made no graph pool (this one may have, where GPU
    # tests ran before): a fork of it may use CUDA, and compile, afresh.
    code = textwrap.dedent("""
        import os
        from grape import _C
        assert not _C._forked_child()
        pid = os.fork()
        if pid == 0:
            os._exit(2 if _C._forked_child() else 0)
        raise SystemExit(os.WEXITSTATUS(os.waitpid(pid, 0)[1]))
    """)
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


class _Branch:
    """What _Body needs of a conditional node, without one."""

    def __init__(self):
        self.ended = 0

    def begin_body(self, index):
        pass

    def end_body(self):
        self.ended += 1


def test_an_exception_leaving_a_predicated_body_is_marked():
    branch = _Branch()
    body = _predicate._Body(branch, 0, "grape.Predicate")
    error = ValueError("only where the condition holds")
    body.end(error)
    assert branch.ended == 1
    assert _predicate.raised_in_body(error)
    assert not _predicate.raised_in_body(ValueError("elsewhere"))
    body = _predicate._Body(_Branch(), 0, "grape.Predicate")
    body.end(None)  # a body that ended normally marks nothing


def test_the_hooks_tell_the_capture_s_own_exceptions():
    hooks = _hooks.RuntimeHooks("f")
    assert hooks.capture_cause(ValueError("f's own")) == ""
    assert hooks.capture_cause(RuntimeError("shape mismatch")) == ""
    marked = KeyError("inside a body")
    setattr(marked, _predicate._RAISED_IN_BODY, True)
    assert hooks.capture_cause(marked) == "predicated_body"
    compiler_error = type("BackendCompilerFailed", (RuntimeError,),
                          {"__module__": "torch._dynamo.exc"})("inductor raised")
    assert hooks.capture_cause(compiler_error) == "compiler"
    inductor_error = type("LoweringException", (Exception,),
                          {"__module__": "torch._inductor.exc"})("no lowering")
    assert hooks.capture_cause(inductor_error) == "compiler"


@pytest.mark.parametrize("error", [ValueError("x"), KeyboardInterrupt()])
def test_without_cuda_exceptions_reach_the_caller_once(error, quiet_fallbacks):
    import grape

    calls = []

    def f(x):
        calls.append(x)
        raise error

    step = grape.compile(f)
    for i in range(3):
        with pytest.raises(type(error)):
            step(i)
    assert calls == [0, 1, 2]
