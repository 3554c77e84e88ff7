"""Hugging Face wav2vec2-base (Wav2Vec2ForCTC, vocab 32, random weights), batch 8, on audio of
hundreds of distinct lengths: inference (fp16 weights) and a whole CTC training step (autocast
fp16, GradScaler, fused AdamW), eager and grape.compile side by side on the same weights and data.

    python -m benchmarks.hf_wav2vec2            # infer and train, 200 batches, 4 epochs a mode
    python -m benchmarks.hf_wav2vec2 --quick    # smoke run: 12 batches, 3 epochs
    python -m benchmarks.hf_wav2vec2 --tiny     # a 2-layer, 64-wide Wav2Vec2 (fast on any GPU)
    python -m benchmarks.hf_wav2vec2 --modes eager,grape,grape_topology,grape_min_memory

Two grape modes run only when named. `grape_topology` is grape with share_executables="topology":
only shapes of one graph topology share executables, while grape's default also joins shapes whose
graphs differ by a few nodes (cuDNN's per-length algorithms) into unions. `grape_min_memory` is
grape with executable_cache=0: one executable per group, patched to a shape before its replay.

Data: one dataset of --batches batches of 8 clips (seeded), built once and kept on the device.
Clip lengths are drawn uniformly from 1 to 4 s at 16 kHz and quantized to --quantum samples
(default 160 = 10 ms, half an encoder frame: wav2vec2's conv stack has a 320-sample stride);
clips are grouped by length into batches (sorted, then the batch order shuffled: the bucketing
of ASR data loaders) and each batch is zero-padded to its longest clip, with no attention mask
(wav2vec2-base takes zero-padded input without one). Every distinct padded length is one call
signature: the default run has ~190 of them over 200 batches (`distinct_shapes` in the config),
--quick about 12. Labels: every sample uses the whole padded length, T = the encoder's frame
count, and T // 4 label ids in 1..31 (0 is the CTC blank), so lengths are functions of the shape.

Timing: every mode runs the same epochs (passes over every batch, in the same order). grape warms
up on its first call and captures every other shape at its first call, so epoch 1 holds the
captures of every shape; but with cudnn.benchmark (on by default here) a new shape's autotuning
fails its first capture, and after two such failures grape warms up each new shape first, as
grape_warmup_each does from the start: then epoch 1 is warm-ups and epoch 2 captures. Reported: `first_epoch_s` and `second_epoch_s` (wall
time; the cost of reaching the steady state is in these two, `first_two_epochs_s`), then --reps
more epochs, each timed: `ms_per_step` = median epoch time / batches, the steady state (every
shape captured, as in later epochs of a training run); `speedup_vs_eager` is eager's over the
mode's, `time_to_steady_s` the epochs before the first from which every epoch runs steady
(grape: no warm-up, capture or eager call; other modes: within 1.25x of the steady epoch;
`epochs_to_steady` that epoch's number), and `first_epoch_ratio_to_eager`, `second_epoch_ratio_to_eager` and
`first_two_epochs_ratio_to_eager` the mode's epochs over eager's. For grape, `epoch_counters`
gives the warm-ups, captures and replays of each of the first two epochs and `steady_counters`
those of the timed epochs (`steady_state`: every call there a replay).
`ptgraph` (inference only) is the plain CUDA-graph baseline: one torch.cuda.CUDAGraph per shape,
warmed up and captured at the shape's first call, all in one memory pool, the batch copied into
the graph's static input; its steady state is what replaying graphs can give, the bound of any
graph runtime here. Each mode gets its own deep copy of the same initial model (and a fresh
optimizer and GradScaler), so the training trajectories are comparable.

Model config, for capturability and determinism: mask_time_prob=0.0 (SpecAugment draws its masks
with numpy on the host, which a graph would freeze), layerdrop=0.0 (it branches on a random host
value), every dropout 0 (hidden, activation, attention, feat_proj, final) so that eager and grape
losses can be compared step by step; feat_extract_norm="group" (the base default). Batches carry no
attention mask, and transformers releases that build an all-true one under stream capture (5.17)
are made to skip it there as eager calls do (harness.skip_unpadded_masks_while_capturing): otherwise
the graphs would run SDPA's float32 math kernel where eager runs a fused one.

Training step (`make_train_step`, compiled as a whole by grape): forward under autocast fp16
(parameters stay fp32, model.train(), the feature encoder is trained too), CTC loss on the fp32
log-probs, scaler.scale(loss).backward(), scaler.step(opt), scaler.update(), zero_grad.
  - The optimizer is AdamW(lr=1e-4, fused=True) with torch.amp.GradScaler("cuda"): fused AdamW
    takes the scale and found-inf tensors on the device, so scaler.step does not sync (the
    non-fused path calls .item()). grape sets capturable=True on the optimizers a compiled
    function steps (its runtime does, during warm-up).
  - CTC lengths are Python ints derived from the shape: every sample uses the padded length.
    Per-sample lengths would make every batch a signature of its own (or need a host sync). HF's
    own `labels=` loss path calls labels.max() on the host (a sync), so it is not used.
  - --ctc cudnn (default): cuDNN's CTC loss with the lengths as int32 device tensors made inside
    the step (torch._cudnn_ctc_loss, the op F.ctc_loss dispatches to when cuDNN applies, with its
    autograd formula), "mean" reduction as F.ctc_loss's. PyTorch's own CUDA kernel
    (F.ctc_loss with int lengths, --ctc native) copies the lengths from pageable host memory
    to the device inside the op (at::tensor(lengths).cuda(), a synchronizing copy), and
    F.ctc_loss with tensor lengths reads them back to the host: both are host synchronizations,
    which cannot be captured (grape runs such a signature eagerly, with the reason in
    `fallbacks`). The cuDNN path is checked against F.ctc_loss at startup; where it is not
    available the benchmark uses native and says why (`ctc_note`).
  - The loss of every step is copied into a preallocated device buffer (a device-side copy,
    no sync, the same for both modes); after the run, grape's losses are compared with eager's:
    the first 50 steps of epoch 1 (`max_rel_loss_diff`, `losses_match`), and every epoch's mean
    loss (`max_rel_epoch_loss_diff`, `epoch_losses_match`: epochs 2 on are grape's captures and
    replays). Tolerance relative 2e-2: the runs use the same kernels, but atomics in some
    backward kernels make fp16 rounding differ, so the trajectories drift apart slowly (and
    GradScaler may skip a step in one run and not in the other near overflow).

Inference: model.half().eval() under torch.no_grad(): logits and argmax ids. After the timed
epochs, each mode runs every batch once more (grape: replays of every shape, so a shape whose
graph computes wrongly shows) and its logits and ids are compared with eager's (`max_abs_logit_diff`, `ids_equal_fraction`; correct: diff <= 1e-2 and
>= 99% equal ids: argmax of near-tied random logits may flip where logits differ in the last bit).

Memory: `gpu_mem_bytes` is the mode's steady-state peak: PyTorch's peak allocated bytes over the
timed epochs (model, optimizer state, gradients and activations of eager; what grape allocates
through PyTorch), minus what was allocated before the mode started, plus, for grape, its graph
arena (`arena_bytes`: grape's pool outside PyTorch's allocator statistics) and the device memory of
its instantiated executables; for ptgraph, its executables (what the driver reports taken by each
capture and first replay, less PyTorch's reservations). `first_epochs_gpu_mem_bytes` is the same
over setup and the first two epochs (grape's eager warm-ups of new shapes run beside its arena).
`held_bytes`: what the mode holds once done as the driver reports it (cudaMemGetInfo), PyTorch's
cached blocks included: no estimate in it (`held_ratio_to_eager`); `resident_bytes`: the same
after PyTorch's cache is released. Acceptance
targets, printed next to the results: grape >= 3x eager (steady) for training and inference;
grape's memory within 1.3x of eager's.

Writes JSON, a markdown table and (where matplotlib exists) a PNG plot to benchmarks/results/.
"""

