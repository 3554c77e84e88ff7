"""Hugging Face model zoo: many architectures, each from a small random config in bf16, through its
own unchanged `generate` (decoders and encoder-decoders: batch 1, a 16-token prompt, greedy) or a
forward over 6 lengths (encoders), eager against grape.compile(model) on the same weights, and
grape_plan_free (grape.compile(model, plan_free_attention=True): its calls run attention on
backends that build no per-shape plan); grape_cached and grape_plan_free_cached (when asked
for; decoders and encoder-decoders): the same with a graph cache directory, which a first process
of this script fills, then measured in a second, fresh one, that mode alone (its first call from
a cold process), its tokens compared with this process's eager's; the filling process's
graph_cache stats are filling_graph_cache, the measured one's graph_cache; eager_cold (when asked
for): eager alone in a fresh process, the cold first call the cached modes' is compared with
(first_call_ratio_to_cold_eager).

    python -m benchmarks.hf_zoo                        # every architecture, 64 new tokens
    python -m benchmarks.hf_zoo --quick                # smoke run: 8 new tokens, 1 rep
    python -m benchmarks.hf_zoo --cases llama,bert     # some of them
    python -m benchmarks.hf_zoo --quick --device cpu   # the script itself (grape runs eagerly)
    python -m benchmarks.hf_zoo --modes eager,eager_cold,grape_plan_free_cached --cases whisper

A case is an architecture (its name in ZOO); its config is the model type and the small sizes it
was built with. Modes run one after another in one process, eager first, each on a copy of the
same weights: only eager's first call is from a cold process for its model (kernels and library
plans that eager made are warm for grape); `first_call_ratio_to_eager` says so by its name only.
Per mode, as generation.measure gives them: `ms_per_step` (per new token; encoders: per forward),
the median over --reps calls once the mode is steady; `first_call_s`, `time_to_steady_s`,
`calls_to_steady`, `calls_ms` (every call, in order). grape's `correct` (tokens
equal eager's; encoders: the last hidden states equal to the bit), `replayed_share_from_call3`
(of the model's forwards in calls 3 and later, the share that replayed, the prompt included),
`speedup_vs_eager`, `first_call_ratio_to_eager` (its first call over eager's), `captures_per_call`,
and its fallbacks with their reasons. Transformers up to 5.17 builds a dense attention mask under capture where eager
builds none; grape's captures apply its later rule (no padding mask, no mask: Note [Masks of
unpadded batches under capture]), and the config names the rules that needed it. Writes JSON and
a markdown table (benchmarks/results/ on a GPU).
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from benchmarks import generation, harness

MODES = ["eager", "grape", "grape_plan_free"]  # the default
# When asked for, each in processes of its own (fresh_process_mode): the cached modes in two
# (the mode without the suffix), eager_cold in one.
CACHED = ("grape_cached", "grape_plan_free_cached")
EAGER_COLD = "eager_cold"
FRESH = CACHED + (EAGER_COLD,)
PROMPT = 16
ENCODER_LENGTHS = (8, 16, 24, 32, 48, 64)  # one encoder call: a forward at each

# Sizes every decoder shares (names as transformers' configs take them); a family's own below.
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
ENCODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               vocab_size=512, max_position_embeddings=256)
SEQ2SEQ = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=512,
               max_position_embeddings=256)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=64)

# name: (kind, model type, config sizes). Kinds: "decoder" (a causal LM's generate),
# "seq2seq" (an encoder-decoder's generate over token ids), "speech" (over audio features),
# "encoder" (a forward at each of ENCODER_LENGTHS).
ZOO = {
    "llama": ("decoder", "llama", SMALL),
    "qwen2": ("decoder", "qwen2", SMALL),
    "qwen3": ("decoder", "qwen3", dict(SMALL, head_dim=16)),
    "qwen3_moe": ("decoder", "qwen3_moe", dict(SMALL, head_dim=16, num_experts=4, **MOE)),
    "mixtral": ("decoder", "mixtral", dict(SMALL, num_local_experts=4, num_experts_per_tok=2)),
    "mistral": ("decoder", "mistral", dict(SMALL, sliding_window=8)),
    "gemma2": ("decoder", "gemma2", dict(SMALL, head_dim=16, sliding_window=8)),
    "gemma3": ("decoder", "gemma3_text", dict(SMALL, head_dim=16, sliding_window=8)),
    "phi3": ("decoder", "phi3", SMALL),
    "gpt_neox": ("decoder", "gpt_neox", dict(SMALL, rotary_pct=0.5)),
    "falcon": ("decoder", "falcon", dict(SMALL, new_decoder_architecture=True, num_kv_heads=2)),
    "opt": ("decoder", "opt", dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                   num_attention_heads=4, vocab_size=512, word_embed_proj_dim=64,
                                   max_position_embeddings=256)),
    "bloom": ("decoder", "bloom", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=512)),
    "gpt2": ("decoder", "gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512,
                                     n_positions=256)),
    "deepseek_v3": ("decoder", "deepseek_v3", dict(
        SMALL, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4, n_shared_experts=1, n_group=1,
        topk_group=1, first_k_dense_replace=1, **MOE)),
    "t5": ("seq2seq", "t5", dict(d_model=64, d_ff=128, d_kv=16, num_layers=2,
                                 num_decoder_layers=2, num_heads=4, vocab_size=512)),
    "bart": ("seq2seq", "bart", SEQ2SEQ),
    "whisper": ("speech", "whisper", dict(SEQ2SEQ, num_mel_bins=16, max_source_positions=32,
                                          max_target_positions=256)),
    "bert": ("encoder", "bert", ENCODER),
    "roberta": ("encoder", "roberta", dict(ENCODER, pad_token_id=1)),
}
NEEDS = "hf_zoo needs a CUDA device (--device cpu runs the script itself, grape eagerly)"


def build(name: str, device: str):
    """The architecture's model, random weights from its small config, in bf16 on `device`."""
    import transformers

    kind, model_type, sizes = ZOO[name]
    config = transformers.AutoConfig.for_model(model_type, **sizes)
    # Special token ids inside the small vocabulary; no EOS, so that every generation makes as
    # many tokens as asked.
    for key in ("pad_token_id", "bos_token_id", "decoder_start_token_id"):
        token = getattr(config, key, None)
        if not isinstance(token, int) or token >= config.vocab_size:
            setattr(config, key, 0)
    config.eos_token_id = None
    auto = {"decoder": transformers.AutoModelForCausalLM,
            "seq2seq": transformers.AutoModelForSeq2SeqLM,
            "speech": transformers.AutoModelForSpeechSeq2Seq,
            "encoder": transformers.AutoModel}[kind]
    torch.manual_seed(0)
    model = auto.from_config(config).to(device, torch.bfloat16).eval()
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.eos_token_id = None
        generation_config.pad_token_id = config.pad_token_id
    return model


