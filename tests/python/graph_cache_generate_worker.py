"""One process of the generate test of the graph cache (tests/python/test_graph_cache_gpu.py):
Hugging Face GPT-2 of a tiny config (random weights, seeded), compiled with a cache directory,
generates greedily from one prompt; eager generates from the same weights. Prints one JSON line:
whether the tokens are equal, the compiled model's stats, and what saving did.

    python graph_cache_generate_worker.py CACHE_DIR [--new-tokens N] [--alias-prediction]
        [--default-attention]

--default-attention: bfloat16 weights and PyTorch's default attention backends (cuDNN's on
Hopper, which builds a plan, a generated module, per length) instead of plan-free attention.
"""

import argparse
import copy
import json
import sys

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache_dir")
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--alias-prediction", action="store_true",
                        help="the cache read in place (chain prediction), the attention mask "
                             "from the site's buffers (site prediction)")
    parser.add_argument("--default-attention", action="store_true")
    args = parser.parse_args()
    import transformers

    import grape

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512,
                                     n_positions=128, bos_token_id=0, eos_token_id=1,
                                     pad_token_id=1)
    dtype = torch.bfloat16 if args.default_attention else torch.float32
    eager = transformers.GPT2LMHeadModel(config).to("cuda", dtype).eval()
    # Compiled first: the watch of generated kernels' images begins there (Note [Kernel images]).
    model = grape.compile(copy.deepcopy(eager), cache_dir=args.cache_dir,
                          alias_prediction=args.alias_prediction,
                          plan_free_attention=not args.default_attention)
    ids = torch.randint(2, 512, (1, 5), generator=torch.Generator().manual_seed(1)).cuda()
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                  min_new_tokens=args.new_tokens, do_sample=False)
    with torch.no_grad():
        got = [model.generate(ids, **kwargs) for _ in range(2)]
        want = eager.generate(ids, **kwargs)
        equal = [torch.equal(tokens, want) for tokens in got]
    saved = grape.save_graph_cache(model)
    print(json.dumps({"equal": equal, "stats": dict(grape.stats(model)), "saved": saved},
                     default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
