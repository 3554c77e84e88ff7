"""GPT-2 small beam search whose per-step selection is ordinary Python control flow on tensors, as
classic beam scorers write it: candidates visited in order, finished hypotheses kept when they beat
the worst kept one (`continue`), the loop left once every beam is filled (`break`), and an early
stop that freezes the beams. Eager runs it as written (every tensor `if` is a host sync); grape
compiles the same function with the predication rewriter on, so each step is one graph replay with
conditional nodes and no host sync.

    python -m benchmarks.gpt2_beam_search            # 4 beams, 128 new tokens
    python -m benchmarks.gpt2_beam_search --quick    # smoke run

Both modes run in one process on the same weights; the sequences and finished scores must be
identical to eager's (`correct`). `ms_per_step` is the median over --reps generations of the wall
time per step (one new token for every beam), `speedup_vs_eager` eager's over the mode's. The
steady-state grape generations run under torch.cuda.set_sync_debug_mode("error"): any host
synchronization in them raises.
"""

from __future__ import annotations

import sys
import time

import torch

import grape
from benchmarks import harness
from benchmarks.models import gpt2

MODES = ["eager", "grape"]


def make_beam_step(forward, beams: int, eos: int, vocab: int):
    def beam_step(tok, kv, history, beam_scores, finished_scores, finished_count, done):
        logits, kv = forward(tok, kv)
        logp = torch.log_softmax(logits.float(), -1)
        top_scores, top_idx = (beam_scores[:, None] + logp).view(-1).topk(2 * beams)
        top_beam = top_idx // vocab
        top_tok = top_idx % vocab
        slots = torch.arange(beams, device=tok.device)
        next_scores = torch.full((beams,), float("-inf"), device=tok.device)
        next_tok = torch.zeros(beams, dtype=torch.long, device=tok.device)
        next_beam = torch.zeros(beams, dtype=torch.long, device=tok.device)
        filled = torch.zeros((), dtype=torch.long, device=tok.device)
        for j in range(2 * beams):
            if filled >= beams:
                break
            score = top_scores[j]
            if top_tok[j] == eos:
                # A finished hypothesis: kept if it beats the worst one kept so far.
                worst_score = finished_scores.min()
                if score > worst_score:
                    worst = finished_scores.argmin()
                    finished_scores = torch.where(slots == worst, score, finished_scores)
                    finished_count = finished_count + 1
                continue
            here = slots == filled
            next_scores = torch.where(here, score, next_scores)
            next_tok = torch.where(here, top_tok[j], next_tok)
            next_beam = torch.where(here, top_beam[j], next_beam)
            filled = filled + 1
        # Early stop: enough finished hypotheses, and no live beam can still beat them.
        done = done | ((finished_count >= beams) & (next_scores.max() < finished_scores.min()))
        if done:
            next_scores = beam_scores
            next_tok = torch.full((beams,), eos, dtype=torch.long, device=tok.device)
            next_beam = slots
        kv = kv.index_select(2, next_beam)
        history = torch.cat([history.index_select(0, next_beam), next_tok[:, None]], 1)
        return next_tok[:, None], kv, history, next_scores, finished_scores, finished_count, done

    return beam_step


