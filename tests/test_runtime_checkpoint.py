"""Checkpoints across strategies, real data and the out-of-memory message, on 4 gloo ranks.

One `run_ranks` launch runs every phase in order on the same ranks (starting torch is slow here):

- `save_a`: 2 float64 steps under `<2,1,1> + <1,2,1>`, then `--save` (DCP, by canonical cells);
- `load_b`: `--load` that checkpoint under `<1,1,2> + 2x<1,1,1>`, one more step (step 2), saved;
- `save_b` / `load_a`: the other way round (1 step under B, saved; loaded under A, step 1);
- `data`: 2 steps on documents of a byte-tokenised corpus (one plan per step, from the
  documents' lengths), saved with its data cursor;
- `oom`: an injected out-of-memory in step 1's micro-batch 0.

Save-then-load-then-step must equal the uninterrupted run on one process (float64, 1e-9): weights,
both AdamW moments and the step count all matter (a missing moment or a wrong bias correction
moves the parameters far beyond the tolerance).
"""

from __future__ import annotations

import functools
import json

import pytest

from tests.runtime_plans import MINI_MODEL, tiny_profile
from tests.runtime_support import require_torch

torch = require_torch()

from hydraplan.api.cli import main  # noqa: E402
from hydraplan.planner.schemas import PlanRequest, SolverOptions  # noqa: E402
from hydraplan.planner.solve import evaluate_strategy  # noqa: E402
from hydraplan.planner.strategies import parse_strategy  # noqa: E402
from hydraplan.runtime import launch  # noqa: E402
from hydraplan.runtime.checkpoint import cells_by_rank, full_shapes  # noqa: E402
from hydraplan.runtime.equivalence import compare_with_reference, single_process_run  # noqa: E402
from hydraplan.runtime.faults import MicroBatchOutOfMemoryError  # noqa: E402
from hydraplan.runtime.run_io import resolve_run_io  # noqa: E402
from hydraplan.runtime.token_data import TokenDirectory  # noqa: E402
from hydraplan.runtime.worker import RunSpec, run_worker  # noqa: E402

pytestmark = pytest.mark.runtime

A, B = "1x<2,1,1> + 1x<1,2,1>", "1x<1,1,2> + 2x<1,1,1>"
LENGTHS = (5, 9, 2, 7, 12, 30, 8, 4, 11)  # sequence 5 is split at the capacity of 24
# the byte tokenizer's 257 ids: a model like rt-mini with that vocabulary (uneven TP rows: 129 + 128)
BYTES_MODEL = dict(MINI_MODEL, name="rt-bytes", vocab_size=257)
CORPUS = [
    "Hydraulis balances sequences of very uneven lengths.",
    "Short one.",
    "Pipelines may differ: <2,1,1> next to <1,2,1>, or CP next to data parallel replicas of the model.",
    "ok",
    "A checkpoint saved under one strategy loads under another.",
    "Every token of the global batch counts once in the loss.",
    "Tiny.",
    "The next run starts at document 6.",
    "And trains on three documents.",
]


@functools.cache
def plan(strategy: str, lengths: tuple[int, ...] = LENGTHS, model: str = MINI_MODEL["name"]):
    request = PlanRequest(
        lengths=list(lengths),
        num_gpus=4,
        gpus_per_node=4,
        options=SolverOptions(solver="greedy", time_limit_s=1.0, seed=0, oversize="split"),
    )
    profile = tiny_profile(model=model, num_layers=2)
    return evaluate_strategy(request, profile, parse_strategy(strategy))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    (root / "models.json").write_text(json.dumps({"models": [MINI_MODEL, BYTES_MODEL]}), encoding="utf-8")
    (root / "corpus.txt").write_text("\n\n".join(CORPUS) + "\n", encoding="utf-8")
    assert main(["data", "convert", str(root / "corpus.txt"), "--out", str(root / "tokens")]) == 0
    return root


def data_plans(workspace) -> list:
    """Step 0 trains on documents 0..3, step 1 on 4..5 (their lengths, as `hydraplan data lengths`)."""
    lengths = TokenDirectory.open(workspace / "tokens").sequence_lengths(0, 6)
    return [plan(A, tuple(lengths[:4]), "rt-bytes"), plan(B, tuple(lengths[4:]), "rt-bytes")]


