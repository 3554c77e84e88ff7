"""GPT-2 written as plain functions over a dict of weights, for decode-step benchmarks.

The decode step takes the last token and a KV cache that holds every earlier position and returns
the next token (greedy) and the cache grown by one position: a new shape every step, which is
what makes CUDA graphs hard to use. Weights are random (no downloads); the numbers that matter,
time and memory, do not depend on them, and every mode is checked against eager on the same weights.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12

    @staticmethod
    def tiny() -> "GPT2Config":
        return GPT2Config(vocab_size=512, n_positions=256, n_embd=64, n_layer=2, n_head=4)


def init_weights(cfg: GPT2Config, device, dtype=torch.float16, seed: int = 0) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def normal(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(device=device, dtype=dtype)

    d = cfg.n_embd
    w = {"wte": normal(cfg.vocab_size, d), "wpe": normal(cfg.n_positions, d, std=0.01),
         "ln_f.w": torch.ones(d, device=device, dtype=dtype), "ln_f.b": torch.zeros(d, device=device, dtype=dtype)}
    for i in range(cfg.n_layer):
        p = f"h{i}."
        w[p + "ln1.w"] = torch.ones(d, device=device, dtype=dtype)
        w[p + "ln1.b"] = torch.zeros(d, device=device, dtype=dtype)
        w[p + "attn.w"] = normal(3 * d, d)
        w[p + "attn.b"] = torch.zeros(3 * d, device=device, dtype=dtype)
        w[p + "proj.w"] = normal(d, d, std=0.02 / math.sqrt(2 * cfg.n_layer))
        w[p + "proj.b"] = torch.zeros(d, device=device, dtype=dtype)
        w[p + "ln2.w"] = torch.ones(d, device=device, dtype=dtype)
        w[p + "ln2.b"] = torch.zeros(d, device=device, dtype=dtype)
        w[p + "fc.w"] = normal(4 * d, d)
        w[p + "fc.b"] = torch.zeros(4 * d, device=device, dtype=dtype)
        w[p + "fc2.w"] = normal(d, 4 * d, std=0.02 / math.sqrt(2 * cfg.n_layer))
        w[p + "fc2.b"] = torch.zeros(d, device=device, dtype=dtype)
    return w


def empty_cache(cfg: GPT2Config, batch: int, device, dtype=torch.float16) -> torch.Tensor:
    """A KV cache holding no positions: [2 (k, v), layers, batch, heads, 0, head_dim]."""
    return torch.empty(2, cfg.n_layer, batch, cfg.n_head, 0, cfg.n_embd // cfg.n_head, device=device, dtype=dtype)


def make_decode_step(cfg: GPT2Config, w: dict):
    """step(tok [B, 1] int64, kv [2, L, B, H, T, Dh], attention_mask [B, T + 1] or None)
    -> (next_tok [B, 1], kv with T + 1 positions): greedy."""
    forward = make_forward(cfg, w)

    def step(tok: torch.Tensor, kv: torch.Tensor, attention_mask: torch.Tensor | None = None):
        logits, new_kv = forward(tok, kv, attention_mask)
        return logits.argmax(-1, keepdim=True), new_kv

    return step


def make_forward(cfg: GPT2Config, w: dict):
    """forward(tok [B, 1] int64, kv [2, L, B, H, T, Dh], attention_mask [B, T + 1] or None)
    -> (logits [B, vocab] of the next token, kv with T + 1 positions)."""

    def forward(tok: torch.Tensor, kv: torch.Tensor, attention_mask: torch.Tensor | None = None):
        # Masked positions are left out of attention, as in Hugging Face's GPT-2.
        mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        t = kv.shape[-2]
        new_kv = torch.empty(*kv.shape[:-2], t + 1, kv.shape[-1], device=kv.device, dtype=kv.dtype)
        new_kv[..., :t, :] = kv

        def attend(i, q, k, v):
            new_kv[0, i, :, :, t] = k
            new_kv[1, i, :, :, t] = v
            return F.scaled_dot_product_attention(q, new_kv[0, i], new_kv[1, i], attn_mask=mask)

        return _transformer(cfg, w, F.embedding(tok, w["wte"]) + w["wpe"][t], attend), new_kv

    return forward


def make_static_forward(cfg: GPT2Config, w: dict):
    """forward(tok [B, 1] int64, kv [2, L, B, H, T_max, Dh], pos [] int64) -> logits [B, vocab]:
    a static KV cache, written in place at position `pos`; one shape for every step, so a whole
    generation fits one graph (grape.while_loop)."""

    def forward(tok: torch.Tensor, kv: torch.Tensor, pos: torch.Tensor):
        at = pos.view(1)
        visible = (torch.arange(kv.shape[-2], device=kv.device) <= pos)[None, None, None, :]

        def attend(i, q, k, v):
            kv[0, i].index_copy_(2, at, k[:, :, None, :])
            kv[1, i].index_copy_(2, at, v[:, :, None, :])
            return F.scaled_dot_product_attention(q, kv[0, i], kv[1, i], attn_mask=visible)

        x = F.embedding(tok, w["wte"]) + w["wpe"].index_select(0, at)
        return _transformer(cfg, w, x, attend)

    return forward


def _transformer(cfg: GPT2Config, w: dict, x: torch.Tensor, attend) -> torch.Tensor:
    """The blocks and the head for one new position x [B, 1, d]; attend(layer, q [B, H, 1, Dh],
    k [B, H, Dh], v [B, H, Dh]) stores k and v and attends over the cache."""
    d, nh = cfg.n_embd, cfg.n_head
    dh = d // nh
    batch = x.shape[0]
    for i in range(cfg.n_layer):
        p = f"h{i}."
        h = F.layer_norm(x, (d,), w[p + "ln1.w"], w[p + "ln1.b"])
        q, k, v = F.linear(h, w[p + "attn.w"], w[p + "attn.b"]).split(d, dim=-1)
        q = q.view(batch, 1, nh, dh).transpose(1, 2)
        a = attend(i, q, k.view(batch, nh, dh), v.view(batch, nh, dh))
        a = a.transpose(1, 2).reshape(batch, 1, d)
        x = x + F.linear(a, w[p + "proj.w"], w[p + "proj.b"])
        h = F.layer_norm(x, (d,), w[p + "ln2.w"], w[p + "ln2.b"])
        h = F.gelu(F.linear(h, w[p + "fc.w"], w[p + "fc.b"]), approximate="tanh")
        x = x + F.linear(h, w[p + "fc2.w"], w[p + "fc2.b"])
    x = F.layer_norm(x, (d,), w["ln_f.w"], w["ln_f.b"])
    return F.linear(x[:, -1], w["wte"])


def generate(step, tok: torch.Tensor, kv: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding with `step`; returns the generated tokens [B, steps]."""
    tokens = torch.empty(tok.shape[0], steps, dtype=torch.long, device=tok.device)
    for i in range(steps):
        tok, kv = step(tok, kv)
        tokens[:, i : i + 1].copy_(tok)
    return tokens


def generate_with_cat(step, prompt: torch.Tensor, kv: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding the way Hugging Face's generate loop feeds a model: every step gets the whole
    input_ids and attention_mask, each grown by torch.cat outside the step;
    step(input_ids, attention_mask, kv) -> (next_tok, kv). Returns the generated tokens [B, steps]."""
    input_ids = prompt.clone()
    attention_mask = torch.ones_like(input_ids)
    for _ in range(steps):
        tok, kv = step(input_ids, attention_mask, kv)
        input_ids = torch.cat([input_ids, tok], dim=1)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(tok.shape)], dim=1)
    return input_ids[:, prompt.shape[1]:]
