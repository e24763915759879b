"""`--check`: the same steps on one process, and the largest differences from the ranks.

The single-process run builds the whole model (`build_stage(cfg)`, the same init by canonical
name), packs every entry of every pipeline's micro-batches of a step into one batch (the same
tokens, `step_data.whole_batch`), divides the summed loss by the same global token count and takes
the same AdamW step. The ranks' shards are compared with the matching index ranges of the full
tensors (`boxes`, from `parameter_slices`): the sharded run trains the same model if and only if
every shard equals its slice.

Cut sequences (issue 30): the reference trains every sequence whole unless the plan lists its
cut as the user's (`split_sequence_ids`: `--oversize split`), so a plan that trains a sequence as
chunks (each chunk attends only to itself) without that never passes as equivalent by replaying
its own cut. `check_run` (`--check`) reports the cut (`cut_summary`: sequences, chunks, tokens that
lost the attention context before their chunk) and the difference from the all-uncut batch.

Tolerances (issue 12): float64, the loss of every step and every parameter after the steps within
1e-9 relative (`max |diff| / max |reference|` per tensor); float32, the gradients of the first step
within 1e-5 relative to their norm (`||diff|| / ||reference||` per tensor).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hydraplan.planner.schemas import Plan
from hydraplan.runtime.assignment import MicroBatchWork, assign_ranks, global_token_count, model_config_for
from hydraplan.runtime.data_feed import StepFeed
from hydraplan.runtime.model import build_stage
from hydraplan.runtime.step_data import whole_batch
from hydraplan.runtime.worker import DTYPES, RunSpec, make_optimizer

__all__ = ["TOLERANCES", "CheckResult", "check_run", "compare_with_reference", "cut_summary", "single_process_run"]

TOLERANCES = {"float64": {"loss": 1e-9, "params": 1e-9}, "float32": {"grads": 1e-5}}


@dataclass(frozen=True)
class CheckResult:
    """Largest relative differences between the ranks and the single process, and the verdict."""

    dtype: str
    max_loss_rel: float
    max_param_rel: float
    max_grad_rel_to_norm: float
    worst_param: str
    worst_grad: str
    passed: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__, tolerances=TOLERANCES[self.dtype])


def single_process_run(plan: Plan, spec: RunSpec, uncut: bool | None = None) -> dict:
    """Losses of every step, first-step gradients and final parameters of the whole model.

    `plan` is the run's plan when every step has the same one; with `spec.plan_jsons` each step
    takes its own plan's batch (the strategy does not matter on one process). `uncut`: True,
    every sequence whole, as the user's data has it; False, the plan's chunks, each its own
    sequence; None (the oracle), whole except the cuts the plan allows (`split_sequence_ids`)."""
    plans = [Plan.model_validate_json(text) for text in spec.plan_jsons] or [plan] * spec.steps
    cfg = model_config_for(plans[0], spec.models_file)
    model = build_stage(cfg, seed=spec.init_seed, dtype=DTYPES[spec.dtype])
    optimizer = make_optimizer(model.parameters(), spec)
    feed = StepFeed.open(spec, cfg.vocab_size)  # None: synthetic tokens
    losses, grads = [], None
    for step, step_plan in enumerate(plans):
        works = [work for rank in _first_ranks(step_plan) for work in rank.micro_batches]
        if uncut is not False:
            keep = set() if uncut else set(step_plan.split_sequence_ids)
            works = [_whole_sequences(works, step_plan.input_lengths, keep)]
        global_tokens = global_token_count(step_plan)
        optimizer.zero_grad(set_to_none=True)
        documents = feed.documents(step_plan) if feed else None
        batch = whole_batch(works, step_plan.input_lengths, spec.data_seed, step, cfg.vocab_size, documents)
        loss_sum = model(batch)
        (loss_sum / global_tokens).backward()
        losses.append(float(loss_sum.detach()) / global_tokens)
        if step == 0:
            grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        optimizer.step()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def _whole_sequences(works: list[MicroBatchWork], input_lengths: list[int], keep: set[int]) -> MicroBatchWork:
    """Every entry of `works` in one work, the chunks of a sequence not in `keep` merged into the
    whole sequence (at its first chunk's place; the label tokens are the same: the chunks of a
    sequence together predict exactly its labels)."""
    entries, merged = [], set()
    for work in works:
        for sequence_id, offset, length in zip(work.sequence_ids, work.offsets, work.lengths):
            if sequence_id in keep:
                entries.append((sequence_id, offset, length))
            elif sequence_id not in merged:
                merged.add(sequence_id)
                entries.append((sequence_id, 0, input_lengths[sequence_id]))
    ids, offsets, lengths = zip(*entries) if entries else ((), (), ())
    return MicroBatchWork(index=0, sequence_ids=tuple(ids), lengths=tuple(lengths), offsets=tuple(offsets))


def cut_summary(plans: list[Plan]) -> dict:
    """What the plans train as chunks: sequences cut, chunks, tokens trained without the context
    before their chunk (every token of a chunk past a sequence's first), and whether every cut is
    one the plan allows (`split_sequence_ids`: the user asked for `--oversize split`)."""
    sequences, chunks, lost, allowed = 0, 0, 0, True
    for plan in plans:
        pieces: dict[int, list[tuple[int, int]]] = {}
        for pipeline in plan.pipelines:
            for batch in pipeline.micro_batches:
                for sequence_id, offset, length in zip(batch.sequence_ids, batch.offsets, batch.lengths):
                    pieces.setdefault(sequence_id, []).append((offset, length))
        listed = set(plan.split_sequence_ids)
        for sequence_id, parts in pieces.items():
            if len(parts) < 2:
                continue
            sequences += 1
            chunks += len(parts)
            lost += sum(length for offset, length in parts if offset > 0)
            allowed &= sequence_id in listed
    return {"sequences": sequences, "chunks": chunks, "tokens_without_context": lost, "allowed": allowed}


def check_run(plan: Plan, spec: RunSpec, reports: list[dict]) -> dict:
    """`--check`: against the batch uncut but for the cuts the plans allow, with the cuts and the
    difference from the all-uncut batch reported."""
    plans = [Plan.model_validate_json(text) for text in spec.plan_jsons] or [plan] * spec.steps
    cuts = cut_summary(plans)
    result = compare_with_reference(reports, single_process_run(plan, spec), spec.dtype).as_dict()
    if cuts["sequences"]:
        uncut = compare_with_reference(reports, single_process_run(plan, spec, uncut=True), spec.dtype)
        cuts["uncut_max_loss_rel"] = uncut.max_loss_rel
        cuts["uncut_passed"] = uncut.passed
    result["cuts"] = cuts
    return result


def _first_ranks(plan: Plan):
    """One assignment per pipeline (its micro-batches)."""
    seen, firsts = set(), []
    for assignment in assign_ranks(plan):
        if assignment.pipeline_index not in seen:
            seen.add(assignment.pipeline_index)
            firsts.append(assignment)
    return firsts


def _piece(full: torch.Tensor, box) -> torch.Tensor:
    view = full
    for dim, (start, stop) in enumerate(box):
        view = view.narrow(dim, start, stop - start)
    return view


def compare_with_reference(reports: list[dict], reference: dict, dtype: str) -> CheckResult:
    """The largest differences over every rank, step and tensor (see the module docstring)."""
    max_loss = 0.0
    for report in reports:
        for step, ref_loss in zip(report["steps"], reference["losses"], strict=True):
            max_loss = max(max_loss, abs(step["loss"] - ref_loss) / abs(ref_loss))
    max_param, worst_param = 0.0, ""
    max_grad, worst_grad = 0.0, ""
    for report in reports:
        for name, shard in report["params"].items():
            expected = _piece(reference["params"][name], report["boxes"][name])
            scale = float(expected.abs().max()) or 1.0
            diff = float((shard - expected).abs().max()) / scale
            if diff >= max_param:
                max_param, worst_param = diff, f"rank {report['rank']} {name}"
        for name, grad in report["grads"].items():
            expected = _piece(reference["grads"][name], report.get("grad_boxes", report["boxes"])[name])
            norm = float(expected.norm()) or 1.0
            diff = float((grad - expected).norm()) / norm
            if diff >= max_grad:
                max_grad, worst_grad = diff, f"rank {report['rank']} {name}"
    limits = TOLERANCES[dtype]
    passed = (
        max_loss <= limits.get("loss", float("inf"))
        and max_param <= limits.get("params", float("inf"))
        and max_grad <= limits.get("grads", float("inf"))
    )
    return CheckResult(dtype, max_loss, max_param, max_grad, worst_param, worst_grad, passed)
