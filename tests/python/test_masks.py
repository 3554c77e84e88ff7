"""grape/_masks.py: transformers' mask rules decide as in eager calls inside grape's captures
(Note [Masks of unpadded batches under capture]), on a release that needs it and on one that
does not; runs on any machine."""

import threading
import types

import pytest
import torch

from grape import _hooks, _masks


@pytest.fixture(autouse=True)
def outside_every_context():
    """This thread outside eager_mask_rules, whatever an earlier test entered for its process (the
    benchmarks' harness enters it for the rest of theirs)."""
    depth = getattr(_masks._here, "depth", 0)
    _masks._here.depth = 0
    yield
    _masks._here.depth = depth


def release(skips_unpadded_when_tracing: bool) -> types.ModuleType:
    """A masking module shaped as transformers': is_tracing says whether `capturing` is set."""
    m = types.ModuleType("masking_release")
    m.capturing = False
    m.is_tracing = lambda tensor=None: m.capturing

    def _ignore_bidirectional_mask_sdpa(padding_mask, kv_length, local_attention_size=None):
        traced = m.is_tracing(padding_mask) and not (skips_unpadded_when_tracing and padding_mask is None)
        return not traced and (padding_mask is None or bool(padding_mask.all()))

    def _ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, q_offset, kv_offset,
                                 local_attention_size=None):
        traced = m.is_tracing(padding_mask) and not (skips_unpadded_when_tracing and padding_mask is None)
        return not traced and (q_length == 1 or kv_length == q_length) and \
            (padding_mask is None or bool(padding_mask.all()))

    m._ignore_bidirectional_mask_sdpa = _ignore_bidirectional_mask_sdpa
    m._ignore_causal_mask_sdpa = _ignore_causal_mask_sdpa
    return m


def test_inside_the_context_an_unpadded_batch_skips_its_mask_as_in_eager_calls():
    m = release(skips_unpadded_when_tracing=False)
    assert _masks.install(m) == ["_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa"]
    m.capturing = True
    assert not m._ignore_bidirectional_mask_sdpa(None, 16)  # outside: the release's answer
    with _masks.eager_mask_rules():
        assert m._ignore_bidirectional_mask_sdpa(None, 16)
        assert m._ignore_causal_mask_sdpa(None, 16, 16, 0, 0)
        assert m._ignore_causal_mask_sdpa(None, 1, 17, 16, 0)
        assert not m._ignore_causal_mask_sdpa(None, 4, 17, 13, 0)  # what eager decides: a mask
        # A padding mask would be read, which a capture cannot: the release's answer stands.
        assert not m._ignore_bidirectional_mask_sdpa(torch.ones(1, 16, dtype=torch.bool), 16)
        # Tracing is answered as before outside the rule, and after it.
        assert m.is_tracing() is True
    assert not m._ignore_bidirectional_mask_sdpa(None, 16)
    m.capturing = False
    assert m._ignore_bidirectional_mask_sdpa(None, 16) and m.is_tracing() is False


def test_other_threads_keep_the_releases_answer():
    m = release(skips_unpadded_when_tracing=False)
    _masks.install(m)
    m.capturing = True
    seen = []
    with _masks.eager_mask_rules():
        other = threading.Thread(target=lambda: seen.append(m._ignore_bidirectional_mask_sdpa(None, 16)))
        other.start()
        other.join()
        assert m._ignore_bidirectional_mask_sdpa(None, 16)
    assert seen == [False]


def test_a_release_that_skips_already_is_left_alone_and_installing_twice_wraps_once():
    m = release(skips_unpadded_when_tracing=True)
    rule = m._ignore_causal_mask_sdpa
    assert _masks.install(m) == [] and m._ignore_causal_mask_sdpa is rule
    old = release(skips_unpadded_when_tracing=False)
    first = _masks.install(old)
    wrapped = old._ignore_causal_mask_sdpa
    assert _masks.install(old) is first and old._ignore_causal_mask_sdpa is wrapped
    assert set(first) <= set(_masks.rules_changed())


def test_a_rule_of_another_signature_or_a_module_without_is_tracing_is_left_alone():
    m = release(skips_unpadded_when_tracing=False)
    m._ignore_causal_mask_sdpa = lambda padding_mask, a, b, c, d, e: False  # needs more arguments
    assert _masks.install(m) == ["_ignore_bidirectional_mask_sdpa"]
    bare = types.ModuleType("no_tracing")
    bare._ignore_bidirectional_mask_sdpa = lambda padding_mask, kv_length: False
    assert _masks.install(bare) == []


def test_every_capture_runs_in_eager_mask_rules():
    hooks = _hooks.RuntimeHooks("f")
    with hooks.capture_settings():
        assert _masks._here.depth == 1
    assert _masks._here.depth == 0


def test_the_installed_transformers_gets_what_it_needs():
    masking = pytest.importorskip("transformers.masking_utils")
    already = hasattr(masking, _masks._MARK)  # another test's grape capture may have installed it
    tracing = masking.is_tracing
    changed = _masks.install(masking)
    assert set(changed) <= {name for name, _ in _masks.RULES}
    # As under a capture (tracing), inside grape's context: the mask of an unpadded batch is
    # skipped, as in eager calls.
    with _masks.eager_mask_rules():
        for name, unpadded in _masks.RULES:
            assert _masks._forcing_tracing(True, getattr(masking, name), *unpadded), name
    if not changed and not already:
        assert masking.is_tracing is tracing  # a release that needs nothing is left as it was


def test_a_bert_forward_as_under_capture_passes_sdpa_no_mask_as_in_eager(monkeypatch):
    transformers = pytest.importorskip("transformers")
    masking = pytest.importorskip("transformers.masking_utils")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                  num_attention_heads=4, vocab_size=512, max_position_embeddings=128)
    model = transformers.BertModel(cfg).eval()
    masks = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    _masks.install(masking)
    ids = torch.randint(2, 512, (1, 8))
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state
        assert masks[-1] is None  # eager: no mask
        with _masks.eager_mask_rules():  # tracing forced, as a stream capture makes it
            got = _masks._forcing_tracing(True, model, input_ids=ids).last_hidden_state
        assert masks[-1] is None and torch.equal(got, want)