def phases(workspace) -> dict[str, RunSpec]:
    common = dict(dtype="float64", collect_state=True, models_file=str(workspace / "models.json"))
    return {
        "save_a": RunSpec(plan_json=plan(A).model_dump_json(), steps=2, save_dir=str(workspace / "a"), **common),
        "load_b": RunSpec(
            plan_json=plan(B).model_dump_json(),
            steps=1,
            load_dir=str(workspace / "a"),
            first_step=2,
            save_dir=str(workspace / "ab"),  # and saved again, under B
            **common,
        ),
        "save_b": RunSpec(plan_json=plan(B).model_dump_json(), steps=1, save_dir=str(workspace / "b"), **common),
        "load_a": RunSpec(
            plan_json=plan(A).model_dump_json(), steps=1, load_dir=str(workspace / "b"), first_step=1, **common
        ),
        "data": RunSpec(
            plan_jsons=tuple(p.model_dump_json() for p in data_plans(workspace)),
            steps=2,
            data_path=str(workspace / "tokens"),
            save_dir=str(workspace / "data-ckpt"),
            **common,
        ),
        "oom": RunSpec(plan_json=plan(A).model_dump_json(), steps=2, inject_oom=(1, 0), **common),
    }


def run_phases(rank: int, world_size: int, specs: dict[str, RunSpec]) -> dict:
    results = {}
    for name, spec in specs.items():
        try:
            results[name] = run_worker(rank, world_size, spec)
        except MicroBatchOutOfMemoryError as exc:
            results[name] = {"stopped": str(exc)}
    return results


@pytest.fixture(scope="module")
def ranks(workspace):
    specs = phases(workspace)
    return specs, launch.run_ranks(run_phases, 4, args=(specs,), timeout_s=600.0)


def reports_of(ranks, name: str) -> list[dict]:
    return [results[name] for results in ranks[1]]


def joined(ranks, first: str, second: str) -> list[dict]:
    """Every rank's losses of both phases, its shards after the second (what the check compares)."""
    return [
        dict(after, steps=before["steps"] + after["steps"])
        for before, after in zip(reports_of(ranks, first), reports_of(ranks, second))
    ]


def uninterrupted(ranks, plans: list) -> dict:
    spec = RunSpec(
        plan_jsons=tuple(p.model_dump_json() for p in plans),
        steps=len(plans),
        dtype="float64",
        models_file=ranks[0]["save_a"].models_file,
    )
    return single_process_run(plans[0], spec)


@pytest.mark.parametrize(
    ("first", "second", "strategies"), [("save_a", "load_b", (A, A, B)), ("save_b", "load_a", (B, A))]
)
def test_save_under_one_strategy_load_under_another_equals_the_uninterrupted_run(ranks, first, second, strategies):
    reference = uninterrupted(ranks, [plan(strategy) for strategy in strategies])
    result = compare_with_reference(joined(ranks, first, second), reference, "float64")
    assert result.passed and result.max_param_rel <= 1e-9 and result.max_loss_rel <= 1e-9, result
    # the loaded layout is the other strategy's
    schemes = [report["scheme"] for report in reports_of(ranks, second)]
    assert schemes == (["<1,1,2>"] * 2 + ["<1,1,1>"] * 2 if second == "load_b" else ["<2,1,1>"] * 2 + ["<1,2,1>"] * 2)
    loaded = [report["checkpoint"]["loaded"] for report in reports_of(ranks, second)]
    assert all(entry["optimizer_step"] == len(strategies) - 1 for entry in loaded)


def test_without_the_moments_the_continued_run_differs(ranks):
    """The check above can fail: the same step from the loaded weights with fresh AdamW moments
    (what a weights-only checkpoint would give) misses the uninterrupted run by far."""
    reports = joined(ranks, "save_a", "load_b")
    reference = uninterrupted(ranks, [plan(A), plan(A)])
    from hydraplan.runtime.assignment import model_config_for
    from hydraplan.runtime.model import build_stage
    from hydraplan.runtime.step_data import whole_batch
    from hydraplan.runtime.worker import make_optimizer

    cfg = model_config_for(plan(B), ranks[0]["save_a"].models_file)
    model = build_stage(cfg, dtype=torch.float64)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(reference["params"][name])
    optimizer = make_optimizer(model.parameters(), ranks[0]["save_a"])
    works = [work for pipeline in plan(B).pipelines for work in pipeline.micro_batches]
    batch = whole_batch(_works(works), plan(B).input_lengths, 0, 2, cfg.vocab_size)
    (model(batch) / sum(plan(B).input_lengths)).backward()
    optimizer.step()
    fresh = {name: p.detach() for name, p in model.named_parameters()}
    result = compare_with_reference(reports, dict(reference, params=fresh, losses=[1.0] * 3), "float64")
    assert result.max_param_rel > 1e-4


