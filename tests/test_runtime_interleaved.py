"""Interleaved pipelines executed (issue 32, item 5): a rank's v model chunks run in the order the
planner simulates, and one step of an interleaved heterogeneous plan on 4 gloo ranks equals one
process. One launch: `1x<1,2,1,2> + 1x<1,2,1>` (an interleaved PP-2 pipeline beside a plain one)
of a 4-layer model, two float64 steps; plus cheap in-process checks of the chunk layout."""

from __future__ import annotations

import json

import pytest

from tests.runtime_plans import MINI_MODEL, tiny_profile
from tests.runtime_support import require_torch

torch = require_torch()

from hydraplan.planner.check import check_plan  # noqa: E402
from hydraplan.planner.schemas import PlanRequest, SchemeCost, SolverOptions  # noqa: E402
from hydraplan.planner.simulate import interleaved_operations  # noqa: E402
from hydraplan.planner.solve import evaluate_strategy  # noqa: E402
from hydraplan.planner.strategies import parse_strategy  # noqa: E402
from hydraplan.runtime import launch  # noqa: E402
from hydraplan.runtime.assignment import MicroBatchWork, assign_ranks, validate_plan  # noqa: E402
from hydraplan.runtime.equivalence import compare_with_reference, single_process_run  # noqa: E402
from hydraplan.runtime.model import ModelConfig, build_stage, chunk_layer_ranges  # noqa: E402
from hydraplan.runtime.step_data import micro_batch  # noqa: E402
from hydraplan.runtime.worker import RunSpec, run_worker  # noqa: E402

pytestmark = pytest.mark.runtime

MODEL4 = {**MINI_MODEL, "name": "rt-mini4", "num_layers": 4}
STRATEGY = "1x<1,2,1,2> + 1x<1,2,1>"
LENGTHS = [5, 9, 2, 7, 12, 30, 8, 4, 11, 6]


def interleaved_plan(lengths=LENGTHS):
    """The planner's plan of the batch on STRATEGY (the interleaved entry priced per chunk)."""
    profile = tiny_profile(model=MODEL4["name"], num_layers=4)
    chunk = SchemeCost(tp=1, pp=2, cp=1, v=2, a=5e-7, b=2.6e-4, c=6e-4, capacity_tokens=24, grad_bytes_per_gpu=3.2e6)
    profile = profile.model_copy(update={"schemes": [*profile.schemes, chunk]})
    request = PlanRequest(
        lengths=lengths, num_gpus=4, gpus_per_node=4, options=SolverOptions(solver="greedy", oversize="split")
    )
    return evaluate_strategy(request, profile, parse_strategy(STRATEGY))


def test_chunks_are_the_virtual_stages_of_the_rank() -> None:
    assert chunk_layer_ranges(8, 2, 0, 2) == [range(0, 2), range(4, 6)]
    assert chunk_layer_ranges(8, 2, 1, 2) == [range(2, 4), range(6, 8)]
    assert chunk_layer_ranges(8, 4, 3, 1) == [range(6, 8)]
    with pytest.raises(ValueError, match="pp=2 x v=3 chunks do not divide num_layers=8"):
        chunk_layer_ranges(8, 2, 0, 3)


def test_the_chunks_in_virtual_stage_order_are_the_whole_model() -> None:
    """Rank 0 chunk 0 -> rank 1 chunk 0 -> rank 0 chunk 1 -> rank 1 chunk 1 (the ring) gives the
    whole model's loss and, backwards, its gradients."""
    cfg = ModelConfig(**{k: v for k, v in MODEL4.items() if k != "source"})
    whole = build_stage(cfg, seed=3, dtype=torch.float64)
    ranks = [build_stage(cfg, pp=2, stage=r, seed=3, dtype=torch.float64, virtual_stages=2) for r in (0, 1)]
    assert {n for r in ranks for n, _ in r.named_parameters()} >= {n for n, _ in whole.named_parameters()}
    batch = micro_batch(MicroBatchWork(0, (0, 1), (7, 5), (0, 0)), [7, 5], 0, 0, cfg.vocab_size)
    hidden = None
    for virtual in range(4):
        rank, chunk = virtual % 2, virtual // 2
        hidden = ranks[rank](batch, hidden, layers=chunk_layer_ranges(4, 2, rank, 2)[chunk])
    expected = whole(batch)
    assert float(hidden.detach()) == pytest.approx(float(expected.detach()), rel=1e-12)
    hidden.backward()
    expected.backward()
    grads = dict(whole.named_parameters())
    for name, parameter in ranks[0].named_parameters():
        if name.startswith("layers."):
            assert torch.allclose(parameter.grad, grads[name].grad, rtol=1e-10, atol=1e-14), name


def test_the_plan_is_interleaved_checked_and_runnable() -> None:
    plan = interleaved_plan()
    assert check_plan(plan) == []
    (chunked,) = [p for p in plan.pipelines if p.scheme.v == 2]
    assert len(chunked.micro_batches) % 2 == 0
    me = assign_ranks(plan)[chunked.ranks[1]]
    assert (me.num_chunks, me.ring_next_rank, me.ring_previous_rank) == (2, chunked.ranks[0], chunked.ranks[0])
    cfg = ModelConfig(**{k: v for k, v in MODEL4.items() if k != "source"})
    validate_plan(plan, 4, cfg)  # the runtime takes it (its layers split into pp x v chunks)


def run_steps(rank: int, world_size: int, spec: RunSpec) -> dict:
    return run_worker(rank, world_size, spec)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    models = tmp_path_factory.mktemp("models") / "models.json"
    models.write_text(json.dumps({"models": [MODEL4]}), encoding="utf-8")
    plan = interleaved_plan()
    spec = RunSpec(
        plan_json=plan.model_dump_json(), models_file=str(models), steps=2, dtype="float64", collect_state=True
    )
    return plan, spec, launch.run_ranks(run_steps, 4, args=(spec,), timeout_s=600.0)


def test_an_interleaved_pipeline_beside_a_plain_one_equals_one_process(launched) -> None:
    plan, spec, reports = launched
    result = compare_with_reference(reports, single_process_run(plan, spec), "float64")
    assert result.passed, result
    assert result.max_loss_rel <= 1e-9 and result.max_param_rel <= 1e-9
    losses = [step["loss"] for step in reports[0]["steps"]]
    assert len(set(losses)) == 2  # it trained


def test_every_rank_ran_its_chunks_in_the_simulated_order(launched) -> None:
    plan, _, reports = launched
    (chunked,) = [p for p in plan.pipelines if p.scheme.v == 2]
    m = len(chunked.micro_batches)
    for stage, rank in enumerate(chunked.ranks):
        ops = reports[rank]["steps"][0]["ops"]
        ran = [(op["op"] == "F", op["micro_batch"], op["chunk"]) for op in ops]
        assert ran == interleaved_operations(stage, 2, 2, m, 2)
        # one activation per forward and one gradient per backward cross the ring, except the ends'
        sends = [batch for batch in reports[rank]["steps"][0]["p2p_batches"] if batch[0][0] == "send"]
        assert len(sends) == 2 * 2 * m - m
