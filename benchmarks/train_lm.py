"""Training loops as people write them, eager and grape.compile side by side on the same weights
and data: a learning-rate scheduler changes the float lr before every step, and grape keeps one
graph per shape (Note [Device settings]).

    python -m benchmarks.train_lm                 # both cases, 200 steps a mode
    python -m benchmarks.train_lm --quick         # smoke run: 40 steps, 1 timed pass
    python -m benchmarks.train_lm --tiny          # 2-layer, 64-wide models (fast on any GPU)
    python -m benchmarks.train_lm --tiny --quick --device cpu   # the script itself, on the CPU

Cases (each batch one of 8 lengths: every length is one call signature):
- gpt2-cosine: GPT2LMHeadModel from a config (4 layers, width 512, 8 heads, dropout 0.1 left
  on), batch 8, next-token loss on random token ids; sequence lengths drawn from a seeded
  log-normal distribution (median 48) and rounded up to a multiple of 16 (16..128); bf16 autocast;
  AdamW(lr=6e-4, weight_decay=0.1); LambdaLR: 10% linear warm-up, then cosine decay to 10%;
  clip_grad_norm_(1.0); zero_grad(set_to_none=True) at the start of the step. Attention is
  SDPA restricted to its memory-efficient kernel (math on the CPU): cuDNN's attention, which SDPA
  picks by default on Hopper, sums dQ in its backward with atomic adds, so two runs whose kernels
  are timed differently need not agree in the last bit, and bit-identity would test that kernel
  rather than grape (docs/results.md, "Training loops").
- wav2vec2-onecycle: Wav2Vec2ForCTC with wav2vec2-base's config (hf_wav2vec2's: no
  SpecAugment, LayerDrop or dropout), batch 8 clips of 1 to 4 s padded to one of 8 lengths,
  cuDNN's CTC loss, bf16 autocast, AdamW(lr=1e-4), OneCycleLR(max_lr=1e-4,
  cycle_momentum=False), clip_grad_norm_(1.0). AdamW reads its betas on the host, so momentum
  cycled by OneCycleLR would need a capture per step (grape says so, with the reason).

Modes, each on its own copy of the same initial weights, seeded alike before its first step (so
dropout draws the same masks):
- eager: the loop with AdamW(capturable=True), as grape makes every optimizer a compiled step
  uses;
- eager_device_lr: eager with the update grape runs: capturable AdamW reading the scheduler's lr
  from a float32 device tensor (grape._training's DeviceSettingsSwap, written before each step
  as before each replay), from the second step on (grape's first call is its warm-up, an eager
  call with the float). A float lr rounds differently in torch's capturable update, so this,
  not eager, is the bit-exact reference;
- eager_default: the loop with AdamW's defaults (foreach, the step computed on the host);
- grape: the step compiled whole with grape.compile, AdamW constructed with its defaults.

Timing: the first pass runs --steps steps, each timed with a device sync: `first_call_s` (step 1),
`first_pass_s`, `time_to_steady_s` and `calls_to_steady` (grape: the steps before the first from
which no step warms up, captures or runs eagerly; eager: within 1.25x of its steady step). Then
--reps passes of STEADY_STEPS steps over the first pass's batches, each timed as a block with no
sync between steps: `ms_per_step` is the median pass over STEADY_STEPS (the steady state).
The scheduler's schedule spans every step of the mode. `recaptures` (grape) counts captures
that replaced a graph because its state changed (a setting baked in that changed).
Losses: the first pass's, one per step. `losses_bit_identical` compares with eager_device_lr,
`max_loss_rel_diff_eager` with eager (the same optimizer, a float lr),
`max_loss_rel_diff_default_optimizer` with eager_default (eager's own figure says how far
PyTorch's two AdamW paths drift apart); `lr_float_equal_to_eager`: after every step the param
group's lr is a float equal to eager's. Memory: `gpu_mem_bytes` is PyTorch's peak allocated bytes over the mode, plus grape's
arena and executables (outside PyTorch's allocator statistics).
"""

from __future__ import annotations

import copy
import math
import time
import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks import harness
from benchmarks import hf_wav2vec2 as w2v

MODES = ["eager", "eager_device_lr", "eager_default", "grape"]
CASES = ["gpt2-cosine", "wav2vec2-onecycle"]
NEEDS = ("train_lm needs a CUDA device (--device cpu --tiny checks the script itself, with grape "
         "running eagerly)")
