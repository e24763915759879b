"""Collectives per micro-batch: what the runtime's TP and CP layers run vs Megatron-LM's closed form.

    python benchmarks/runtime_comm.py

Counts, not times: one launch of 4 gloo ranks runs one micro-batch (forward and backward) of a
2-layer model, whole on each rank, under `<2,1,1>`, `<1,1,2>` and `<2,1,2>`, with
`torch.distributed` instrumented (`runtime/comm_count.py`: every all-reduce, all-gather and
reduce-scatter call and its payload bytes on that rank). Beside each count: the closed form of
Megatron-LM's layout (`megatron_counts`) and, for reference, what this runtime ran before it
took that layout (an f operator, so a backward all-reduce, in every column-parallel linear:
wq, wk, wv, w_gate, w_up; CP's backward as an all-reduce of the whole gathered K/V gradient).
The table goes to benchmarks/results/runtime_comm.md and to the section `runtime_comm` of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.report import command_line, markdown_table, write_result  # noqa: E402

SHAPE = dict(num_layers=2, hidden_size=32, ffn_hidden_size=50, num_heads=4, num_kv_heads=2, vocab_size=65)
LENGTHS = (37, 5, 120, 9, 64)
SCHEMES = ((2, 1), (1, 2), (2, 2))  # (tp, cp) on 4 ranks: 2 groups of 2, or one 2x2 grid


def _rank(rank: int, world_size: int) -> dict:
    """Every scheme on this rank: measured counts and the closed form."""
    import torch
    import torch.distributed as dist

    from hydraplan.runtime.comm_count import expected_for, stage_counts
    from hydraplan.runtime.model import ModelConfig, PackedBatch, build_stage
    from hydraplan.runtime.parallel import parallelize_stage

    cfg = ModelConfig.from_catalog("tiny", **SHAPE)
    batch = PackedBatch.from_lengths(list(LENGTHS), cfg.vocab_size, seed=0)
    pairs = {ranks: dist.new_group(list(ranks)) for ranks in ((0, 1), (2, 3), (0, 2), (1, 3))}
    results = {}
    for tp, cp in SCHEMES:
        # 2x2 grid: TP groups (0,1) and (2,3), CP groups (0,2) and (1,3); otherwise pairs (0,1), (2,3)
        pair = (rank - rank % 2, rank - rank % 2 + 1)
        tp_group = pairs[pair] if tp > 1 else None
        cp_ranks = ((rank % 2, rank % 2 + 2) if tp > 1 else pair) if cp > 1 else None
        cp_group = pairs[cp_ranks] if cp_ranks else None
        cp_rank = cp_ranks.index(rank) if cp_ranks else 0
        stage = build_stage(cfg, seed=0, dtype=torch.float32)
        parallelize_stage(stage, tp=tp, cp=cp, tp_group=tp_group, cp_group=cp_group)
        results[(tp, cp)] = {
            "measured": stage_counts(stage, batch, cp_rank, cp),
            "closed_form": expected_for(cfg, batch, tp, cp, cp_rank, torch.float32),
        }
    return results


def _previous_layout(cfg, closed_form: dict, tp: int, cp: int) -> dict:
    """The former layout's backward, from the closed form: 5 f operators per layer instead of 2
    (gated MLP), and CP's backward an all-reduce of cp times the reduce-scatter's payload."""
    backward = dict(closed_form["backward"])
    if tp > 1:
        calls, size = backward["all_reduce"]
        per_call = size // calls
        extra = 3 * cfg.num_layers  # wq, wk, wv, w_gate, w_up: 5 where Megatron-LM has 2
        backward["all_reduce"] = (calls + extra, size + extra * per_call)
    if cp > 1:
        calls, size = backward.pop("reduce_scatter")
        all_reduce = backward.get("all_reduce", (0, 0))
        backward["all_reduce"] = (all_reduce[0] + calls, all_reduce[1] + cp * size)
    return backward


def main() -> int:
    from hydraplan.runtime.launch import run_ranks
    from hydraplan.runtime.model import ModelConfig

    cfg = ModelConfig.from_catalog("tiny", **SHAPE)
    ranks = run_ranks(_rank, 4, timeout_s=600.0)
    rows, agree = [], True
    for tp, cp in SCHEMES:
        result = ranks[0][(tp, cp)]
        agree &= all(r[(tp, cp)]["measured"] == r[(tp, cp)]["closed_form"] for r in ranks)
        before = _previous_layout(cfg, result["closed_form"], tp, cp)
        for direction in ("forward", "backward"):
            for kind, (calls, size) in sorted(result["measured"][direction].items()):
                want_calls, want_size = result["closed_form"][direction].get(kind, (0, 0))
                old = before.get(kind, (0, 0)) if direction == "backward" else (want_calls, want_size)
                rows.append(
                    [f"<{tp},1,{cp}>", direction, kind, calls, want_calls, f"{size:,}", f"{want_size:,}", old[0]]
                )
            if direction == "backward":
                for kind, (old_calls, _) in before.items():
                    if kind not in result["measured"][direction]:
                        rows.append([f"<{tp},1,{cp}>", direction, kind, 0, 0, "0", "0", old_calls])
    headers = [
        "scheme",
        "direction",
        "collective",
        "calls (measured)",
        "calls (closed form)",
        "bytes on rank 0 (measured)",
        "bytes (closed form)",
        "calls before (former layout)",
    ]
    table = markdown_table(headers, rows)
    verdict = "every rank's measured counts and bytes equal the closed form" if agree else "MISMATCH"
    body = (
        f"One micro-batch of {sum(LENGTHS)} tokens ({len(LENGTHS)} sequences), a 2-layer model "
        f"(hidden {SHAPE['hidden_size']}, {SHAPE['num_kv_heads']} KV heads), float32, whole on each rank; "
        f"4 gloo ranks. {verdict}.\n\n{table}\n"
    )
    write_result("runtime_comm", command_line(), body, body)
    print(body)
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