from __future__ import annotations

import argparse

import copy
import itertools
import math
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import grape
from benchmarks import harness

MODES = ["eager", "grape", "grape_warmup_each", "ptgraph"]
# grape.compile options of each grape mode. grape warms up only the function's first call and
# captures every later new shape at its first call, so epoch 1 holds the captures; with
# cudnn.benchmark on, a new shape's autotuning may make its first capture fail, and that shape
# warms up then (after two such failures, every new shape does). grape_warmup_each warms up each
# new shape once before capturing it (warmup_each_signature=True).
GRAPE_MODES = {"grape": {}, "grape_warmup_each": {"warmup_each_signature": True},
               "grape_topology": {"share_executables": "topology"},
               "grape_min_memory": {"executable_cache": 0}}
# Run only when named: grape_topology (no unions) and grape_min_memory (one executable per group,
# patched to each shape before its replay).
AVAILABLE_MODES = MODES + ["grape_topology", "grape_min_memory"]
CASES = ["infer", "train"]
# A plain CUDA graph of the whole training step would need the optimizer's and GradScaler's
# capturable state handled by hand: ptgraph runs at inference only.
CASE_MODES = {"infer": AVAILABLE_MODES, "train": [m for m in AVAILABLE_MODES if m != "ptgraph"]}
DEVICE = "cuda"

