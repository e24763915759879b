"""Counting the collectives a stage runs per micro-batch, and the closed form they must equal.

`counting()` instruments `torch.distributed` in this process: while it is active, every
`all_reduce`, `all_gather_single` / `all_gather_into_tensor`, `all_gather`, `reduce_scatter_single` /
`reduce_scatter_tensor`, `send`/`recv`/`batch_isend_irecv` call is recorded (kind, payload bytes
on this rank, group size) and then run as usual. The parallel layers cannot skip it (it replaces
the functions they call), so the counts are what really went over the process groups.

`megatron_counts(...)` is the closed form of Megatron-LM's layout for one micro-batch on one
stage (Shoeybi et al. 2019, section 3; Korthikanti et al. 2022, arXiv 2205.05198, table 2 counts
the same 2 all-reduces forward and 2 backward per layer), in this runtime's shapes:

- TP degree t > 1, T local tokens, hidden H, e bytes per element: per layer, forward 2 all-reduces
  of T*H*e (attention and MLP outputs, operator g) and backward 2 (their inputs, operator f);
  the first stage's vocabulary-parallel embedding adds 1 forward, the last stage's LM head input
  1 backward; the vocabulary-parallel cross-entropy 3 forward all-reduces of T values (max, sum
  of exponentials, target logit, float32 or wider).
- CP degree c > 1: per layer, K and V all-gathered forward (each rank gives P*kv*d*e, P the
  largest local token count, kv the key/value heads per TP rank, d the head size) and their
  gradients reduce-scattered backward (each rank keeps P*kv*d*e).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["CollectiveCounts", "counting", "expected_for", "megatron_counts", "stage_counts"]

_INSTRUMENTED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "send",
    "recv",
    "batch_isend_irecv",
)
_KIND = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather"}
_KIND["reduce_scatter_single"] = "reduce_scatter"
_KIND["reduce_scatter_tensor"] = "reduce_scatter"


@dataclass
class CollectiveCounts:
    """Calls and payload bytes per kind: `calls[kind]`, `bytes[kind]` (this rank's side)."""

    calls: Counter
    bytes: Counter

    def as_dict(self) -> dict[str, tuple[int, int]]:
        return {kind: (self.calls[kind], self.bytes[kind]) for kind in sorted(self.calls)}


def _payload_bytes(name: str, args: tuple) -> int:
    """The bytes this rank contributes: the input of a gather, the output of a reduce-scatter."""
    if name == "batch_isend_irecv":
        return sum(op.tensor.numel() * op.tensor.element_size() for op in args[0])
    if name == "all_gather":
        tensor = args[1]
    elif name in ("all_gather_into_tensor", "all_gather_single"):
        tensor = args[1]
    elif name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        tensor = args[0]
    else:
        tensor = args[0]
    return tensor.numel() * tensor.element_size()


@contextmanager
def counting() -> Iterator[CollectiveCounts]:
    """Record every collective and point-to-point call of this process inside the block."""
    counts = CollectiveCounts(Counter(), Counter())
    originals = {name: getattr(dist, name) for name in _INSTRUMENTED if hasattr(dist, name)}

    def instrumented(name: str, original):
        def call(*args, **kwargs):
            kind = _KIND.get(name, name)
            counts.calls[kind] += 1
            counts.bytes[kind] += _payload_bytes(name, args)
            return original(*args, **kwargs)

        return call

    for name, original in originals.items():
        setattr(dist, name, instrumented(name, original))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def megatron_counts(
    *,
    num_layers: int,
    hidden_size: int,
    kv_heads_per_rank: int,
    head_dim: int,
    tokens: int,
    padded_tokens: int,
    element_bytes: int,
    tp: int,
    cp: int,
    first_stage: bool,
    last_stage: bool,
) -> dict[str, dict[str, tuple[int, int]]]:
    """{"forward"|"backward": {kind: (calls, bytes)}} of one micro-batch on one stage (see the module)."""
    forward: Counter = Counter()
    forward_bytes: Counter = Counter()
    backward: Counter = Counter()
    backward_bytes: Counter = Counter()
    activation = tokens * hidden_size * element_bytes
    if tp > 1:
        block_ops = 2 * num_layers
        forward["all_reduce"] += block_ops + int(first_stage)
        forward_bytes["all_reduce"] += (block_ops + int(first_stage)) * activation
        backward["all_reduce"] += block_ops + int(last_stage)
        backward_bytes["all_reduce"] += (block_ops + int(last_stage)) * activation
        if last_stage:
            loss_bytes = tokens * max(element_bytes, 4)  # logits promoted to float32 at least
            forward["all_reduce"] += 3
            forward_bytes["all_reduce"] += 3 * loss_bytes
    if cp > 1:
        kv = padded_tokens * kv_heads_per_rank * head_dim * element_bytes
        forward["all_gather"] += 2 * num_layers
        forward_bytes["all_gather"] += 2 * num_layers * kv
        backward["reduce_scatter"] += 2 * num_layers
        backward_bytes["reduce_scatter"] += 2 * num_layers * kv
    return {
        "forward": {kind: (forward[kind], forward_bytes[kind]) for kind in sorted(forward)},
        "backward": {kind: (backward[kind], backward_bytes[kind]) for kind in sorted(backward)},
    }


def stage_counts(stage, batch, cp_rank: int, cp: int) -> dict[str, dict[str, tuple[int, int]]]:
    """Run one micro-batch forward and backward on a parallelised `stage` (first and last stage:
    it embeds and returns the loss) and count its collectives per direction."""
    from hydraplan.runtime.parallel import cp_shard

    local = cp_shard(batch, cp_rank, cp) if cp > 1 else batch
    with counting() as forward:
        loss = stage(local)
    with counting() as backward:
        loss.backward()
    return {"forward": forward.as_dict(), "backward": backward.as_dict()}


def expected_for(
    cfg, batch, tp: int, cp: int, cp_rank: int, dtype: torch.dtype
) -> dict[str, dict[str, tuple[int, int]]]:
    """`megatron_counts` for the whole model as one stage on `batch`, on CP rank `cp_rank` (its
    own tokens; the all-gathers padded to the largest CP rank's)."""
    from hydraplan.runtime.parallel import cp_shard
    from hydraplan.runtime.parallel.cp import padded_tokens

    layout = cp_shard(batch, cp_rank, cp).cp_layout if cp > 1 else None
    padded = padded_tokens(layout) if layout is not None else batch.num_tokens
    local_tokens = sum(layout.local_lengths(cp_rank)) if layout is not None else batch.num_tokens
    return megatron_counts(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        kv_heads_per_rank=cfg.num_kv_heads // tp,
        head_dim=cfg.head_dim,
        tokens=local_tokens,
        padded_tokens=padded,
        element_bytes=torch.empty((), dtype=dtype).element_size(),
        tp=tp,
        cp=cp,
        first_stage=True,
        last_stage=True,
    )