BATCH = 8
BUCKETS = 8
GPT2_QUANTUM = 16        # tokens: gpt2-cosine's lengths are multiples of this
STEADY_STEPS = 40        # steps of a timed steady pass
CLIP_NORM = 1.0
SEED = 0
TARGET_SPEEDUP = {"gpt2-cosine": 4.0, "wav2vec2-onecycle": 3.0}
LOSS_RTOL_DEFAULT_OPTIMIZER = 1e-3
# SDPA kernels gpt2-cosine may use: reproducible to the bit (see the case's description).
GPT2_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
GRAPE_STATS = ("graphs", "captures", "recaptures", "last_recapture_reason", "replays",
               "warmup_calls", "eager_calls", "capture_seconds", "fallbacks", "arena_bytes",
               "executable_bytes")


# ----------------------------------------------------------------------------------------- cases

def gpt2_case(tiny: bool, steps: int, device: str, seed: int = 1,
              lengths: list[int] | None = None) -> dict:
    """The model (CPU, fp32, seeded), the batches, and how to make the loss of one. The batches'
    lengths: drawn by `seed` from `lengths` alike, or where None, log-normal around 48 tokens,
    rounded up to one of BUCKETS multiples of 16."""
    import transformers

    transformers.logging.set_verbosity_error()
    size = dict(n_layer=2, n_embd=64, n_head=2) if tiny else dict(n_layer=4, n_embd=512, n_head=8)
    positions = max(lengths) if lengths else BUCKETS * GPT2_QUANTUM
    config = transformers.GPT2Config(n_positions=positions, attn_implementation="sdpa", **size)
    torch.manual_seed(SEED)
    model = transformers.GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(seed)
    if lengths:
        drawn = [lengths[int(i)] for i in torch.randint(0, len(lengths), (steps,), generator=g)]
    else:
        quantum = GPT2_QUANTUM
        drawn = [min(BUCKETS, max(1, math.ceil(n / quantum))) * quantum
                 for n in torch.empty(steps).log_normal_(math.log(48), 0.6, generator=g).tolist()]
    batches = []
    for length in drawn:
        ids = torch.randint(0, config.vocab_size, (BATCH, length), generator=g).to(device)
        batches.append((ids,))

    def loss_of(m, ids):
        with sdpa_kernel(GPT2_ATTENTION):
            return m(input_ids=ids, labels=ids).loss

    return {"model": model, "batches": batches, "loss_of": loss_of, "lr": 6e-4,
            "weight_decay": 0.1, "config": {"model": "gpt2-tiny" if tiny else "gpt2-4x512",
                                            "layers": config.n_layer, "width": config.n_embd,
                                            "dropout": config.resid_pdrop,
                                            "attention": "sdpa: efficient, else math"}}


