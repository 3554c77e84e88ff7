"""What a signature costs on its way to replays (grape.stats entries' "seconds", and the totals):
the warm-up, the capture, and of the capture, reading the graph, joining and instantiating."""

import pytest
import torch

import grape

pytestmark = pytest.mark.gpu


def test_each_signature_reports_what_it_cost_on_its_way_to_replays():
    f = grape.compile(lambda x: (x * 2).sin() + 1, warmup_each_signature=True)
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


def test_a_capture_reports_the_time_spent_in_the_function_itself():
    """capture_function_seconds: of a capture's time, the function's own (a host-side sleep in it
    counts there); the capture's work around it is the rest."""
    import time

    def slow(x):
        time.sleep(0.05)  # host work inside the capture, as a slow forward's Python would be
        return x * 2

    f = grape.compile(slow, warmup=0)
    x = torch.randn(8, device="cuda")
    torch.testing.assert_close(f(x), x * 2)
    s = grape.stats(f)
    assert s["captures"] == 1 and s["replays"] == 1
    assert 0.05 <= s["capture_function_seconds"] <= s["capture_seconds"]


DIM, VOCAB = 64, 97


def _decoder():
    """A generate-like forward: one attention layer whose key and value caches grow by the tokens
    it is given, returning the next token and the caches (each length a new signature)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    emb = torch.randn(VOCAB, DIM, device="cuda", generator=g)
    wq, wk, wv = (torch.randn(DIM, DIM, device="cuda", generator=g) / DIM**0.5 for _ in range(3))

    def forward(tokens, k, v):
        x = emb[tokens]
        k = torch.cat([k, x @ wk], 1)
        v = torch.cat([v, x @ wv], 1)
        att = torch.softmax((x[:, -1:] @ wq) @ k.transpose(1, 2) / DIM**0.5, -1) @ v
        return (att @ emb.T).argmax(-1), k, v

    return forward


def _generate(forward, prompt, new_tokens):
    k = v = torch.zeros(1, 1, DIM, device="cuda")
    token, k, v = forward(prompt, k, v)
    tokens = [token]
    for _ in range(new_tokens - 1):
        token, k, v = forward(token, k, v)
        tokens.append(token)
    return torch.cat(tokens, 1)


def test_a_generate_loop_replays_every_step_from_its_second_call():
    forward = _decoder()
    compiled = grape.compile(forward)
    prompt = torch.randint(0, VOCAB, (1, 5), device="cuda", generator=torch.Generator(
        device="cuda").manual_seed(1))
    expected = _generate(forward, prompt, 12)
    keys = ("captures", "replays", "warmup_calls", "eager_calls", "chain_variants",
            "capture_failures")
    counts = [dict.fromkeys(keys, 0)]
    for _ in range(3):
        assert torch.equal(_generate(compiled, prompt, 12), expected)
        s = grape.stats(compiled)
        counts.append({k: s[k] for k in keys})
    calls = [{k: after[k] - before[k] for k in keys} for before, after in zip(counts, counts[1:])]
    # Call 1: the function's first call (the prompt) warms up; every step is captured at first
    # sight and replayed.
    assert calls[0] == dict(captures=11, replays=11, warmup_calls=1, eager_calls=0,
                            chain_variants=0, capture_failures=0)
    # Call 2: the prompt, whose first call was the function's warm-up, is captured; every step
    # replays, none captured again. The first step copies the prompt's graph's outputs into its
    # placeholders (its upstream graph is new), which lays out no variant down the chain.
    assert calls[1] == dict(captures=1, replays=12, warmup_calls=0, eager_calls=0,
                            chain_variants=0, capture_failures=0)
    assert calls[2] == dict(captures=0, replays=12, warmup_calls=0, eager_calls=0,
                            chain_variants=0, capture_failures=0)
