"""Note [Masks of unpadded batches under capture]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
transformers decides whether a forward needs an attention mask with rules such as
``masking_utils._ignore_bidirectional_mask_sdpa(padding_mask, ...)``, which skip the mask of an
unpadded batch. Up to at least 5.17 they ask ``is_tracing(padding_mask)`` first, and a CUDA stream
capture counts as tracing, so a captured forward builds a dense mask where eager builds none, and
SDPA runs another kernel: other rounding than eager's (BERT's hidden states differ in the last
bit), and for a bidirectional mask the float32 math kernel. Later releases skip the mask whenever
there is no padding mask, since nothing is read then.

While a thread is inside ``eager_mask_rules()`` (grape enters it around every capture), the
installed release's rules get that later behaviour on that thread: a rule called with no padding
mask and no tensor argument decides as in an eager call. A call that carries a tensor (a padding
mask whose values would be read, which a capture cannot) keeps the installed rule's answer, and so
does every call outside the context, on other threads, or while torch.compile traces. The rules
are wrapped once per process, and only where the installed release needs it (checked by asking
the rule itself); nothing is wrapped where transformers is not imported.

So a capture of a call with a padding mask (Hugging Face's ``generate`` always passes one) still
builds the mask that eager skips once it has read the mask's values. With PyTorch's default
backends both run cuDNN's attention, and the zoo's tokens equal eager's. With
``plan_free_attention`` the masked call takes memory-efficient attention where eager takes
flash's, and TinyLlama's greedy tokens part from eager's on the same backends (docs/results.md).
Skipping the mask would need the values as a guard of the graph.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable, Iterator

import torch

__all__ = ["eager_mask_rules", "rules_changed"]

# Each rule, with the arguments of an unpadded batch of 16 tokens and no cache (no tensor among
# them): padding mask, then kv length; padding mask, q length, kv length, q offset, kv offset.
RULES = (("_ignore_bidirectional_mask_sdpa", (None, 16)),
         ("_ignore_causal_mask_sdpa", (None, 16, 16, 0, 0)))

_here = threading.local()  # .depth: eager_mask_rules entered; .tracing: None, or forced True/False
_lock = threading.Lock()
_changed: set[str] = set()  # the rules wrapped, in every module installed
_MARK = "_grape_eager_mask_rules"  # set on a module once installed: the rules wrapped in it


@contextlib.contextmanager
def eager_mask_rules() -> Iterator[None]:
    """While entered on this thread, transformers' mask rules skip an unpadded batch's mask under a
    stream capture as they do in eager calls (Note [Masks of unpadded batches under capture])."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is not None:
        install(masking)
    _here.depth = getattr(_here, "depth", 0) + 1
    try:
        yield
    finally:
        _here.depth -= 1


def rules_changed() -> list[str]:
    """The names of the rules wrapped so far (for benchmarks' records)."""
    return sorted(_changed)


def install(masking) -> list[str]:
    """Wraps `masking`'s rules that build an unpadded batch's mask while tracing (once per module);
    returns their names."""
    with _lock:
        if hasattr(masking, _MARK):
            return getattr(masking, _MARK)
        changed: list[str] = []
        setattr(masking, _MARK, changed)
        tracing = getattr(masking, "is_tracing", None)
        if tracing is None:
            return changed
        masking.is_tracing = _answering_when_forced(tracing)
        for name, unpadded in RULES:
            rule = getattr(masking, name, None)
            if rule is None:
                continue
            try:
                if _forcing_tracing(True, rule, *unpadded):
                    continue  # the installed release skips it already
            except Exception:  # another signature than these releases': left as it is
                continue  # (a capture must never fail for a helper's probe)
            setattr(masking, name, _as_in_eager_calls(rule))
            changed.append(name)
        if not changed:
            masking.is_tracing = tracing  # nothing to force: the release is left as it was
        _changed.update(changed)
        return changed


def _answering_when_forced(is_tracing: Callable) -> Callable:
    def answer(*args, **kwargs):
        # torch.compile's tracing comes first: its graphs never read the thread-local state.
        forced = None if torch.compiler.is_compiling() else getattr(_here, "tracing", None)
        return is_tracing(*args, **kwargs) if forced is None else forced

    return answer


def _forcing_tracing(value: bool, fn: Callable, *args, **kwargs):
    before = getattr(_here, "tracing", None)
    _here.tracing = value
    try:
        return fn(*args, **kwargs)
    finally:
        _here.tracing = before


def _as_in_eager_calls(rule: Callable) -> Callable:
    def decide(padding_mask=None, *args, **kwargs):
        if torch.compiler.is_compiling() or not getattr(_here, "depth", 0) or \
                padding_mask is not None or \
                any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
            return rule(padding_mask, *args, **kwargs)
        return _forcing_tracing(False, rule, padding_mask, *args, **kwargs)

    decide.__wrapped__ = rule
    return decide