SAMPLE_RATE = 16000
MIN_SECONDS, MAX_SECONDS = 1.0, 4.0
BATCH = 8
VOCAB = 32
LABELS_PER_FRAME = 4           # T // 4 labels per sample
WARMUP = 1                     # grape.compile's warmup: eager calls of a signature before its capture
SETTLE_EPOCHS = WARMUP + 1     # epochs before grape's steady state where shapes come once an epoch
LOSS_STEPS_COMPARED = 50       # epoch 1's first steps whose losses are compared
LOSS_RTOL = 2e-2
INFER_ATOL = 1e-2              # fp16 logits
INFER_IDS_EQUAL = 0.99
TARGET_SPEEDUP = 3.0
TARGET_MEM_RATIO = 1.3

# grape.stats keys recorded for the grape mode (those the running build has).
GRAPE_STATS = ("graphs", "shapes", "signatures", "captures", "capture_seconds", "fallbacks",
               "replays", "calls", "warmup_calls", "eager_calls", "topology_groups",
               "graphs_joined", "graphs_joined_near", "topology_unions", "kernels_swapped_near",
               "union_extra_nodes", "near_join_refusals", "instantiations", "pool_bytes",
               "arena_bytes", "arena_lane_bytes", "arena_lane_peak_bytes", "replanned_captures",
               "replans_diverged", "executable_bytes", "bytes_copied_in", "evacuations", "bytes_evacuated",
               "executable_switches", "patches_ahead", "nodes_patched", "kernels_swapped",
               "patch_seconds", "replay_seconds", "launch_seconds", "resident_executables")


# ----------------------------------------------------------------------------------------- model

def build_config(tiny: bool):
    import transformers

    small = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                 conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
    return transformers.Wav2Vec2Config(
        vocab_size=VOCAB, pad_token_id=0,
        # Capturable and deterministic: no SpecAugment (numpy masks on the host), no LayerDrop
        # (a branch on a random host value), no dropout (losses comparable step by step).
        mask_time_prob=0.0, mask_feature_prob=0.0, layerdrop=0.0,
        hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
        final_dropout=0.0, feat_extract_norm="group",
        **(small if tiny else {}))  # the defaults are wav2vec2-base: 12 layers, hidden 768


