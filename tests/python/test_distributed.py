"""Capture points agreed across torch.distributed ranks (grape/_distributed.py) and collectives
refused in predicated bodies, on the CPU: ranks are processes of one gloo process group."""

import pytest
import torch
import torch.distributed as dist

import grape
from grape import _distributed, _predicate
from ranks import returned, run_ranks

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def test_ranks_that_all_captured_replay():
    outcomes = [("(Half[8, 4] cuda:0)", "", False), ("(Half[8, 4] cuda:1)", "", False)]
    assert _distributed.common_outcome("f", 0, outcomes) == ("", False)


def test_a_refusal_on_one_rank_is_every_rank_s_reason():
    outcomes = [("(f32[4] cuda:0)", "", False),
                ("(f32[4] cuda:1)", "returns a tensor on cpu", False)]
    reason, out_of_memory = _distributed.common_outcome("f", 3, outcomes)
    assert reason.startswith("returns a tensor on cpu (on rank 1;") and not out_of_memory


def test_one_reason_on_every_rank_is_given_as_it_is():
    outcomes = [("(f32[4])", "out of memory", True), ("(f32[4])", "out of memory", True)]
    assert _distributed.common_outcome("f", 0, outcomes) == ("out of memory", True)


def test_ranks_at_different_signatures_disagree():
    outcomes = [("(f32[4])", "", False), ("(f32[5])", "", False)]
    with pytest.raises(_distributed.RanksDisagree, match=r"capture point 2 with different "
                       r"signatures \(rank 0: \(f32\[4\]\); rank 1: \(f32\[5\]\)\)"):
        _distributed.common_outcome("f", 2, outcomes)


def agree_at_points(rank, world, reasons_by_rank, signatures_by_rank):
    """Each rank goes through the capture points of one function with its own outcomes."""
    points = _distributed.CapturePoints("step")
    got = []
    for reason, signature in zip(reasons_by_rank[rank], signatures_by_rank[rank]):
        try:
            got.append(points.agree(signature, reason, False))
        except _distributed.RanksDisagree as e:
            got.append(("raised", str(e)))
            break
    return got


def test_every_rank_takes_the_path_of_the_rank_that_refused():
    reasons = [["", "", ""], ["", "returns a tensor on cpu", ""]]
    signatures = [["(f32[4] cuda:0)", "(f32[8] cuda:0)", "(f32[16] cuda:0)"],
                  ["(f32[4] cuda:1)", "(f32[8] cuda:1)", "(f32[16] cuda:1)"]]
    ranks = returned(run_ranks(agree_at_points, 2, reasons, signatures))
    assert ranks[0] == ranks[1]
    assert [r[0] for r in ranks[0]] == ["", ranks[0][1][0], ""]
    assert ranks[0][1][0].startswith("returns a tensor on cpu (on rank 1;")


def test_ranks_at_different_signatures_fail_alike():
    reasons = [["", ""], ["", ""]]
    signatures = [["(f32[4])", "(f32[8])"], ["(f32[4])", "(f32[9])"]]
    ranks = returned(run_ranks(agree_at_points, 2, reasons, signatures))
    assert ranks[0] == ranks[1]
    kind, message = ranks[0][1]
    assert kind == "raised" and "capture point 1 with different signatures" in message


def test_a_rank_that_does_not_reach_a_capture_point_is_named():
    reasons = [["", ""], [""]]
    signatures = [["(f32[4])", "(f32[8])"], ["(f32[4])"]]
    ranks = returned(run_ranks(agree_at_points, 2, reasons, signatures,
                               env={_distributed.TIMEOUT_ENV: "1"}))
    kind, message = ranks[0][1]
    assert kind == "raised" and "rank(s) [1] did not reach capture point 1 within 1 s" in message
    assert len(ranks[1]) == 1


def collective_under_refusal(rank, world):
    x = torch.ones(2)
    with _predicate._CollectivesRefused("grape.Predicate"):
        y = x * 2  # other operators run
        try:
            dist.all_reduce(y)
        except grape.PredicateError as e:
            return str(e), y.tolist()
    return None, y.tolist()


def test_a_collective_in_a_predicated_body_is_refused():
    (message, values), = returned(run_ranks(collective_under_refusal, 1))
    assert values == [2.0, 2.0]
    assert message.startswith("grape.Predicate: a torch.distributed collective (c10d.allreduce_")