def _works(batches):
    from hydraplan.runtime.assignment import MicroBatchWork

    return [MicroBatchWork(i, tuple(b.sequence_ids), tuple(b.lengths), tuple(b.offsets)) for i, b in enumerate(batches)]


def test_the_checkpoint_holds_each_canonical_cell_once(ranks, workspace):
    meta = json.loads((workspace / "a" / "hydraplan.json").read_text())
    assert (meta["format"], meta["model"], meta["dtype"], meta["steps_done"]) == (
        "hydraplan.checkpoint/1",
        "rt-mini",
        "float64",
        2,
    )
    assert meta["strategy"] == plan(A).strategy and meta["data"] is None and meta["optimizer_step"] == 2
    whole = sum(torch.Size(shape).numel() for shape in meta["parameters"].values())
    written = sum(report["checkpoint"]["saved"]["written_bytes"] for report in reports_of(ranks, "save_a"))
    assert written == 3 * 8 * whole  # weights + two moments, float64, every element once
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(workspace / "a")).read_metadata()
    for name, shape in meta["parameters"].items():
        entry = metadata.state_dict_metadata[f"model.{name}"]
        assert list(entry.size) == shape
        assert sum(chunk.sizes.numel() for chunk in entry.chunks) == torch.Size(shape).numel()
    # every rank writes a share (replicas split the cells): none writes more than 40% of the bytes
    shares = [report["checkpoint"]["saved"]["written_bytes"] / written for report in reports_of(ranks, "save_a")]
    assert min(shares) > 0 and max(shares) <= 0.4, shares
    layouts = [{n: (box, True) for n, box in report["boxes"].items()} for report in reports_of(ranks, "save_a")]
    cells = cells_by_rank(layouts)
    for name, shape in meta["parameters"].items():  # the cells of each tensor tile it exactly once
        owned = [cell for rank_cells in cells for cell in rank_cells.get(name, [])]
        covered = torch.zeros(shape, dtype=torch.int64)
        for cell in owned:
            covered[tuple(slice(start, stop) for start, stop in cell)] += 1
        assert bool((covered == 1).all()), name
    assert full_shapes(layouts)["layers.0.attn.wq.weight"] == (32, 32)


def test_real_documents_train_the_same_model_as_one_process(ranks, workspace):
    spec = ranks[0]["data"]
    reports = reports_of(ranks, "data")
    result = compare_with_reference(reports, single_process_run(data_plans(workspace)[0], spec), "float64")
    assert result.passed, result
    # the tokens were the documents' own: a synthetic run of the same plans has other losses
    synthetic = single_process_run(data_plans(workspace)[0], RunSpec(**{**spec.__dict__, "data_path": None}))
    assert all(abs(a - b) > 1e-6 for a, b in zip(synthetic["losses"], [s["loss"] for s in reports[0]["steps"]]))
    meta = json.loads((workspace / "data-ckpt" / "hydraplan.json").read_text())
    assert meta["data"] == {"path": str(workspace / "tokens"), "next_document": 6}


def test_an_out_of_memory_names_the_step_the_micro_batch_and_its_tokens(ranks):
    messages = [report["stopped"] for report in reports_of(ranks, "oom")]
    a = plan(A)
    for rank, message in enumerate(messages):
        pipeline = 0 if rank < 2 else 1
        batch = a.pipelines[pipeline].micro_batches[0]
        scheme = "<2,1,1>" if pipeline == 0 else "<1,2,1>"
        entries = ", ".join(f"{s}[{o}:{o + n})" for s, o, n in zip(batch.sequence_ids, batch.offsets, batch.lengths))
        assert message == (
            f"step 1: out of memory in the forward of micro-batch 0 of pipeline {pipeline} {scheme} on rank {rank} "
            f"(stage {1 if rank == 3 else 0}): {batch.num_tokens} tokens, sequences {entries}: CUDA out of memory. "
            "Tried to allocate 2.00 GiB (injected by the test hook)"
        )