def wav2vec2_case(tiny: bool, steps: int, device: str, seed: int = 1,
                  buckets: int = BUCKETS) -> dict:
    """The model, and `steps` batches of clips padded to one of `buckets` widths (drawn by
    `seed`)."""
    base = w2v.build_model(tiny)
    g = torch.Generator().manual_seed(seed)
    lo, hi = w2v.MIN_SECONDS * w2v.SAMPLE_RATE, w2v.MAX_SECONDS * w2v.SAMPLE_RATE
    widths = [int(lo + (hi - lo) * i / (buckets - 1)) // 320 * 320 for i in range(buckets)]
    ctc, _ = w2v.choose_ctc("cudnn" if device == "cuda" else "native", device)
    batches = []
    for _ in range(steps):
        width = widths[int(torch.randint(0, buckets, (1,), generator=g))]
        x = torch.randn(BATCH, width, generator=g)
        t = w2v.frames(base.config, width)
        y = torch.randint(1, w2v.VOCAB, (BATCH, max(1, t // w2v.LABELS_PER_FRAME)), generator=g)
        batches.append((x.to(device), y.to(device)))

    def loss_of(m, x, y):
        log_probs = m(x).logits.float().log_softmax(-1).transpose(0, 1)
        return w2v.ctc_loss(log_probs, y, ctc)

    return {"model": base, "batches": batches, "loss_of": loss_of, "lr": 1e-4,
            "weight_decay": 0.01, "config": {"model": "wav2vec2-tiny" if tiny else "wav2vec2-base",
                                             "layers": base.config.num_hidden_layers,
                                             "ctc": ctc, "padded_samples": widths}}


BUILD = {"gpt2-cosine": gpt2_case, "wav2vec2-onecycle": wav2vec2_case}


def scheduler(case_name: str, opt: torch.optim.Optimizer, total: int):
    if case_name == "gpt2-cosine":
        warmup = max(1, total // 10)

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        return torch.optim.lr_scheduler.LambdaLR(opt, factor)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=opt.defaults["lr"], total_steps=total,
                                               cycle_momentum=False)


def make_train_step(model, opt, loss_of, device_type: str):
    """The user's step: zero_grad, forward under bf16 autocast, backward, clipping, the update."""

    def train_step(*batch):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            loss = loss_of(model, *batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        opt.step()
        return loss.detach()

    return train_step


def with_device_lr(step, opt, float_calls: int = 1):
    """`step`, run eagerly with the device-readable settings of `opt` in device memory, written
    from the param groups' floats first, as grape's replays read them (Note [Device settings]);
    its first `float_calls` calls with the floats, as grape's warm-ups."""
    from grape import _training

    settings, calls = _training.DeviceSettings(), []

    def run(*batch):
        calls.append(None)
        with settings.swap([opt] if len(calls) > float_calls else []) as swap:
            swap.write()
            return step(*batch)

    return run


# ------------------------------------------------------------------------------------------ modes

def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_mode(case_name: str, case: dict, mode: str, reps: int, device: str) -> dict:
    import grape

    model = copy.deepcopy(case["model"]).to(device).train()
    capturable = mode in ("eager", "eager_device_lr") and device == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=case["lr"], weight_decay=case["weight_decay"],
                            capturable=capturable)
    batches = case["batches"]
    sched = scheduler(case_name, opt, len(batches) + reps * STEADY_STEPS)
    step = make_train_step(model, opt, case["loss_of"], device)
    if mode == "grape":
        step = grape.compile(step)
    elif mode == "eager_device_lr":
        step = with_device_lr(step, opt)
    counters = harness.GrapeCounters(step) if mode == "grape" else None
    if device == "cuda":
        harness.clear_memory()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(SEED)

    seconds, losses, lrs, changes = [], [], [], []
    for batch in batches:
        start = time.perf_counter()
        losses.append(step(*batch))
        sync(device)
        seconds.append(time.perf_counter() - start)
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
        if counters is not None:
            changes.append(counters.change())
    passes = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        for batch in batches[:STEADY_STEPS]:
            step(*batch)
            sched.step()
        sync(device)
        passes.append((time.perf_counter() - start) * 1e3 / min(STEADY_STEPS, len(batches)))

    r = {"ms_per_step": harness.median(passes), "steady_passes_ms_per_step": passes,
         "first_call_s": seconds[0], "first_pass_s": sum(seconds),
         "step_ms": [s * 1e3 for s in seconds]}
    steady = r["ms_per_step"] / 1e3
    at = (harness.steady_by_counters(changes) if counters is not None
          else harness.steady_by_time(seconds, steady))
    r.update(harness.time_to_steady(seconds, at))
    r["lr_is_float"] = all(type(lr) is float for lr in lrs)
    r["lrs"] = lrs
    r["losses"] = torch.stack(losses).float().tolist()
    if device == "cuda":
        r["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    if mode == "grape":
        r.update(harness.grape_stats(step, GRAPE_STATS))
    if "peak_allocated_bytes" in r:
        r["gpu_mem_bytes"] = (r["peak_allocated_bytes"] + r.get("arena_bytes", 0)
                              + r.get("executable_bytes", 0))
    return r


def max_rel_diff(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))


def compare(case_name: str, results: dict) -> None:
    """Each mode's losses and lrs against eager's and eager_default's, and its speed-up; `correct`
    where it has a reference to compare with."""
    eager, default = results.get("eager"), results.get("eager_default")
    same_update = results.get("eager_device_lr")
    for mode, r in results.items():
        if r.get("error"):
            continue
        if same_update and not same_update.get("error") and mode == "grape":
            r["losses_bit_identical"] = r["losses"] == same_update["losses"]
        if eager and not eager.get("error") and mode != "eager":
            r["max_loss_rel_diff_eager"] = max_rel_diff(r["losses"], eager["losses"])
            r["lr_float_equal_to_eager"] = r["lr_is_float"] and r["lrs"] == eager["lrs"]
            if eager.get("ms_per_step") and r.get("ms_per_step"):
                r["speedup_vs_eager"] = eager["ms_per_step"] / r["ms_per_step"]
            if eager.get("gpu_mem_bytes") and r.get("gpu_mem_bytes"):
                r["mem_ratio_to_eager"] = r["gpu_mem_bytes"] / eager["gpu_mem_bytes"]
        if default and not default.get("error") and mode != "eager_default":
            r["max_loss_rel_diff_default_optimizer"] = max_rel_diff(r["losses"], default["losses"])
        if mode == "grape" and "losses_bit_identical" in r:
            r["correct"] = r["losses_bit_identical"] and r.get("lr_float_equal_to_eager", False)
            r["meets_target_speedup"] = (r.get("speedup_vs_eager") or 0) >= TARGET_SPEEDUP[case_name]
            r["within_default_optimizer_tolerance"] = (
                r.get("max_loss_rel_diff_default_optimizer", 0.0) <= LOSS_RTOL_DEFAULT_OPTIMIZER)
        elif mode == "eager":
            r["correct"] = "reference"


# The columns of a training loop's table up to its correctness (train_ddp's too).
STEP_COLUMNS = (harness.STEP_COLUMN, harness.SPEEDUP_COLUMN,
                harness.value_column("first step s", "first_call_s", "{:.2f}"),
                harness.value_column("to steady s", "time_to_steady_s", "{:.2f}"),
                harness.value_column("steps to steady", "calls_to_steady", "{}"),
                harness.value_column("recaptures", "recaptures", "{}"))


def markdown(cases: list[dict]) -> str:
    columns = [*STEP_COLUMNS,
               harness.value_column("losses = eager", "losses_bit_identical", "{}"),
               harness.value_column("max rel. diff vs default", "max_loss_rel_diff_default_optimizer",
                                    "{:.1e}"),
               harness.value_column("lr = eager's float", "lr_float_equal_to_eager", "{}"),
               *harness.MEMORY_COLUMNS]
    return harness.markdown_table(cases, columns)


def plot(cases: list[dict], path) -> bool:
    """ms per step, and the first pass's cumulative time against steps, per case and mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4), squeeze=False)
    for ax, case in zip(axes[0], cases):
        for mode, r in case["modes"].items():
            if r.get("step_ms"):
                total, cumulative = 0.0, []
                for ms in r["step_ms"]:
                    total += ms / 1e3
                    cumulative.append(total)
                ax.plot(range(1, len(cumulative) + 1), cumulative, label=mode)
        ax.set_title(case["name"])
        ax.set_xlabel("step")
        ax.set_ylabel("cumulative s (first pass)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return True


def loop_parser(doc: str, modes: list[str], cases: list[str]):
    """The options of a training-loop benchmark (train_ddp's too)."""
    parser = harness.argument_parser(doc, modes, "40 steps, 1 timed pass", "2-layer, 64-wide models")
    parser.add_argument("--cases", default=",".join(cases), help="from: " + ", ".join(cases))
    parser.add_argument("--steps", type=int, default=200,
                        help="steps of the first pass (default %(default)s)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the script itself on tiny models, grape running eagerly")
    return parser


def check_device(parser, args, needs: str) -> None:
    """Refuses loop_parser's --device where it cannot run: cuda without one (`needs` says so),
    the full models on the CPU (tens of minutes)."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(needs)
    if args.device == "cpu" and not args.tiny:
        parser.error("--device cpu runs the tiny models only (the full ones take tens of minutes on a "
                     "CPU): add --tiny")


def main(argv=None) -> list[dict]:
    parser = loop_parser(__doc__, MODES, CASES)
    args, modes = harness.parse(parser, argv, MODES, None)
    check_device(parser, args, NEEDS)
    if args.quick:
        args.steps, args.reps = 40, 1
    import grape

    warnings.simplefilter("ignore", grape.FallbackWarning)  # they are in the JSON
    mask_rules = harness.skip_unpadded_masks_while_capturing()
    cases = []
    for name in args.cases.split(","):
        if name not in BUILD:
            parser.error(f"unknown case {name}; choose from {CASES}")
        case = BUILD[name](args.tiny, args.steps, args.device)
        print(f"{name}: {args.steps} steps, batch {BATCH}, modes {', '.join(modes)}", flush=True)
        results = harness.run_modes(modes, lambda mode: run_mode(name, case, mode, args.reps,
                                                                 args.device))
        compare(name, results)
        config = {**case["config"], "steps": args.steps, "batch": BATCH, "buckets": BUCKETS,
                  "steady_steps": STEADY_STEPS, "reps": args.reps, "device": args.device,
                  "unpadded_mask_rules_changed": mask_rules,
                  "distinct_shapes": len({tuple(t.shape for t in b) for b in case["batches"]})}
        cases.append({"name": name, "config": config, "modes": results})
        harness.print_table(cases[-1])
    label = "train_lm" + ("-tiny" if args.tiny else "") + ("-quick" if args.quick else "")
    path = harness.write_results(label, cases, args.out, device=args.device)
    harness.write_table_and_plot(path, markdown(cases), lambda png: plot(cases, png))
    return cases


if __name__ == "__main__":
    cases = main()
    raise SystemExit(harness.exit_status(cases))
