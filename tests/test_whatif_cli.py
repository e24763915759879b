"""`hydraplan whatif` on the command line: bad input refused in one line before any work, a small
sweep end to end, spec files, Ctrl-C keeping finished rows and --resume continuing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from whatif_support import TINY_FLAGS, comparable, tiny_configurations

from hydraplan.api.cli import main
from hydraplan.api.whatif.engine import evaluate_row
from hydraplan.api.whatif.schemas import WhatifRow
from hydraplan.api.whatif.spec import build_spec, expand, read_spec_file


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["whatif", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> str:
    """Exit 2, one `hydraplan: error:` line, and nothing written (refused before any work)."""
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, *argv, "--out", str(out_dir), "--workers", "1")
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("hydraplan: error: ") and err.count("\n") == 1, err
    assert not out_dir.exists()
    return err.removeprefix("hydraplan: error: ").strip()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--model", "tiny,gpt-9"], "--model 'gpt-9': unknown; valid: "),
        (["--gpu", "h100-sxm-80gb,tpu"], "--gpu 'tpu': unknown"),
        (["--dataset", "imagenet"], "--dataset 'imagenet': unknown dataset"),
        (["--compare", "megatron,deepspeed"], "--compare 'deepspeed': unknown"),
        (["--planner", "hydraplan:magic"], "--planner 'hydraplan:magic': unknown"),
        (["--cost-source", "measured"], "--cost-source 'measured': unknown cost source"),
        (["--num-gpus", ""], "--num-gpus: empty axis"),
        (["--model", ","], "--model: empty axis"),
        (["--num-gpus", "8,8"], "--num-gpus: [8, 8] repeats a value"),
        (["--num-gpus", "12"], "--num-gpus 12: not a whole number of nodes of --gpus-per-node 8"),
        (["--num-gpus", "eight"], "--num-gpus 'eight': not an integer"),
        (["--num-gpus", "8,,16"], "--num-gpus '8,,16': an empty value between commas"),
        (["--tokens-per-step", "32k,"], "--tokens-per-step '32k,': an empty value between commas"),
        (["--model", "tiny,,llama3-8b"], "--model 'tiny,,llama3-8b': an empty value between commas"),
        (["--price-per-gpu-hour", "a=1,,b=2"], "--price-per-gpu-hour 'a=1,,b=2': an empty value between commas"),
        (["--context-cap", "0"], "--context-cap: 0 must be >= 1 (or none)"),
        (["--time-limit-s", "-1"], "--time-limit-s '-1': must be > 0"),
        (["--num-gpus", "8,16", "--max-configurations", "1"], "the sweep has 2 configurations"),
        (["--gpu", "h100-sxm-80gb,a100-80gb", "--price-per-gpu-hour", "h100-sxm-80gb=2"], "no price for GPU type"),
        (["--budget-per-hour", "10"], "--price-per-gpu-hour: no price for GPU type 'h100-sxm-80gb'"),
        (["--price-per-gpu-hour", "h100=abc"], "--price-per-gpu-hour 'abc': not a number"),
        (["--dataset", "batch:/nonexistent/lengths.txt"], "/nonexistent/lengths.txt: No such file or directory"),
        (["--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: only used with --executor ray"),
    ],
)
def test_bad_input_is_one_line_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], expected: str
) -> None:
    message = refused(capsys, tmp_path, "--model", "tiny", "--num-gpus", "8", *argv)
    assert expected in message, message


def test_a_sweep_over_the_limit_names_yes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    message = refused(capsys, tmp_path, "--num-gpus", "8,16,32", "--max-configurations", "2")
    assert "3 configurations (9 planned steps), over the limit of 2 (--max-configurations); add --yes" in message


def test_an_unreachable_ray_address_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'hydraplan[whatif]')")
    port = closed_port()
    message = refused(capsys, tmp_path, "--executor", "ray", "--ray-address", f"127.0.0.1:{port}")
    assert message.startswith(f"--ray-address 127.0.0.1:{port}: cannot reach 127.0.0.1:{port}")


def test_a_bad_spec_file_names_the_file_and_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = tmp_path / "study.yaml"
    spec.write_text("models: [tiny]\nnum_gpu: [8]\n")
    assert refused(capsys, tmp_path, "--spec", str(spec)) == f"{spec}: num_gpu: Extra inputs are not permitted"
    spec.write_text("models: [tiny]\nseeds: many\n")
    assert refused(capsys, tmp_path, "--spec", str(spec)).startswith(f"{spec}: seeds: Input should be a valid integer")
    spec.write_text("models: []\n")
    assert refused(capsys, tmp_path, "--spec", str(spec)) == f"{spec}: models: empty axis; give at least one value"
    spec.write_text("models: [tiny\n")
    assert refused(capsys, tmp_path, "--spec", str(spec)).startswith(f"{spec}: not a valid spec file: ")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("study.yaml", "num_gpus: [64, 8k]\ncontext_caps: [32k, none]\ntokens_per_step: 1M,2_000_000\n"),
        ("study.toml", 'num_gpus = "64,8k"\ncontext_caps = ["32K", "null"]\ntokens_per_step = ["1m", 2000000]\n'),
        ("study.json", '{"num_gpus": [64, "8k"], "context_caps": "32k,none", "tokens_per_step": ["1M", "2_000_000"]}'),
    ],
)
def test_spec_files_take_the_values_the_flags_take(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    from_file, _ = build_spec(read_spec_file(str(path)), {}, str(path))
    flags = {"num_gpus": "64,8k", "context_caps": "32k,none", "tokens_per_step": "1M,2_000_000"}
    from_flags, _ = build_spec({}, flags, None)
    assert from_file.num_gpus == from_flags.num_gpus == [64, 8192]
    assert from_file.context_caps == from_flags.context_caps == [32768, None]
    assert from_file.tokens_per_step == from_flags.tokens_per_step == [1_000_000, 2_000_000]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('num_gpus: "64,,128"\n', "num_gpus '64,,128': an empty value between commas"),
        ("models: tiny,,llama3-8b\n", "models 'tiny,,llama3-8b': an empty value between commas"),
        ("context_caps: [32k, 4q]\n", "context_caps '4q': not an integer (or none)"),
    ],
)
def test_a_spec_file_refuses_what_the_flags_refuse(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expected: str
) -> None:
    spec = tmp_path / "study.yaml"
    spec.write_text(text)
    assert refused(capsys, tmp_path, "--spec", str(spec)) == f"{spec}: {expected}"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("study.yaml", "models: tiny\nnum_gpus: [8, 16]\ndatasets: lognormal\ncontext_caps: [4096]\n"),
        ("study.toml", 'models = "tiny"\nnum_gpus = [8, 16]\ndatasets = ["lognormal"]\ncontext_caps = [4096]\n'),
        ("study.json", '{"models": ["tiny"], "num_gpus": [8, 16], "datasets": "lognormal", "context_caps": [4096]}'),
    ],
)
def test_spec_files_in_every_format_give_the_flags_configurations(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    flags = {"tokens_per_step": [6000], "seeds": 2, "time_limit_s": 30.0, "compare": ["megatron", "wlb"]}
    spec, where = build_spec(read_spec_file(str(path)), flags, str(path))
    assert expand(spec, where, 100, False) == tiny_configurations()


def test_a_small_sweep_end_to_end(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_dir = tmp_path / "study"
    code, out, err = run(
        capsys, *TINY_FLAGS, "--workers", "1", "--out", str(out_dir), "--price-per-gpu-hour", "2.5",
        "--target-tokens-per-s", "1", "--budget-per-hour", "1000", "--json",
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    rows = [WhatifRow.model_validate(row) for row in document["rows"]]
    expected = [evaluate_row(i, c) for i, c in enumerate(tiny_configurations())]
    unpriced = [
        row.model_copy(update=dict.fromkeys(("price_per_gpu_hour", "cost_per_hour", "cost_per_1m_tokens")))
        for row in rows
    ]  # noqa: E501
    assert comparable(unpriced) == comparable(expected)
    assert all(row.cost_per_hour == 2.5 * row.num_gpus for row in rows)
    assert [answer["row_index"] for answer in document["answers"]] == [0, max(rows, key=lambda r: r.tokens_per_s).index]
    for name in ("rows.csv", "rows.json", "memory.csv", "report.html", "plots/throughput.png", "plots/cost.svg"):
        assert (out_dir / name).stat().st_size > 0, name
    code, out, err = run(capsys, *TINY_FLAGS, "--workers", "1", "--out", str(out_dir), "--no-plots")
    assert code == 2 and "add --resume" in err
    code, out, err = run(capsys, *TINY_FLAGS, "--workers", "1", "--out", str(out_dir), "--resume", "--no-plots")
    assert code == 0 and "2 of 2 rows finished, computing 0" in err
    assert "tiny" in out and "hydraplan" in out  # the text table


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])  # in process, and the local process pool
def test_ctrl_c_keeps_finished_rows_and_resume_continues(tmp_path: Path, workers: str) -> None:
    """A real interrupt (SIGINT to the command): exit 130, the finished rows kept, --resume computes
    only the rest and leaves the kept lines as they were."""
    out_dir = tmp_path / "study"
    argv = [sys.executable, "-m", "hydraplan.api.cli", "whatif", *TINY_FLAGS, "--num-gpus", "8,16,32,64"]
    # four batches a row: at load 15 on 2 cores a sweep of one-batch rows ended before the signal arrived
    argv += ["--seeds", "4", "--workers", workers, "--no-plots", "--out", str(out_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    rows_path = out_dir / "rows.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (rows_path.exists() and rows_path.read_text().count("\n") >= 1):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    kept = rows_path.read_text().splitlines()
    if process.returncode == 0:  # finished before the signal arrived: nothing to resume
        pytest.fail(f"the sweep finished before it could be interrupted: {err}")
    assert process.returncode == 130, err
    assert f"interrupted: {len(kept)} of 4 rows kept" in err and "Traceback" not in err
    assert 1 <= len(kept) < 4
    resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(kept)} of 4 rows finished, computing {4 - len(kept)}" in resumed.stderr
    lines = rows_path.read_text().splitlines()
    assert lines[: len(kept)] == kept and len(lines) == 4
    assert sorted(json.loads(line)["num_gpus"] for line in lines) == [8, 16, 32, 64]


def test_missing_matplotlib_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    message = refused(capsys, tmp_path, "--model", "tiny", "--num-gpus", "8")
    assert message == "the figures need matplotlib: pip install 'hydraplan[whatif]' (or add --no-plots)"


def test_missing_jinja2_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "jinja2" else real_find_spec(name, *a)
    )
    message = refused(capsys, tmp_path, "--model", "tiny", "--num-gpus", "8", "--no-plots")
    assert message == "the HTML report needs jinja2: pip install 'hydraplan[whatif]'"


def test_yes_runs_a_sweep_over_the_limit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = [*TINY_FLAGS, "--seeds", "1", "--workers", "1", "--no-plots", "--max-configurations", "1", "--yes"]
    code, out, err = run(capsys, *argv, "--out", str(tmp_path / "study"), "--json")
    assert code == 0, err
    assert [row["num_gpus"] for row in json.loads(out)["rows"]] == [8, 16]


def test_more_local_worker_processes_than_the_cores_allow_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # above 4 per usable core the local pool is refused before the sweep starts (nothing written);
    # a Ray cluster's workers are its own
    import hydraplan.api.cli.args as args_module

    monkeypatch.setattr(args_module, "usable_cores", lambda: 2)
    out_dir = tmp_path / "sweep"
    code, _, err = run(capsys, *TINY_FLAGS, "--workers", "9", "--no-plots", "--out", str(out_dir))
    assert code == 2 and "Traceback" not in err, err
    assert "--workers 9: at most 8 local processes here (4 per core, 2 usable)" in err
    assert not out_dir.exists()