def build_model(tiny: bool):
    """Random weights (seeded), fp32, on the CPU: each mode copies it to the device."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return transformers.Wav2Vec2ForCTC(build_config(tiny))


def frames(config, samples: int) -> int:
    """Encoder frames of `samples` audio samples (the conv stack's output length)."""
    for kernel, stride in zip(config.conv_kernel, config.conv_stride):
        samples = (samples - kernel) // stride + 1
    return samples


# ------------------------------------------------------------------------------------------ data

def build_dataset(config, n_batches: int, quantum: int, device, seed: int = 0) -> dict:
    """`n_batches` batches of BATCH clips: (input_values float32 (B, S), labels int64 (B, L)).

    Clip lengths: uniform in [MIN_SECONDS, MAX_SECONDS], multiples of `quantum` samples; sorted
    and cut into batches (length bucketing), batch order shuffled; each batch zero-padded to its
    longest clip. Labels: L = T // LABELS_PER_FRAME ids in 1..vocab-1, T the padded frame count.
    """
    g = torch.Generator().manual_seed(seed)
    lo = math.ceil(MIN_SECONDS * SAMPLE_RATE / quantum)
    hi = math.floor(MAX_SECONDS * SAMPLE_RATE / quantum)
    units = torch.randint(lo, hi + 1, (n_batches * BATCH,), generator=g).sort().values
    units = units.view(n_batches, BATCH)[torch.randperm(n_batches, generator=g)]
    inputs, labels, padded, n_frames = [], [], [], []
    for row in units.tolist():
        lengths = [u * quantum for u in row]
        width = max(lengths)
        x = torch.zeros(BATCH, width)
        for j, n in enumerate(lengths):
            x[j, :n] = torch.randn(n, generator=g)  # normalized audio: zero mean, unit variance
        t = frames(config, width)
        y = torch.randint(1, config.vocab_size, (BATCH, max(1, t // LABELS_PER_FRAME)), generator=g)
        inputs.append(x.to(device))
        labels.append(y.to(device))
        padded.append(width)
        n_frames.append(t)
    return {"inputs": inputs, "labels": labels, "padded": padded, "frames": n_frames}


def dataset_config(data: dict, quantum: int) -> dict:
    return {"batches": len(data["inputs"]), "batch": BATCH, "sample_rate": SAMPLE_RATE,
            "clip_seconds": [MIN_SECONDS, MAX_SECONDS], "quantum_samples": quantum,
            "batching": "length-sorted buckets, batch order shuffled, padded to the longest clip",
            "distinct_shapes": len(set(data["padded"])),
            "padded_samples": [min(data["padded"]), max(data["padded"])],
            "frames": [min(data["frames"]), max(data["frames"])],
            "labels_per_sample": f"frames // {LABELS_PER_FRAME}"}


# ----------------------------------------------------------------------------------------- steps

def ctc_loss(log_probs: torch.Tensor, labels: torch.Tensor, impl: str) -> torch.Tensor:
    """F.ctc_loss(reduction="mean", blank=0) of log_probs (T, N, C) against labels (N, L), every
    sample using all T frames and all L labels (Python ints from the shapes)."""
    T, N = log_probs.shape[:2]
    L = labels.shape[1]
    if impl == "cudnn":
        # cuDNN's CTC with the lengths as device tensors: no host synchronization, so it can be
        # captured. zero_infinity matters only for infeasible targets, which these never are.
        input_lengths = torch.full((N,), T, dtype=torch.int32, device=log_probs.device)
        target_lengths = torch.full((N,), L, dtype=torch.int32, device=log_probs.device)
        costs, _ = torch._cudnn_ctc_loss(log_probs.contiguous(), labels.reshape(-1).to(torch.int32),
                                         input_lengths, target_lengths, 0, True, True)
        return (costs / L).mean()
    # PyTorch's kernel: on CUDA it copies the lengths to the device with a host sync.
    return F.ctc_loss(log_probs, labels, [T] * N, [L] * N, blank=0, zero_infinity=True)


def make_train_step(model, opt, scaler, ctc: str = "cudnn", device_type: str = "cuda",
                    amp_dtype: torch.dtype = torch.float16):
    """The user's training step, closing over one mode's model, optimizer and GradScaler."""

    def train_step(input_values, labels):
        with torch.autocast(device_type, dtype=amp_dtype):
            logits = model(input_values).logits
        log_probs = logits.float().log_softmax(-1).transpose(0, 1)  # (T, N, C)
        loss = ctc_loss(log_probs, labels, ctc)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return train_step


def make_infer_step(model):
    """Inference on one mode's fp16, eval-mode copy: logits and greedy (argmax) ids."""

    def infer_step(input_values):
        with torch.no_grad():
            logits = model(input_values).logits
        return logits, logits.argmax(-1)

    return infer_step


def choose_ctc(requested: str, device) -> tuple[str, str | None]:
    """The CTC implementation to use, and why where it is not the one requested: the cuDNN path
    is run once (forward and backward) and compared with F.ctc_loss."""
    if requested != "cudnn":
        return requested, None
    try:
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(40, 2, VOCAB, generator=g).to(device).requires_grad_()
        labels = torch.randint(1, VOCAB, (2, 10), generator=g).to(device)
        loss = ctc_loss(logits.log_softmax(-1), labels, "cudnn")
        loss.backward()
        reference = ctc_loss(logits.detach().log_softmax(-1), labels, "native")
        if not torch.allclose(loss.detach(), reference, rtol=1e-4, atol=1e-4):
            return "native", f"cuDNN CTC loss {loss.item()} differs from F.ctc_loss {reference.item()}"
        return "cudnn", None
    except Exception as e:  # no cuDNN, or an op this build lacks
        return "native", f"cuDNN CTC unavailable: {type(e).__name__}: {e}"[:300]


# ---------------------------------------------------------------------------------------- timing

COUNTERS = ("warmup_calls", "captures", "replays", "eager_calls")


def measure(mode: str, step, compiled, epoch, n_batches: int, reps: int, desc: str,
            allocated0: int) -> dict:
    """Runs epoch(step, index, desc) SETTLE_EPOCHS times (each timed, wall), then `reps` times
    (each timed with CUDA events: the steady state). PyTorch's peak allocated memory over each
    part; grape's counters over each settling epoch and over the steady part."""
    r = {"epochs_s": []}
    counters = harness.GrapeCounters(compiled, COUNTERS) if compiled is not None else None
    for index in range(SETTLE_EPOCHS):
        _, seconds = harness.timed(lambda: epoch(step, index, f"{desc} epoch {index + 1}"))
        r["epochs_s"].append(seconds)
        note = ""
        if compiled is not None:
            r.setdefault("epoch_counters", []).append(counters.change())
            c = r["epoch_counters"][-1]
            note = f" ({c['warmup_calls']} warm-ups, {c['captures']} captures, {c['replays']} replays)"
        print(f"    {mode}: epoch {index + 1}: {seconds:.1f} s{note}", flush=True)
    r["first_epoch_s"] = r["epochs_s"][0]
    r["second_epoch_s"] = r["epochs_s"][1] if SETTLE_EPOCHS > 1 else None
    r["first_two_epochs_s"] = sum(r["epochs_s"][:2])
    r["first_epochs_peak_allocated_bytes"] = torch.cuda.max_memory_allocated() - allocated0
    torch.cuda.reset_peak_memory_stats()
    count = itertools.count(SETTLE_EPOCHS)

    host_ms = []

    def steady():
        index = next(count)
        t0 = time.perf_counter()
        epoch(step, index, f"{desc} epoch {index + 1}")
        host_ms.append((time.perf_counter() - t0) * 1e3)

    times = harness.time_ms(steady, reps)
    # The host's time to issue an epoch's calls: near ms_per_step, the host is what limits.
    r["host_ms_per_step"] = harness.median(host_ms) / n_batches
    r["peak_allocated_bytes"] = torch.cuda.max_memory_allocated() - allocated0
    if compiled is not None:
        r["steady_counters"] = counters.change()
        # Every call of the timed epochs a replay: no warm-up, capture or eager call.
        r["steady_state"] = all(r["steady_counters"][k] == 0
                                for k in ("warmup_calls", "captures", "eager_calls"))
    r["ms_per_step"] = harness.median(times) / n_batches
    r["ms_per_step_runs"] = [t / n_batches for t in times]
    # The settling epochs before the first from which every epoch is steady (the timed epochs
    # count as one more): grape by its counters, other modes by time.
    seconds = r["epochs_s"] + [harness.median(times) / 1e3]
    steady_at = (harness.steady_by_counters(r["epoch_counters"] + [r["steady_counters"]])
                 if compiled is not None
                 else harness.steady_by_time(seconds, steady=harness.median(times) / 1e3))
    reached = harness.time_to_steady(seconds, steady_at)
    r["time_to_steady_s"] = reached["time_to_steady_s"]
    r["epochs_to_steady"] = reached["calls_to_steady"]
    print(f"    {mode}: steady {r['ms_per_step']:.2f} ms/step, host {r['host_ms_per_step']:.2f} (epochs "
          f"{', '.join(f'{t / 1e3:.1f}' for t in times)} s)", flush=True)
    return r


def finish_memory(r: dict, free0: int) -> None:
    """gpu_mem_bytes (steady) and first_epochs_gpu_mem_bytes: PyTorch's peaks plus, for grape, its
    arena and executables (its stats, already in `r`); held_bytes and resident_bytes: what the
    mode holds at its end as the driver sees it (cudaMemGetInfo), before and after PyTorch's
    cache is released."""
    outside = r.get("arena_bytes", r.get("pool_bytes", 0)) + r.get("executable_bytes", 0)
    r["gpu_mem_bytes"] = r["peak_allocated_bytes"] + outside
    r["first_epochs_gpu_mem_bytes"] = r["first_epochs_peak_allocated_bytes"] + outside
    r["held_bytes"] = free0 - harness.free_bytes()
    torch.cuda.empty_cache()
    r["resident_bytes"] = free0 - harness.free_bytes()


# ----------------------------------------------------------------------------------------- cases

def run_train(mode: str, base, data: dict, reps: int, ctc: str) -> tuple[dict, torch.Tensor]:
    """One mode of the training case; returns its result and every step's loss (epochs x batches)."""
    harness.clear_memory()
    free0 = harness.free_bytes()
    allocated0 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model = copy.deepcopy(base).to(DEVICE).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler(DEVICE)
    step = make_train_step(model, opt, scaler, ctc, DEVICE)
    compiled = compile_step(step, mode)
    n = len(data["inputs"])
    losses = torch.zeros(SETTLE_EPOCHS + reps, n, device=DEVICE)

    def epoch(fn, index, desc):
        row = losses[index]
        for i in harness.progress(range(n), desc):
            # A device-side copy (no sync); the step's output is dropped before the next call.
            row[i].copy_(fn(data["inputs"][i], data["labels"][i]))

    run = compiled if compiled is not None else step
    r = measure(mode, run, compiled, epoch, n, reps, f"train {mode}", allocated0)
    if compiled is not None:
        r.update(harness.grape_stats(compiled, GRAPE_STATS))
    finish_memory(r, free0)
    losses = losses.cpu()
    r["loss_first_steps"] = losses[0, :5].tolist()
    r["epoch_mean_losses"] = losses.mean(1).tolist()
    return r, losses


def compile_step(step, mode: str):
    """The grape function of a grape mode; None for eager."""
    options = GRAPE_MODES.get(mode)
    return None if options is None else grape.compile(step, warmup=WARMUP, **options)


def run_infer(mode: str, base, data: dict, reps: int, ctc: str) -> tuple[dict, tuple]:
    """One mode of the inference case; returns its result and (logits, ids) of every batch."""
    harness.clear_memory()
    free0 = harness.free_bytes()
    allocated0 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model = copy.deepcopy(base).to(DEVICE).half().eval()
    step = make_infer_step(model)
    compiled = compile_step(step, mode)
    plain = None
    if mode == "ptgraph":
        plain = harness.PerShapeGraphs(step, pool=torch.cuda.graph_pool_handle())
    inputs = data["inputs_fp16"]
    n = len(inputs)

    def epoch(fn, index, desc):
        for i in harness.progress(range(n), desc):
            fn(inputs[i])  # outputs dropped at once: nothing held across calls

    with torch.no_grad():
        run = compiled if compiled is not None else plain if plain is not None else step
        r = measure(mode, run, compiled, epoch, n, reps, f"infer {mode}", allocated0)
        logits, ids = [], []
        for x in inputs:  # replays for grape: every shape is captured
            # Copies on the device, read back after the pass: reading each batch back at once
            # would make the pass host-bound, unlike the epochs, and give shapes executables of
            # their own that the steady state does not make (Note [Executable slots]).
            out_logits, out_ids = run(x)
            logits.append(out_logits.to(torch.float32, copy=True))
            ids.append(out_ids.clone())
            del out_logits, out_ids
        logits = [t.cpu() for t in logits]
        ids = [t.cpu() for t in ids]
    if compiled is not None:
        r.update(harness.grape_stats(compiled, GRAPE_STATS))
    if plain is not None:
        r["graphs"] = len(plain.graphs)
        r["executable_bytes"] = plain.executable_bytes
    finish_memory(r, free0)
    return r, (logits, ids)


def check_train(losses: torch.Tensor, reference: torch.Tensor) -> dict:
    """harness.compare_with_eager's check of a training run's losses (epochs x batches) against
    eager's: within LOSS_RTOL over epoch 1's first steps and in every epoch's mean."""
    got, want = losses[0, :LOSS_STEPS_COMPARED], reference[0, :LOSS_STEPS_COMPARED]
    rel = ((got - want).abs() / want.abs().clamp_min(1e-6)).max().item()
    finite = bool(torch.isfinite(got).all() and torch.isfinite(want).all())
    means, reference_means = losses.mean(1), reference.mean(1)
    epoch_rel = ((means - reference_means).abs() / reference_means.abs().clamp_min(1e-6)).tolist()
    r = {"loss_steps_compared": len(got), "max_rel_loss_diff": rel,
         "losses_match": finite and rel <= LOSS_RTOL, "max_rel_epoch_loss_diff": epoch_rel,
         "epoch_losses_match": bool(torch.isfinite(means).all()) and max(epoch_rel) <= LOSS_RTOL,
         "losses_bit_identical": bool(torch.equal(losses, reference))}
    r["correct"] = r["losses_match"] and r["epoch_losses_match"]
    return r


def check_infer(outputs: tuple, reference: tuple) -> dict:
    """harness.compare_with_eager's check of every batch's (logits, ids) against eager's: logits
    within INFER_ATOL, at least INFER_IDS_EQUAL of the ids equal."""
    (logits, ids), (ref_logits, ref_ids) = outputs, reference
    diff = max((a - b).abs().max().item() for a, b in zip(logits, ref_logits))
    equal = sum(int((a == b).sum()) for a, b in zip(ids, ref_ids))
    total = sum(b.numel() for b in ref_ids)
    return {"batches_compared": len(ref_ids), "max_abs_logit_diff": diff,
            "ids_equal_fraction": equal / total,
            "logits_bit_identical": all(torch.equal(a, b) for a, b in zip(logits, ref_logits)),
            "correct": diff <= INFER_ATOL and equal / total >= INFER_IDS_EQUAL}


RUNNERS = {"infer": (run_infer, check_infer), "train": (run_train, check_train)}
# Figures compared with eager's besides time and gpu_mem_bytes: {figure: its ratio's name}.
RATIOS_TO_EAGER = {"first_epoch_s": "first_epoch_ratio_to_eager",
                   "second_epoch_s": "second_epoch_ratio_to_eager",
                   "first_two_epochs_s": "first_two_epochs_ratio_to_eager",
                   "first_epochs_gpu_mem_bytes": "first_epochs_mem_ratio_to_eager",
                   "held_bytes": "held_ratio_to_eager"}


def run_case(name: str, base, data: dict, modes: list[str], reps: int, ctc: str, config: dict) -> dict:
    run, check = RUNNERS[name]

    def run_mode(mode: str) -> dict:
        result, outputs = run(mode, base, data, reps, ctc)
        result["outputs"] = outputs  # what check() compares with eager's
        return result

    results = harness.run_modes([m for m in modes if m in CASE_MODES[name]], run_mode)
    harness.compare_with_eager(results, check, RATIOS_TO_EAGER)
    plain = results.get("ptgraph", {}).get("ms_per_step")
    for mode, r in results.items():
        if mode == "eager" or r.get("speedup_vs_eager") is None:
            continue
        r["meets_targets"] = bool(r["speedup_vs_eager"] >= TARGET_SPEEDUP
                                  and r.get("mem_ratio_to_eager", math.inf) <= TARGET_MEM_RATIO)
        if plain and mode != "ptgraph":
            r["ratio_to_ptgraph"] = r["ms_per_step"] / plain  # 1.0: all that graphs can give
    config = dict(config, grape_warmup=WARMUP, targets={"speedup_vs_eager": TARGET_SPEEDUP,
                                                        "mem_ratio_to_eager": TARGET_MEM_RATIO})
    return {"name": name, "config": config, "modes": results}


def print_targets(case: dict) -> None:
    for mode in GRAPE_MODES:
        g = case["modes"].get(mode, {})
        if g.get("speedup_vs_eager") is not None:
            print_mode_targets(mode, g)


def print_mode_targets(mode: str, g: dict) -> None:
    ratio = [g.get(f"{k}_ratio_to_eager") for k in ("first_epoch", "second_epoch", "first_two_epochs")]
    ratio = [f"{x:.2f}x" if x is not None else "-" for x in ratio]
    print(f"  {mode}: {g['speedup_vs_eager']:.2f}x eager steady (target >= {TARGET_SPEEDUP:.0f}x); "
          f"epoch 1 / epoch 2 / both take {' / '.join(ratio)} eager's time; memory "
          f"{g['mem_ratio_to_eager']:.2f}x eager's (target <= {TARGET_MEM_RATIO}x; first epochs "
          f"{g['first_epochs_mem_ratio_to_eager']:.2f}x; held per the driver "
          f"{g['held_ratio_to_eager']:.2f}x); {g.get('graphs')} graphs, "
          f"{len(g.get('fallbacks') or [])} fallbacks, steady state {g.get('steady_state')}"
          + (f"; {g['ratio_to_ptgraph']:.2f}x plain graphs' time" if g.get("ratio_to_ptgraph")
             else "")
          + ("" if g.get("meets_targets") else "  << below target"))


# ---------------------------------------------------------------------------------------- output

def markdown(cases) -> str:
    def fallbacks(r):
        listed = r.get("fallbacks")
        return str(len(listed)) if listed is not None else "-"

    return harness.markdown_table(cases, [
        harness.STEP_COLUMN, harness.SPEEDUP_COLUMN,
        harness.value_column("epoch 1 (s)", "first_epoch_s", "{:.1f}"),
        harness.value_column("epoch 2 (s)", "second_epoch_s", "{:.1f}"),
        harness.value_column("epochs 1-2 vs eager", "first_two_epochs_ratio_to_eager", "{:.2f}x"),
        *harness.MEMORY_COLUMNS, harness.CORRECT_COLUMN,
        ("graphs", lambda r: str(r.get("graphs", "-"))),
        ("fallbacks", fallbacks)])


def plot(cases, path, title) -> bool:
    return harness.bar_plot(path, cases, AVAILABLE_MODES, [
        ("ms_per_step", "ms per step (steady state)"),
        ("first_two_epochs_s", "epochs 1-2 (s): warm-ups, captures")], title, (10, 4))


def main(argv=None):
    parser = harness.argument_parser(
        __doc__, MODES, "smoke run: 12 batches, 3 epochs (1 timed)",
        tiny_help="a tiny Wav2Vec2 (2 layers, hidden 64) instead of wav2vec2-base")
    parser.set_defaults(reps=2)  # steady-state epochs, timed after the two that warm up and capture
    parser.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction, default=True,
                        help="torch.backends.cudnn.benchmark for every mode (default on: the "
                             "convolutions' algorithms are tuned per shape, in eager calls)")
    parser.add_argument("--cases", default=",".join(CASES), help="from: " + ", ".join(CASES))
    parser.add_argument("--batches", type=int, default=200, help="batches per epoch (default 200)")
    parser.add_argument("--quantum", type=int, default=160,
                        help="clip lengths are multiples of this many samples (default 160)")
    parser.add_argument("--ctc", choices=["cudnn", "native"], default="cudnn",
                        help="CTC loss: cuDNN with device lengths (capturable), or F.ctc_loss "
                             "with int lengths (a host sync on CUDA)")
    args, modes = harness.parse(parser, argv, AVAILABLE_MODES, "hf_wav2vec2 needs a CUDA device")
    if args.quick:
        args.batches, args.reps = 12, 1
    cases = args.cases.split(",")
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {CASES}")
    warnings.simplefilter("ignore", grape.FallbackWarning)  # they are in the JSON
    torch.backends.cudnn.benchmark = args.cudnn_benchmark

    mask_rules = harness.skip_unpadded_masks_while_capturing()
    base = build_model(args.tiny)
    data = build_dataset(base.config, args.batches, args.quantum, DEVICE)
    ctc, ctc_note = choose_ctc(args.ctc, DEVICE)
    if ctc_note:
        print(f"note: {ctc_note}; using F.ctc_loss", flush=True)
    common = {"model": "wav2vec2-tiny" if args.tiny else "wav2vec2-base",
              "layers": base.config.num_hidden_layers, "hidden": base.config.hidden_size,
              "vocab": VOCAB, "attn_implementation": base.config._attn_implementation,
              **dataset_config(data, args.quantum), "epochs": SETTLE_EPOCHS + args.reps,
              "steady_epochs": args.reps, "cudnn_benchmark": args.cudnn_benchmark,
              "unpadded_mask_skipped_while_capturing": "_ignore_bidirectional_mask_sdpa" in mask_rules}
    print(f"{common['model']}: {args.batches} batches of {BATCH}, {common['distinct_shapes']} "
          f"distinct padded lengths ({common['padded_samples'][0]}..{common['padded_samples'][1]} "
          f"samples), {SETTLE_EPOCHS + args.reps} epochs per mode", flush=True)
    name = "hf_wav2vec2" + ("-tiny" if args.tiny else "") + ("-quick" if args.quick else "")
    results = []
    for case_name in cases:
        print(f"{case_name}:", flush=True)
        if case_name == "infer":
            data["inputs_fp16"] = [x.half() for x in data["inputs"]]
            config = dict(common, dtype="float16", grad=False)
        else:
            config = dict(common, dtype="float32 parameters, autocast float16", optimizer=
                          "AdamW(lr=1e-4, fused=True)", grad_scaler=True, ctc=ctc,
                          ctc_note=ctc_note, loss_rtol=LOSS_RTOL)
        results.append(run_case(case_name, base, data, modes, args.reps, ctc, config))
        data.pop("inputs_fp16", None)
        harness.print_table(results[-1])
        print_targets(results[-1])
        path = harness.write_results(name, results, args.out)
    title = f"HF {common['model']} (CTC), batch {BATCH}, {common['distinct_shapes']} shapes"
    harness.write_table_and_plot(path, markdown(results), lambda png: plot(results, png, title))
    return results


if __name__ == "__main__":
    sys.exit(harness.exit_status(main()))
