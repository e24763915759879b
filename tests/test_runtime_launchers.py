"""The two launches the 4-rank scenarios cannot host: an 8-rank plan mixing TP, PP and CP with
split sequences (`hydraplan run`'s launcher), and the same worker under `torchrun` (2 ranks).
Both are checked against one process in float64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.runtime_plans import MINI_MODEL, fixed_plan, write_models_file
from tests.runtime_support import assert_nccl_safe, require_torch

torch = require_torch()

from hydraplan.runtime import launch  # noqa: E402
from hydraplan.runtime.equivalence import compare_with_reference, single_process_run  # noqa: E402
from hydraplan.runtime.worker import RunSpec, run_worker  # noqa: E402

pytestmark = pytest.mark.runtime

# two sequences longer than the capacity of 24 tokens: both are split into chunks
EIGHT_LENGTHS = [30, 5, 9, 2, 41, 8, 4, 11]


def test_eight_ranks_tp_pp_and_cp_in_one_plan_equal_one_process(tmp_path):
    models_file = write_models_file(tmp_path / "models.json")
    plan = fixed_plan("1x<2,2,1> + 1x<1,2,2>", EIGHT_LENGTHS, 8, model=MINI_MODEL["name"])
    split = [mb for p in plan.pipelines for mb in p.micro_batches if any(o > 0 for o in (mb.offsets or []))]
    assert split, "the plan splits a sequence"
    spec = RunSpec(
        plan_json=plan.model_dump_json(), steps=2, dtype="float64", collect_state=True, models_file=models_file
    )
    reports = launch.run_ranks(run_worker, 8, args=(spec,), timeout_s=600.0, stall_timeout_s=120.0)
    assert [(r["scheme"], r["stage"], r["tp_rank"], r["cp_rank"]) for r in reports] == [
        ("<2,2,1>", 0, 0, 0),
        ("<2,2,1>", 0, 1, 0),
        ("<2,2,1>", 1, 0, 0),
        ("<2,2,1>", 1, 1, 0),
        ("<1,2,2>", 0, 0, 0),
        ("<1,2,2>", 0, 0, 1),
        ("<1,2,2>", 1, 0, 0),
        ("<1,2,2>", 1, 0, 1),
    ]
    result = compare_with_reference(reports, single_process_run(plan, spec), "float64")
    assert result.passed and result.max_loss_rel <= 1e-9 and result.max_param_rel <= 1e-9, result
    assert len({step["loss"] for step in reports[0]["steps"]}) == 2
    assert assert_nccl_safe(reports) > 0  # TP, PP and CP stages: the exchanges NCCL would run


def test_the_worker_under_torchrun(tmp_path):
    models_file = write_models_file(tmp_path / "models.json")
    plan = fixed_plan("1x<1,2,1>", EIGHT_LENGTHS[:6], 2, model=MINI_MODEL["name"])
    spec = RunSpec(plan_json=plan.model_dump_json(), steps=2, dtype="float64", models_file=models_file)
    plan_path, report_path = tmp_path / "plan.json", tmp_path / "run.json"
    plan_path.write_text(plan.model_dump_json(), encoding="utf-8")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "hydraplan.runtime.worker", "--plan", str(plan_path), "--models-file", models_file]
    command += ["--steps", "2", "--dtype", "float64", "--report", str(report_path), "--stall-timeout-s", "120"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hydraplan worker: 2 ranks, losses" in done.stdout
    document = json.loads(report_path.read_text())
    reference = single_process_run(plan, spec)
    losses = [step["loss"] for step in document["ranks"][0]["steps"]]
    assert [r["stage"] for r in document["ranks"]] == [0, 1]
    assert losses == pytest.approx(reference["losses"], rel=1e-9)