def inputs(model, kind: str, device: str) -> dict:
    """The arguments of one call: a prompt (or audio features) and its mask; for encoders, a
    batch of token ids at each length."""
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    if kind == "encoder":
        return {"batches": [torch.randint(2, vocab, (1, n), generator=g).to(device)
                            for n in ENCODER_LENGTHS]}
    if kind == "speech":
        frames = 2 * model.config.max_source_positions
        features = torch.randn(1, model.config.num_mel_bins, frames, generator=g)
        return {"input_features": features.to(device, torch.bfloat16)}
    ids = torch.randint(2, vocab, (1, PROMPT), generator=g).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def call(model, kind: str, args: dict, new_tokens: int):
    """One call of the mode's workload: its outputs (the tokens, or each length's last hidden
    state)."""
    if kind == "encoder":
        return [model(input_ids=ids).last_hidden_state for ids in args["batches"]]
    return model.generate(**args, **generation.generate_kwargs(1, new_tokens))


def run_mode(base, kind: str, args: dict, mode: str, new_tokens: int, reps: int,
             steady_calls: int, cache_dir: str | None = None) -> dict:
    """One mode's figures; `cache_dir` (a process of a cached mode, CACHED): grape
    compiles with that cache directory, saves it at the end, and its tokens are kept as a list
    (they travel in the results file)."""
    import grape

    model = base
    if mode != "eager":
        model = grape.compile(copy.deepcopy(base), plan_free_attention=mode == "grape_plan_free",
                              cache_dir=cache_dir or False)
    counters = (harness.GrapeCounters(model, ("calls", "replays", *harness.UNSTEADY_COUNTERS))
                if mode != "eager" else None)
    per_call = new_tokens if kind != "encoder" else len(ENCODER_LENGTHS)
    result = generation.measure(lambda: call(model, kind, args, new_tokens), per_call, reps,
                                steady_calls, mode, counters)
    result["numerics_may_differ"] = mode == "grape_plan_free"
    if counters:
        later = counters.changes[2:]
        forwards = sum(c["calls"] for c in later)
        result["replayed_share_from_call3"] = (sum(c["replays"] for c in later) / forwards
                                               if forwards else None)
        result["captures_per_call"] = [c["captures"] for c in counters.changes]
        result.update(harness.grape_stats(model, ("graphs", "captures", "replays", "calls",
                                                  "fallbacks")))
    if cache_dir:
        grape.save_graph_cache(model)  # now, so that its figures are in this run's JSON
        result.update(harness.grape_stats(model, ("graph_cache",)),
                      tokens=result.pop("outputs").tolist())
    return result


