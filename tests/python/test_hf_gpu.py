"""grape.compile(model) on Hugging Face GPT-2 (a tiny config, random weights) with `generate`
unchanged: tokens equal to eager, the DynamicCache's layers rebound on every replay (Note
[Argument objects]), and steady generations served by graphs."""

import copy
import functools

import pytest
import torch

import grape

transformers = pytest.importorskip("transformers")

from benchmarks import generation  # noqa: E402  (after the skip without transformers)

# A FallbackWarning fails a test here unless it is marked expects_fallback (conftest.py).
pytestmark = [pytest.mark.gpu]

DEV = "cuda"


def tiny_gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=128,
                                  bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return transformers.GPT2LMHeadModel(cfg).to(DEV).eval()


def prompt(batch, length, seed=1):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(2, 512, (batch, length), generator=g).to(DEV)


@pytest.mark.parametrize("batch,beams", [(1, 1), (3, 1), (2, 3)])
def test_generate_equals_eager_and_replays(batch, beams):
    eager = tiny_gpt2()
    model = grape.compile(copy.deepcopy(eager))
    ids = prompt(batch, 5)
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=16, do_sample=False, num_beams=beams, attention_mask=mask,
                  min_new_tokens=16)
    want = eager.generate(ids, **kwargs)
    for _ in range(3):  # warm-up, capture, replays
        assert torch.equal(model.generate(ids, **kwargs), want)
    s = grape.stats(model)
    assert not s["fallbacks"], s["fallbacks"]
    calls = s["calls"]
    replays = s["replays"]
    assert torch.equal(model.generate(ids, **kwargs), want)
    s = grape.stats(model)
    assert s["calls"] - calls == 16 and s["replays"] - replays == 16  # every forward a replay


def test_the_cache_holds_what_eager_leaves_in_it():
    eager = tiny_gpt2()
    model = grape.compile(copy.deepcopy(eager))
    ids = prompt(2, 4)

    @torch.no_grad()
    def run(m):
        cache = transformers.DynamicCache(config=m.config)
        kv = generation.cache_keyword(transformers.GPT2LMHeadModel)
        out = m(input_ids=ids, use_cache=True, **{kv: cache})
        tok = out.logits[:, -1:].argmax(-1)
        for _ in range(6):
            out = m(input_ids=tok, use_cache=True, **{kv: cache})
            assert generation.cache_of(out) is cache  # the argument object, returned as itself
            tok = out.logits[:, -1:].argmax(-1)
        return cache, out.logits

    want_cache, want_logits = run(eager)
    for _ in range(3):
        cache, logits = run(model)
        torch.testing.assert_close(logits, want_logits)
        assert cache.get_seq_length() == want_cache.get_seq_length() == 10
        for got, ref in zip(cache.layers, want_cache.layers):
            torch.testing.assert_close(got.keys, ref.keys)
            torch.testing.assert_close(got.values, ref.values)
    assert grape.stats(model)["replays"] > 0 and not grape.stats(model)["fallbacks"]


def test_generate_over_torch_compiled_decode_steps_replays_the_compiled_kernels():
    # A forward whose decode steps (one new token) run torch.compile'd code and whose prompt runs
    # eagerly (hf_gptj's grape_inductor): only signatures that make host constants capture under
    # the pinning mode, so the compiled steps capture without compiling again (Note [Host
    # constants]), and every forward of a steady generation is a replay.
    torch._dynamo.reset()
    model = tiny_gpt2()
    eager_forward = model.forward
    decode = torch.compile(eager_forward, dynamic=True)

    @functools.wraps(eager_forward)  # generate reads forward's signature
    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        return (decode if ids.shape[1] == 1 else eager_forward)(*args, **kwargs)

    model.forward = forward
    ids = prompt(1, 5)
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False,
                  attention_mask=torch.ones_like(ids))
    want = model.generate(ids, **kwargs)  # the same compiled code, without graphs
    compiled_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    grape.compile(model)
    for _ in range(3):  # warm-up, capture, replays
        assert torch.equal(model.generate(ids, **kwargs), want)
    s = grape.stats(model)
    assert not s["fallbacks"], s["fallbacks"]
    assert s["capture_failures"] == 0 and s["eager_calls"] == 0
    calls, replays = s["calls"], s["replays"]
    assert torch.equal(model.generate(ids, **kwargs), want)
    s = grape.stats(model)
    assert s["calls"] - calls == 16 and s["replays"] - replays == 16
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiled_graphs


def test_an_encoder_without_a_mask_gives_eagers_bits_from_its_replays():
    # transformers up to 5.17 builds an unpadded batch's mask under capture, where eager builds
    # none; grape's captures decide as eager (Note [Masks of unpadded batches under capture]), so
    # the captured forward runs eager's attention kernel, to the bit.
    from grape import _masks

    depth = getattr(_masks._here, "depth", 0)
    _masks._here.depth = 0  # as a user's process: no benchmark entered the rule for its whole life
    try:
        torch.manual_seed(0)
        cfg = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, vocab_size=512,
                                      max_position_embeddings=128)
        eager = transformers.BertModel(cfg).to(DEV, torch.bfloat16).eval()
        model = grape.compile(copy.deepcopy(eager))
        with torch.no_grad():
            for length in (8, 16, 8, 16, 8, 16):
                ids = prompt(1, length)
                assert torch.equal(model(input_ids=ids).last_hidden_state,
                                   eager(input_ids=ids).last_hidden_state)
        s = grape.stats(model)
        assert not s["fallbacks"] and s["replays"] >= 4, s
    finally:
        _masks._here.depth = depth