class Case:
    def __init__(self, cfg, beams, steps, device="cuda"):
        self.cfg, self.beams, self.steps = cfg, beams, steps
        weights = gpt2.init_weights(cfg, device)
        forward = gpt2.make_forward(cfg, weights)
        g = torch.Generator(device="cpu").manual_seed(2)
        self.prompt = torch.randint(0, cfg.vocab_size, (1, 1), generator=g).to(device)
        # The first step's second-best token ends hypotheses, so the finished branch is exercised.
        with torch.no_grad():
            logits, _ = forward(self.prompt, gpt2.empty_cache(cfg, 1, device))
        self.eos = int(logits[0].float().topk(2).indices[1])
        self.step = make_beam_step(forward, beams, self.eos, cfg.vocab_size)

    def start(self):
        d = self.prompt.device
        # Every beam starts as the prompt: expand beam 0 only. (No indexed store: from a Python
        # scalar it is a host-to-device copy, which the steady-state check refuses.)
        scores = torch.where(torch.arange(self.beams, device=d) == 0, 0.0, float("-inf"))
        return (self.prompt.expand(self.beams, 1).contiguous(),
                gpt2.empty_cache(self.cfg, self.beams, d), self.prompt.expand(self.beams, 1).contiguous(),
                scores, torch.full((self.beams,), float("-inf"), device=d),
                torch.zeros((), dtype=torch.long, device=d), torch.zeros((), dtype=torch.bool, device=d))

    def generate(self, step):
        state = self.start()
        for _ in range(self.steps):
            state = step(*state)
        _, _, history, scores, finished, count, done = state
        return history, scores, finished, count, done


def run(case: Case, reps: int, modes) -> dict:
    results = {}
    for mode in modes:
        print(f"  {mode} ...", flush=True)
        harness.clear_memory()
        step = case.step if mode == "eager" else grape.compile(case.step)
        with torch.no_grad():
            t0 = time.perf_counter()
            passes = 1 if mode == "eager" else 2  # grape: warm-up, then every shape captured
            for _ in range(passes):
                out = case.generate(step)
            torch.cuda.synchronize()
            setup_s = time.perf_counter() - t0
            extra = {}
            if mode == "grape":
                first = grape.stats(step)
                torch.cuda.set_sync_debug_mode("error")  # steady state: any host sync raises
                try:
                    out = case.generate(step)
                    before = grape.stats(step)
                    times = harness.time_ms(lambda: case.generate(step), reps)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                s = grape.stats(step)
                extra = {"host_syncs_checked": True,
                         "replays_per_generation": (s["replays"] - before["replays"]) // reps,
                         # The first generation after the captures reads the caller's first inputs
                         # from allocation-site buffers: copied, until the copies pay for a chain
                         # variant (docs/design.md, "Capture").
                         "captures_in_first_steady_generation": before["captures"] - first["captures"],
                         "captures_during_timing": s["captures"] - before["captures"],
                         "eager_calls": s["eager_calls"], "fallbacks": harness.portable_fallbacks(s["fallbacks"]),
                         "rewritten": step.rewritten, "graphs": s["graphs"] + s["chain_variants"],
                         "pool_bytes": s["pool_bytes"]}
            else:
                times = harness.time_ms(lambda: case.generate(step), reps)
        results[mode] = {"ms_per_step": harness.median(times) / case.steps,
                         "ms_per_step_runs": [t / case.steps for t in times],
                         "setup_s": setup_s, "outputs": out, **extra}
        step = out = None
    harness.compare_with_eager(results)
    config = {"model": "gpt2-small" if case.cfg.n_layer == 12 else "gpt2-tiny", "dtype": "float16",
              "beams": case.beams, "prompt": 1, "new_tokens": case.steps, "shapes": case.steps,
              "eos": case.eos, "reps": reps}
    return {"name": f"beam{case.beams}", "config": config, "modes": results}


def main(argv=None):
    parser = harness.argument_parser(__doc__, MODES, "smoke run: 16 new tokens, 2 reps")
    parser.add_argument("--beams", type=int, default=4, help="beam width (default %(default)s)")
    parser.add_argument("--steps", type=int, default=128, help="new tokens")
    args, modes = harness.parse(parser, argv, MODES, "gpt2_beam_search needs a CUDA device")
    if args.quick:
        args.steps, args.reps = 16, 2
    cfg = gpt2.GPT2Config.tiny() if args.tiny else gpt2.GPT2Config()
    case = run(Case(cfg, args.beams, args.steps), args.reps, modes)
    harness.print_table(case)
    path = harness.write_results("gpt2_beam_search" + ("-quick" if args.quick else ""), [case], args.out)
    print(f"\nwrote {path}")
    return case


if __name__ == "__main__":
    sys.exit(harness.exit_status([main()]))
