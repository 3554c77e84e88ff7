"""grape/_stats.py's table defines every key of grape.stats(): a key the runtime reports but the
table lacks fails here, as does a docs/semantics.md table that differs from it."""

import os
import warnings

import pytest
import torch

import grape
from grape import _stats

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "semantics.md")


def _stats_after_calls(device):
    f = grape.compile(lambda x: x * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", grape.FallbackWarning)
        for _ in range(3):
            f(torch.ones(4, device=device))
    return grape.stats(f)


def test_every_key_is_in_the_table_and_only_those():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    keys = set(_stats_after_calls(device))
    assert keys - set(_stats.KEYS) == set(), "keys missing from grape/_stats.py"
    assert set(_stats.KEYS) - keys == set(), "keys in grape/_stats.py that grape.stats lacks"


@pytest.mark.gpu
def test_a_function_with_graphs_reports_the_same_keys():
    s = _stats_after_calls("cuda")
    assert s["replays"] > 0  # the graph path ran
    assert set(s) == set(_stats.KEYS)


def test_each_key_is_defined_once():
    assert len(_stats.KEYS) == len(set(_stats.KEYS))


def test_the_docs_table_is_the_table():
    with open(DOCS) as f:
        docs = f.read()
    assert _stats.markdown_table() in docs, (
        "docs/semantics.md's grape.stats table differs from grape/_stats.py: paste the output of "
        "python -m grape._stats")


def test_the_docstring_names_every_key():
    for key in _stats.KEYS:
        assert f"``{key}``" in grape.stats.__doc__


def test_fallbacks_carry_their_kind():
    s = _stats_after_calls("cpu")
    assert s["fallbacks"] and all(f["kind"] for f in s["fallbacks"])


def test_printed_stats_are_a_short_summary_and_the_dict_stays_whole():
    s = _stats.Stats(calls=10, replays=7, warmup_calls=1, eager_calls=2, graphs=2, signatures=3,
                     captures=2, recaptures=0, warmup_seconds=0.5, capture_seconds=0.25,
                     pool_bytes=3 << 20, executable_bytes=1 << 20, memory_budget=None,
                     fallback=None, name="step",
                     fallbacks=[{"signature": "(Float[4] cuda:0)", "kind": "host_sync",
                                 "reason": "capture failed: .item() at model.py:3",
                                 "call_site": "run.py:9"}])
    text = str(s)
    assert text.splitlines()[0] == "grape.stats(step): 10 calls: 7 replayed, 1 warm-up, 2 eager"
    assert "2 for 3 signatures; 2 captures, 0 recaptures" in text
    assert "warm-up 0.50 s, captures 0.25 s" in text and "pool 3.0 MiB" in text
    assert "(Float[4] cuda:0) host_sync: capture failed: .item() at model.py:3" in text
    assert len(text.splitlines()) <= 8
    assert s["calls"] == 10 and dict(s) == s and repr(s) == repr(dict(s))
    one = _stats.Stats(calls=1, replays=0, warmup_calls=0, eager_calls=1, name="step")
    assert str(one).splitlines()[0] == "grape.stats(step): 1 call: 0 replayed, 0 warm-up, 1 eager"


def test_printed_stats_give_a_whole_functions_fallback_once():
    every = {"signature": None, "kind": "no_cuda", "reason": "CUDA is not available"}
    s = _stats.Stats(calls=3, eager_calls=3, name="f", fallback="CUDA is not available",
                     fallbacks=[every])
    text = str(s)
    assert text.count("CUDA is not available") == 1, text
    assert "every call runs eagerly: CUDA is not available" in text
    assert "fallbacks: none" not in text
    # A signature's own fallback beside it is still listed.
    own = {"signature": "(Float[2] cpu)", "kind": "host_sync", "reason": ".item() at f.py:2"}
    s["fallbacks"] = [every, own]
    assert "(Float[2] cpu) host_sync: .item() at f.py:2" in str(s)
    assert str(s).count("CUDA is not available") == 1
