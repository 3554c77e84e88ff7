"""The tensor-parallel split of GPT-J that benchmarks.hf_gptj_tp measures, checked on the CPU: two
ranks over gloo, each holding half of every split layer, compute what the unsplit model computes,
through HF's own forward and `generate`."""

import pytest
import torch
import torch.distributed as dist

from ranks import returned, run_ranks

transformers = pytest.importorskip("transformers")

from benchmarks import generation, hf_gptj  # noqa: E402  (after the skip without transformers)
from benchmarks.hf_gptj_tp import parallelize_gptj, shard_gptj  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed with gloo, which the ranks talk over")

WORLD = 2
NEW_TOKENS = 8
# Split layers of a block: how each is cut (rows: output features; columns: input features).
ROWS = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "mlp.fc_in.weight",
        "mlp.fc_in.bias")
COLUMNS = ("attn.out_proj.weight", "mlp.fc_out.weight")


def tiny_gptj():
    """hf_gptj's tiny GPT-J (2 layers, n_embd 256, 4 heads) in float32, the same on every rank.
    HF initializes biases to zero, which would hide a bias added on every rank: they are drawn."""
    torch.manual_seed(0)
    model = transformers.GPTJForCausalLM(hf_gptj.gptj_config(True, 0.02)).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.02)
    return model


def split_and_unsplit(rank, world, by="megatron"):
    """One rank: the unsplit model and its split (by the benchmark's shard_gptj, or by
    parallelize_module), the same prompt through both."""
    torch.set_num_threads(1)  # the ranks share the CI machine's cores
    unsplit = tiny_gptj()
    split = (parallelize_gptj(tiny_gptj(), world, "cpu") if by == "dtensor"
             else shard_gptj(tiny_gptj(), rank, world))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, unsplit.config.vocab_size, (1, 12), generator=g)
    kwargs = dict(attention_mask=torch.ones_like(ids), **generation.generate_kwargs(1, NEW_TOKENS))
    with torch.no_grad():
        return {
            "logits": split(ids).logits, "unsplit_logits": unsplit(ids).logits,
            "tokens": split.generate(ids, **kwargs),
            "unsplit_tokens": unsplit.generate(ids, **kwargs),
            "block": {name: (p.to_local() if hasattr(p, "to_local") else p).detach()
                      for name, p in split.transformer.h[0].named_parameters()},
            "unsplit_block": dict(unsplit.transformer.h[0].named_parameters()),
            "heads": split.transformer.h[0].attn.num_attention_heads,
        }


@pytest.fixture(scope="module")
def ranks():
    """What each of the two ranks computed, rank by rank."""
    return returned(run_ranks(split_and_unsplit, WORLD))


def test_split_logits_equal_the_unsplit_models(ranks):
    for r in ranks:
        want = r["unsplit_logits"]
        # float32 sums taken in another order: an error of a few ulps of the logits' scale
        torch.testing.assert_close(r["logits"], want, rtol=0, atol=1e-5 * want.abs().max().item())


def test_split_generate_gives_the_unsplit_models_tokens(ranks):
    for r in ranks:
        assert r["tokens"].shape[1] == r["unsplit_tokens"].shape[1]
        assert torch.equal(r["tokens"], r["unsplit_tokens"])


def test_each_rank_holds_its_half_of_every_split_layer_and_the_halves_make_the_whole(ranks):
    unsplit = ranks[0]["unsplit_block"]
    for name in ROWS + COLUMNS:
        halves = [r["block"][name] for r in ranks]
        assert all(h.numel() * WORLD == unsplit[name].numel() for h in halves), name
        dim = 0 if name in ROWS else 1
        assert torch.equal(torch.cat(halves, dim), unsplit[name]), name
    assert [r["heads"] for r in ranks] == [2, 2]  # of GPT-J tiny's 4


def test_the_row_parallel_bias_lives_on_rank_0_only(ranks):
    bias = "mlp.fc_out.bias"
    assert torch.equal(ranks[0]["block"][bias], ranks[0]["unsplit_block"][bias])
    assert bias not in ranks[1]["block"]


def test_replicated_layers_are_whole_on_every_rank(ranks):
    for r in ranks:
        for name in ("ln_1.weight", "ln_1.bias"):
            assert torch.equal(r["block"][name], r["unsplit_block"][name])


def test_the_split_by_parallelize_module_computes_what_the_unsplit_model_does():
    for r in returned(run_ranks(split_and_unsplit, WORLD, "dtensor")):
        want = r["unsplit_logits"]
        torch.testing.assert_close(r["logits"], want, rtol=0, atol=1e-5 * want.abs().max().item())
        assert torch.equal(r["tokens"], r["unsplit_tokens"])
        assert r["heads"] == 2
        # Its projections hold a local half each, as DTensor shards.
        assert r["block"]["attn.q_proj.weight"].shape[0] * WORLD == \
            r["unsplit_block"]["attn.q_proj.weight"].shape[0]
