"""The predication rewriter without a GPU: Python semantics are kept for Python conditions, and a
simulated capture (both branches run, names merged with torch.where, as under CUDA graph capture)
gives the results of eager execution on tensors; refusals name the file and line."""

import inspect

import pytest
import torch

import grape
from grape import _rewrite
from grape._rewrite import RewriteError, rewrite


class _BothBranches:
    """Stands in for a grape.Predicate under capture: Python runs both blocks (as when capturing
    them into a conditional node); the rewriter's merge selects the values."""

    def __init__(self, condition):
        self._condition = condition

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def otherwise(self):
        return self


@pytest.fixture
def simulated_capture(monkeypatch):
    """CPU bool tensors take the predicated path."""
    monkeypatch.setattr(_rewrite._Runtime, "predicated",
                        staticmethod(lambda c: isinstance(c, torch.Tensor)))
    monkeypatch.setattr(_rewrite._Runtime, "branch",
                        staticmethod(lambda c, where: _BothBranches((c != 0).reshape(()))))


def clamp_and_count(x, limit):
    count = 0
    if x.sum() > limit:
        x = x * 0.5
        count = count + 1
    elif x.sum() < -limit:
        x = -x
        count = count + 2
    else:
        x = x + 1
    return x, count


def first_over(xs, limit):
    total = torch.zeros(())
    found = torch.zeros(())
    for x in xs:
        if x > limit:
            found = x
            break
        if x < 0:
            continue
        total = total + x
    return total, found


def nested_loops(rows):
    out = torch.zeros(())
    for row in rows:
        for v in row:
            if v < 0:
                break
            out = out + v
        else:
            out = out + 100
    return out


def accumulate_until(xs, limit):
    y = torch.zeros(())
    for x in xs:
        y = y + x
        if y > limit:
            break
    return y


def first_match(xs):
    found = torch.zeros(())
    for x in xs:
        if x > 0:
            found = x
            break
    return found


def mixed_numbers_and_tuples(x):
    scale, pair = 1, (x, x)
    if x.sum() > 0:
        scale, pair = 0.5, (x + 1, x - 1)
    return pair[0] * scale, pair[1]


def temporaries(x):
    if x.sum() > 0:
        tmp = x * 2
        x = tmp + 1
    return x


@pytest.mark.parametrize("fn, cases", [
    (clamp_and_count, [(torch.tensor([3.0, 4.0]), 5.0), (torch.tensor([-3.0, -4.0]), 5.0),
                       (torch.tensor([1.0, 1.0]), 5.0)]),
    (first_over, [([torch.tensor(v) for v in (1.0, -2.0, 3.0, 9.0, 4.0)], 5.0),
                  ([torch.tensor(v) for v in (1.0, 2.0)], 5.0), ([1, -2, 3, 9, 4], 5)]),
    (nested_loops, [([[torch.tensor(1.0), torch.tensor(-1.0), torch.tensor(5.0)],
                      [torch.tensor(2.0)]],)]),
    (temporaries, [(torch.tensor([1.0, 2.0]),), (torch.tensor([-1.0, -2.0]),)]),
])
def test_rewritten_functions_keep_python_semantics(fn, cases):
    rewritten, why = rewrite(fn)
    assert why is None and rewritten is not fn
    for args in cases:
        assert _same(rewritten(*args), fn(*args))


@pytest.mark.parametrize("fn, cases", [
    (clamp_and_count, [(torch.tensor([3.0, 4.0]), 5.0), (torch.tensor([-3.0, -4.0]), 5.0),
                       (torch.tensor([1.0, 1.0]), 5.0)]),
    (first_over, [([torch.tensor(v) for v in (1.0, -2.0, 3.0, 9.0, 4.0)], 5.0),
                  ([torch.tensor(v) for v in (1.0, 2.0)], 5.0),
                  ([torch.tensor(v) for v in (7.0, 2.0)], 5.0)]),
    (temporaries, [(torch.tensor([1.0, 2.0]),), (torch.tensor([-1.0, -2.0]),)]),
    (accumulate_until, [([torch.tensor(v) for v in (3.0, 4.0, 5.0)], 5.0),
                        ([torch.tensor(v) for v in (1.0, 1.0)], 5.0)]),
    (first_match, [([torch.tensor(v) for v in (-1.0, 2.0, 3.0)],), ([torch.tensor(-1.0)],)]),
    (mixed_numbers_and_tuples, [(torch.tensor([1.0]),), (torch.tensor([-1.0]),)]),
])
def test_predicated_execution_gives_eager_results(fn, cases, simulated_capture):
    rewritten, _ = rewrite(fn)
    for args in cases:
        assert _same(rewritten(*args), fn(*args))