# ---------------------------------------------------------------------------------------------
# hydraplan run --data / --save / --load: refused before any rank starts, or passed on
# ---------------------------------------------------------------------------------------------


def write(tmp_path, name: str, plan_) -> str:
    path = tmp_path / name
    path.write_text(plan_.model_dump_json(), encoding="utf-8")
    return str(path)


@pytest.fixture
def no_launch(monkeypatch):
    monkeypatch.setattr(launch, "run_ranks", lambda *a, **k: pytest.fail("a refused run must start no rank"))


def test_cli_refuses_data_that_does_not_fit_the_plan(ranks, workspace, tmp_path, capsys, no_launch):
    models = ["--models-file", str(workspace / "models.json")]
    tokens = str(workspace / "tokens")
    first, second = data_plans(workspace)
    argv = ["run", "--plan", write(tmp_path, "p.json", first), *models, "--data", tokens, "--steps", "2"]
    assert main(argv) == 2  # step 1 would need documents 4..7, whose lengths are not the plan's
    err = capsys.readouterr().err
    assert err.startswith(
        "hydraplan: error: step 1: the plan's input_lengths differ from the data's batch (documents 4"
    )
    assert err.count("\n") == 1
    assert main([*argv[:-2], "--data-start", "1"]) == 2
    assert "step 0: the plan's input_lengths differ" in capsys.readouterr().err
    # rt-mini's 65-token vocabulary does not hold the corpus's bytes
    small = plan(A, tuple(TokenDirectory.open(tokens).sequence_lengths(0, 4)))
    assert main(["run", "--plan", write(tmp_path, "s.json", small), *models, "--data", tokens]) == 2
    assert "beyond the model's vocabulary of 65" in capsys.readouterr().err
    assert main(["run", "--plan", write(tmp_path, "q.json", second), *models, "--data", str(tmp_path)]) == 2
    assert "no meta.json (not a hydraplan.tokens/1 token directory)" in capsys.readouterr().err
    assert main(["run", "--plan", write(tmp_path, "q.json", second), *models, "--data-start", "3"]) == 2
    assert "--data-start 3: needs --data" in capsys.readouterr().err


def test_cli_refuses_a_checkpoint_of_another_run(ranks, workspace, tmp_path, capsys, no_launch):
    models = ["--models-file", str(workspace / "models.json")]
    run_a = ["run", "--plan", write(tmp_path, "a.json", plan(A)), *models]
    assert main([*run_a, "--load", str(workspace / "a")]) == 2  # saved in float64
    assert (
        capsys.readouterr().err
        == f"hydraplan: error: --load {workspace / 'a'}: saved in float64, the run is --dtype float32\n"
    )
    assert main([*run_a, "--dtype", "float64", "--load", str(workspace / "data-ckpt")]) == 2
    assert "a checkpoint of model 'rt-bytes', the plan's is 'rt-mini'" in capsys.readouterr().err
    assert main([*run_a, "--load", str(workspace / "tokens")]) == 2
    assert "not a hydraplan checkpoint (no hydraplan.json or DCP .metadata)" in capsys.readouterr().err
    assert main([*run_a, "--dtype", "float64", "--load", str(workspace / "a"), "--check"]) == 2
    assert "--check runs from the initial weights" in capsys.readouterr().err
    assert main([*run_a, "--save", str(workspace / "tokens")]) == 2
    assert "a non-empty directory that is not a hydraplan checkpoint" in capsys.readouterr().err


