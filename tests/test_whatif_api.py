"""The REST sweep job and `hydraplan whatif` are one engine: the same configurations give the
same rows through both front doors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_support import make_client, wait_for

from hydraplan.api.cli import main
from hydraplan.api.datasets import sample_batch

pytestmark = pytest.mark.service


def test_the_sweep_job_and_the_cli_give_the_same_rows(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lengths = sample_batch("lognormal", 6000, 3, 4096)
    options = {"time_limit_s": 30.0, "seed": 3}  # never reached: deterministic plans
    base = {"lengths": lengths, "num_gpus": 8, "model": "tiny", "gpu": "h100-sxm-80gb", "options": options}
    body = {"kind": "sweep", "base": {**base, "baselines": ["megatron"]}, "vary": {"num_gpus": [8, 16]}}
    with make_client() as client:
        accepted = client.post("/v1/jobs", json=body)
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["job_id"]
        view = wait_for(
            lambda: (v := client.get(f"/v1/jobs/{job_id}").json())["status"] in ("succeeded", "failed") and v,
            timeout_s=120,
        )
    assert view["status"] == "succeeded", view
    api_rows = [item["row"] for item in view["items"]]
    assert [item["plan"]["step_time_s"] for item in view["items"]] == [row["step_times_s"][0] for row in api_rows]

    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps(lengths))
    code = main([
        "whatif", "--model", "tiny", "--gpu", "h100-sxm-80gb", "--num-gpus", "8,16", "--dataset", f"batch:{batch}",
        "--context-cap", "none", "--seeds", "1", "--seed", "3", "--time-limit-s", "30", "--compare", "megatron",
        "--workers", "1", "--no-plots", "--json", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    cli_rows = json.loads(out)["rows"]
    assert len(cli_rows) == len(api_rows) == 2
    assert all(row["status"] == "ok" and row["speedups"] for row in cli_rows)
    assert sorted(cli_rows, key=lambda row: row["key"]) == sorted(api_rows, key=lambda row: row["key"])


def test_a_failed_sweep_item_has_a_row_with_its_reason() -> None:
    base = {"lengths": [4096, 1024, 512, 8192], "num_gpus": 1, "model": "tiny", "gpu": "a100-40gb"}
    body = {"kind": "sweep", "base": base, "vary": {"model": ["tiny", "llama3-70b"]}}
    with make_client() as client:
        job_id = client.post("/v1/jobs", json=body).json()["job_id"]
        view = wait_for(
            lambda: (v := client.get(f"/v1/jobs/{job_id}").json())["status"] in ("succeeded", "failed") and v,
            timeout_s=60,
        )
    ok, failed = view["items"]
    assert ok["row"]["status"] == "ok" and ok["row"]["tokens_per_s"] > 0
    assert failed["status"] == "failed" and failed["error"]["status"] == 422
    assert failed["row"]["status"] == "failed" and "does not fit" in failed["row"]["reason"]