def _same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32))
    return a == b


def early_return(x):
    if x.sum() > 0:
        return x
    return -x


def one_branch_name(x):
    if x.sum() > 0:
        y = x
    return y


def prints(x):
    if x.sum() > 0:
        print("positive")
    return x


def raises(x):
    if x.sum() > 0:
        raise ValueError("positive")
    return x


COUNTER = 0


def bumps_a_global(x):
    global COUNTER
    if x.sum() > 0:
        COUNTER += 1
    return x


def tries(x):
    if x.sum() > 0:
        try:
            x = x + 1
        except RuntimeError:
            pass
    return x


def breaks_in_for_else(xs):
    total = torch.zeros(())
    for x in xs:
        if x > 0:
            break
        total = total + x
    else:
        total = total - 1
    return total


def reshapes(x):
    if x.sum() > 0:
        x = x.reshape(-1, 1)
    return x


def python_values_differ(x):
    mode = "small"
    if x.sum() > 0:
        mode = "large"
    return x, mode


class Holder:
    def set_if_positive(self, x):
        if x.sum() > 0:
            self.value = x
        return x


def loop_variable_after_break(xs):
    for i in range(len(xs)):
        if xs[i] > 2:
            break
    return i


def read_inside_and_after(x):
    if x.sum() > 0:
        y = x * 2
        z = y + 1
    else:
        z = x
    return z + y


@pytest.mark.parametrize("fn, words", [
    (Holder().set_if_positive, "an assignment to an attribute"),
    (loop_variable_after_break, "the loop variable 'i' is read after a loop left by a break"),
    (read_inside_and_after, "'y' is assigned in one branch only"),
    (early_return, "a return inside a branch on a CUDA tensor cannot be predicated; assign"),
    (one_branch_name, "'y' is assigned in one branch only"),
    (prints, "a call of print"),
    (raises, "a raise inside a branch"),
    (bumps_a_global, "an assignment to the global or nonlocal 'COUNTER'"),
    (tries, "a try statement"),
    (reshapes, "'x' has shape"),
    (python_values_differ, "'mode' takes different Python values"),
])
def test_what_cannot_be_predicated_is_refused_with_file_and_line(fn, words, simulated_capture):
    rewritten, _ = rewrite(fn)
    lines, first = inspect.getsourcelines(fn)
    line = first + next(i for i, text in enumerate(lines)
                        if text.strip().startswith(("if ", "for ")))
    with pytest.raises(RewriteError, match=words) as caught:
        rewritten(torch.tensor([1.0, 3.0]))
    assert f"{__file__}:{line}" in str(caught.value)


def test_a_break_in_a_loop_with_an_else_clause_is_refused(simulated_capture):
    rewritten, _ = rewrite(breaks_in_for_else)
    with pytest.raises(RewriteError, match="a break or continue inside a branch"):
        rewritten([torch.tensor(-1.0), torch.tensor(2.0)])
    assert rewritten([-1.0, 2.0]) == breaks_in_for_else([-1.0, 2.0])  # Python values: Python's loop


def test_a_tensor_break_in_a_while_loop_is_refused_not_spun(simulated_capture):
    def halve(x):
        while True:
            x = x * 0.5
            if x.sum() < 1:
                break
        return x

    rewritten, _ = rewrite(halve)
    with pytest.raises(RewriteError, match="inside a while loop.*grape.while_loop"):
        rewritten(torch.tensor([8.0]))


def test_wrappers_and_private_names_are_left_alone_with_the_reason():
    import functools

    def twice(fn):
        @functools.wraps(fn)
        def run(x):
            return 2 * fn(x)
        return run

    @twice
    def positive_part(x):
        if x > 0:
            return x
        return 0

    same, why = rewrite(positive_part)
    assert same is positive_part and "wraps another function" in why
    assert positive_part(3) == 6

    class Private:
        def __init__(self):
            self.__scale = 2

        def scaled(self, x):
            if x > 0:
                x = x * self.__scale
            return x

    obj = Private()
    same, why = rewrite(obj.scaled)
    assert same == obj.scaled and "private names" in why