def test_cli_continues_from_the_checkpoint_step_and_data_cursor(ranks, workspace, tmp_path, monkeypatch, capsys):
    specs = []

    def fake_run_ranks(fn, nproc, *, backend, args, timeout_s, stall_timeout_s, on_progress):
        specs.append(args[0])
        for beat in [(2, "start"), (2, "compute"), (3, "done")] if on_progress else []:  # the rank furthest behind
            on_progress(*beat)
        return reports_of(ranks, "load_b")  # a run whose steps start at 2 (after a --load)

    monkeypatch.setattr(launch, "run_ranks", fake_run_ranks)
    lengths = TokenDirectory.open(workspace / "tokens").sequence_lengths(6, 3)
    argv = ["run", "--plan", write(tmp_path, "next.json", plan(B, tuple(lengths), "rt-bytes"))]
    argv += ["--models-file", str(workspace / "models.json"), "--dtype", "float64"]
    argv += ["--data", str(workspace / "tokens"), "--load", str(workspace / "data-ckpt"), "--save", str(tmp_path / "c")]
    assert main([*argv, "--progress"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().err.startswith("hydraplan: run step 1/1 (plan ")  # the step after --load is 1/1
    assert main(argv) == 0, capsys.readouterr().err
    spec = specs[-1]
    assert (spec.first_step, spec.data_start, spec.load_dir) == (2, 6, str(workspace / "data-ckpt"))
    assert spec.save_dir == str(tmp_path / "c") and spec.data_path == str(workspace / "tokens")
    out = capsys.readouterr().out
    assert "checkpoint saved:" in out and "checkpoint loaded:" in out and "  step 2 (" in out
    # the same refusal logic, for the worker under torchrun
    fields = resolve_run_io(
        [plan(B, tuple(lengths), "rt-bytes")],
        _cfg(workspace),
        "float64",
        data=str(workspace / "tokens"),
        load=str(workspace / "data-ckpt"),
    )
    assert fields["data_start"] == 6 and fields["first_step"] == 2


def _cfg(workspace):
    from hydraplan.runtime.assignment import model_config_for

    return model_config_for(data_plans(workspace)[0], str(workspace / "models.json"))


def test_the_oom_guard_names_only_out_of_memory_errors():
    import dataclasses

    from hydraplan.runtime.assignment import MicroBatchWork, assign_ranks
    from hydraplan.runtime.faults import oom_guard

    assignment = assign_ranks(plan(A))[3]  # the <1,2,1> pipeline's stage 1
    work = MicroBatchWork(0, tuple(range(10)), (3,) * 10, (0,) * 10)
    assignment = dataclasses.replace(assignment, micro_batches=(work,))
    with pytest.raises(MicroBatchOutOfMemoryError) as caught:
        with oom_guard("B", assignment, 0):
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 9 GB\nout of memory")
    assert str(caught.value) == (
        "out of memory in the backward of micro-batch 0 of pipeline 1 <1,2,1> on rank 3 (stage 1): 30 tokens, "
        "sequences 0[0:3), 1[0:3), 2[0:3), 3[0:3), 4[0:3), 5[0:3), 6[0:3), 7[0:3) and 2 more: "
        "DefaultCPUAllocator: not enough memory: you tried to allocate 9 GB"
    )
    assert str(caught.value.at_step(4)).startswith("step 4: out of memory in the backward")
    with pytest.raises(RuntimeError, match="^shape mismatch$"):  # any other error passes unchanged
        with oom_guard("F", assignment, 0):
            raise RuntimeError("shape mismatch")


def test_the_worker_front_door_refuses_a_negative_data_start(workspace):
    from hydraplan.runtime.assignment import PlanRefusedError

    first = data_plans(workspace)[0]
    with pytest.raises(PlanRefusedError, match=r"^--data-start -1: must be >= 0$"):
        resolve_run_io([first], _cfg(workspace), "float64", data=str(workspace / "tokens"), data_start=-1)
    fields = resolve_run_io([first], _cfg(workspace), "float64", data=str(workspace / "tokens"))
    assert (fields["data_start"], fields["first_step"], fields["load_dir"]) == (0, 0, None)


def test_a_checkpoint_meta_nested_too_deeply_is_one_line(tmp_path):
    # json.loads raises RecursionError on it (not JSONDecodeError): a traceback before
    from hydraplan.runtime.checkpoint import META_FILE, CheckpointError, read_checkpoint_meta

    (tmp_path / META_FILE).write_text("[" * 100_000, encoding="utf-8")
    (tmp_path / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is not JSON \(maximum recursion depth exceeded"):
        read_checkpoint_meta(str(tmp_path))