def fresh_process_mode(name: str, mode: str, device: str, new_tokens: int, reps: int) -> dict:
    """A mode of FRESH for case `name`, in fresh processes of this script: eager_cold, eager
    alone in one; a cached mode, the mode without its suffix alone, in one that fills a graph
    cache directory, then in a second one, measured. The measured process's figures; a cached
    mode's with the filling process's graph_cache as filling_graph_cache and its tokens as
    outputs."""
    cached = mode in CACHED
    uncached = mode.removesuffix("_cached") if cached else "eager"
    with tempfile.TemporaryDirectory() as folder:
        runs = {}
        for kind in ("filling", "measured") if cached else ("measured",):
            cache = ["--cache-dir", os.path.join(folder, "cache")] if cached else []
            args = ["--cases", name, "--modes", uncached, *cache, "--device", device,
                    "--new-tokens", str(new_tokens), "--reps", str(reps)]
            cases = harness.fresh_process_cases("benchmarks.hf_zoo", args, Path(folder, kind),
                                                quiet=True)
            runs[kind] = cases[0]["modes"][uncached]
    result = runs["measured"]
    if "error" in result:
        raise RuntimeError(result["error"])
    for key in ("correct", "first_call_ratio_to_eager", "speedup_vs_eager"):
        result.pop(key, None)  # that process's own comparisons: this one's are made here
    if cached:
        result["filling_graph_cache"] = runs["filling"].get("graph_cache")
        result["outputs"] = torch.tensor(result.pop("tokens"))
    return result


def run_case(name: str, modes: list[str], device: str, new_tokens: int, reps: int,
             cache_dir: str | None = None) -> dict:
    kind, model_type, sizes = ZOO[name]
    # As the other Hugging Face benchmarks: an unpadded batch's mask is skipped under capture too,
    # as eager skips it (grape's captures do so anyway; a no-op where the release does).
    mask_rules = harness.skip_unpadded_masks_while_capturing()
    config = {"kind": kind, "model_type": model_type, **sizes, "dtype": "bfloat16",
              "device": device, "new_tokens": new_tokens if kind != "encoder" else None,
              "encoder_lengths": list(ENCODER_LENGTHS) if kind == "encoder" else None,
              "unpadded_mask_rules_changed": mask_rules}
    try:
        base = build(name, device)
    except Exception as e:  # an architecture the installed transformers builds otherwise
        error = harness.error_text(e)
        return {"name": name, "config": config,
                "modes": {mode: {"ms_per_step": None, "error": error} for mode in modes}}
    args = inputs(base, kind, device)

    def run(mode: str) -> dict:
        if mode not in FRESH:
            return run_mode(base, kind, args, mode, new_tokens, reps, 2, cache_dir)
        result = fresh_process_mode(name, mode, device, new_tokens, reps)
        if "outputs" in result:
            result["outputs"] = result["outputs"].to(device)
        return result

    if kind == "encoder":  # grape_cached measures generate's first call
        modes = [mode for mode in modes if mode not in CACHED]
    with torch.no_grad():
        results = harness.run_modes(modes, run)
    harness.compare_with_eager(results, ratios={"first_call_s": "first_call_ratio_to_eager"})
    cold = results.get(EAGER_COLD, {}).get("first_call_s")
    for mode in CACHED:
        if cold and results.get(mode, {}).get("first_call_s"):
            results[mode]["first_call_ratio_to_cold_eager"] = results[mode]["first_call_s"] / cold
    return {"name": name, "config": config, "modes": results}


def markdown(cases: list[dict]) -> str:
    return harness.markdown_table(cases, [
        harness.STEP_COLUMN, harness.SPEEDUP_COLUMN,
        harness.value_column("replayed from call 3", "replayed_share_from_call3", "{:.1%}"),
        harness.value_column("first call (s)", "first_call_s", "{:.2f}"),
        harness.value_column("first call / eager's", "first_call_ratio_to_eager", "{:.2f}"),
        harness.CORRECT_COLUMN])


def main(argv=None) -> list[dict]:
    parser = harness.argument_parser(__doc__, MODES, "smoke run: 8 new tokens, 1 rep",
                                     tiny_help="no effect: every config here is small")
    parser.add_argument("--cases", default=",".join(ZOO), help="from: " + ", ".join(ZOO))
    parser.add_argument("--new-tokens", type=int, default=64,
                        help="tokens each generation adds (default %(default)s)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the script itself, with grape running eagerly")
    parser.add_argument("--cache-dir", default=None,
                        help="a grape_cached process's: grape compiles with this graph cache "
                             "directory, and the tokens go in the results")
    args, modes = harness.parse(parser, argv, MODES + list(FRESH), None)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(NEEDS)
    unknown = set(args.cases.split(",")) - set(ZOO)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {list(ZOO)}")
    if args.quick:
        args.new_tokens, args.reps = 8, 1
    import grape

    warnings.simplefilter("ignore", grape.FallbackWarning)  # they are in the JSON
    name = "hf_zoo" + ("-quick" if args.quick else "")
    cases = []
    for case_name in args.cases.split(","):
        print(f"{case_name}:", flush=True)
        cases.append(run_case(case_name, modes, args.device, args.new_tokens, args.reps,
                              args.cache_dir))
        harness.print_table(cases[-1])
        path = harness.write_results(name, cases, args.out, device=args.device)
    harness.write_table_and_plot(path, markdown(cases), lambda png: False)
    return cases


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