def test_sync_mode_warns_and_synchronizes_instead(simulated_capture):
    rewritten, _ = rewrite(early_return, on_unsupported="sync")
    with pytest.warns(UserWarning, match="synchronizing"):
        assert torch.equal(rewritten(torch.tensor([1.0])), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="on_unsupported"):
        rewrite(early_return, on_unsupported="ignore")


def test_python_conditions_in_refused_constructs_still_work():
    rewritten, _ = rewrite(early_return)
    assert torch.equal(rewritten(torch.tensor([3.0])), torch.tensor([3.0]))
    assert torch.equal(rewritten(torch.tensor([-3.0])), torch.tensor([3.0]))


def test_closures_defaults_and_methods_are_kept():
    scale = torch.tensor(3.0)

    def scaled(x, offset=1.0, *, sign=1):
        if x > 0:
            x = x * scale
        return sign * (x + offset)

    rewritten, _ = rewrite(scaled)
    assert rewritten(torch.tensor(2.0)) == scaled(torch.tensor(2.0))
    assert rewritten(torch.tensor(-2.0), sign=-1) == scaled(torch.tensor(-2.0), sign=-1)

    class Gate(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                x = x + 1
            return super().forward.__name__, x

    gate = Gate()
    method, _ = rewrite(gate.forward)
    assert method(torch.ones(1))[1].item() == 2.0 and method.__self__ is gate


def test_functions_without_branches_or_source_are_left_alone():
    def plain(x):
        return x + 1

    assert rewrite(plain) == (plain, None)
    lam = lambda x: x  # noqa: E731
    assert rewrite(lam)[0] is lam
    assert rewrite(len)[0] is len
    namespace = {}
    exec("def generated(x):\n    if x:\n        return 1\n    return 0", namespace)
    fn, why = rewrite(namespace["generated"])
    assert fn is namespace["generated"] and "source" in why


def test_rewritten_code_predicates_each_branch_and_flags_break():
    names = set(rewrite(first_over)[0].__code__.co_varnames)
    # The two ifs, the guard of what follows each (a break, a continue), and the guard of the
    # whole body (later iterations after a break).
    assert sum(n.startswith("__grape_branch") for n in names) == 5
    assert {"__grape_break1", "__grape_continue2"} <= names


def test_compile_rewrites_by_default_and_can_be_told_not_to():
    step = grape.compile(clamp_and_count)
    assert step.__wrapped__ is clamp_and_count
    assert step.rewritten is True
    assert grape.compile(clamp_and_count, rewrite=False).rewritten is False
    with pytest.raises(TypeError, match="rewrite must be a bool"):
        grape.compile(clamp_and_count, rewrite="yes")


def test_rewritten_source_shows_the_predicated_form_next_to_the_original():
    source = grape.rewritten_source(temporaries)
    # The condition is evaluated once; the original if stays for Python values and eager calls.
    assert "__grape_cond1 = x.sum() > 0" in source
    assert "if __grape_rt.predicated(__grape_cond1):" in source
    assert "with __grape_branch2:" in source and "tmp = x * 2" in source
    assert "x = __grape_rt.merge(__grape_branch2," in source
    assert "elif __grape_cond1:" in source or "if __grape_cond1:" in source
    loop = _rewrite.rewritten_source(first_over)
    assert "__grape_break1 = True" in loop and "__grape_continue2 = True" in loop
    assert "= __grape_rt.live(__grape_break1, __grape_continue2)" in loop  # a guard, predicated too
    assert "if __grape_rt.is_true(__grape_break1, " in loop
    assert _rewrite.rewritten_source(len) is None


def test_generated_code_carries_the_users_line_numbers():
    rewritten, _ = rewrite(first_over)
    lines, first = inspect.getsourcelines(first_over)
    used = {line for _, _, line in rewritten.__code__.co_lines() if line is not None}
    assert used and min(used) >= first and max(used) < first + len(lines)


def test_unreachable_code_after_break_keeps_names_local():
    def after_continue(xs):
        for x in xs:
            if x > 0:
                continue
                d = 1  # noqa: F841  (unreachable, but it makes d a local)
        return d  # noqa: F821

    rewritten, _ = rewrite(after_continue)
    with pytest.raises(UnboundLocalError):
        after_continue([1])
    with pytest.raises(UnboundLocalError):
        rewritten([1])
