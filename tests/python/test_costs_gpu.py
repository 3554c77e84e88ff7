"""What a signature costs on its way to replays (grape.stats entries' "seconds", and the totals):
the warm-up, the capture, and of the capture, reading the graph, joining and instantiating."""

import pytest
import torch

import grape

pytestmark = pytest.mark.gpu


def test_each_signature_reports_what_it_cost_on_its_way_to_replays():
    f = grape.compile(lambda x: (x * 2).sin() + 1)
    for rows in (8, 16):
        for _ in range(3):
            f(torch.randn(rows, 64, device="cuda"))
    s = grape.stats(f)
    assert s["warmup_calls"] == 2 and s["replays"] == 4 and s["eager_calls"] == 0  # graphs ran
    # A third call may bring its input in a predicted site's buffer: a chain variant, which joins
    # its signature's executable like the second shape joins the first's.
    assert s["captures"] == 2 + s["chain_variants"]
    assert s["graphs_joined"] == 1 + s["chain_variants"]
    costs = {e["signature"]: e["seconds"] for e in s["entries"]}
    first = next(c for sig, c in costs.items() if "[8, 64]" in sig)
    second = next(c for sig, c in costs.items() if "[16, 64]" in sig)
    for c in (first, second):
        assert c["warmup"] > 0 and c["capture"] > 0 and c["read"] > 0
        assert c["read"] + c["join"] + c["instantiate"] <= c["capture"]
        assert c["variants"] <= c["capture"]
    assert first["instantiate"] > 0  # started the group
    assert second["join"] > 0  # joined it
    assert s["warmup_seconds"] == pytest.approx(first["warmup"] + second["warmup"])
    assert s["graph_read_seconds"] == pytest.approx(first["read"] + second["read"])
    assert s["instantiate_seconds"] >= first["instantiate"] + second["instantiate"] - 1e-9
    # An entry's capture counts every try and its set-up; the total, successful captures alone.
    assert first["capture"] + second["capture"] >= s["capture_seconds"]
    variants = first["variants"] + second["variants"]
    assert (variants > 0) == (s["chain_variants"] > 0) and variants >= s["chain_variant_seconds"]
