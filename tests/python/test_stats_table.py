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
