"""The `hydraplan` command line, run in-process through `api.cli.main` (and once as a script)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from hydraplan.api.cli import main
from hydraplan.cost_models.profile_io import load_profile

SNAPSHOT = Path(__file__).parent / "snapshots" / "cli_help.txt"
# Small and quick: the tiny model on one node, a 20K-token batch, a short budget.
TINY = ["--model", "tiny", "--num-gpus", "8", "--num-tokens", "20000", "--time-limit-s", "0.5"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str) -> str:
    """Exit code 2 and exactly one `hydraplan: error: ...` line; returns the message."""
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("hydraplan: error: ") and err.count("\n") == 1, err
    return err.removeprefix("hydraplan: error: ").strip()


def write(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------


def test_default_plan_then_check(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The README's first command (`hydraplan plan`), with --out, then `hydraplan check`."""
    plan_path = str(tmp_path / "plan.json")
    started = time.perf_counter()
    code, out, err = run(capsys, "plan", "--out", plan_path)
    elapsed_s = time.perf_counter() - started
    assert code == 0, err
    assert elapsed_s < 20
    for fact in (
        "llama3-8b on h100-sxm-80gb",
        "64 GPUs, 8 per node",
        "strategy",
        "step time",
        "lower bound",
        "gap",
        "pipeline",
        "micro-batches",
    ):
        assert fact in out, fact
    assert f"to {plan_path}" in err

    plan = json.loads(Path(plan_path).read_text())
    assert plan["num_gpus"] == 64 and plan["gpus_per_node"] == 8
    assert 1_000_000 <= sum(plan["input_lengths"]) < 1_000_000 + 32768
    assert max(plan["input_lengths"]) <= 32768

    code, out, err = run(capsys, "check", plan_path)
    assert code == 0, out + err
    assert out.startswith("plan OK: ")


def test_user_profile_and_lengths_file_json(
    capsys: pytest.CaptureFixture[str], user_profile_path: Path, lengths_path: Path
) -> None:
    options = "--num-gpus 64 --gpus-per-node 8 --json --time-limit-s 1".split()
    code, out, err = run(
        capsys,
        "plan",
        "--profile",
        str(user_profile_path),
        "--lengths",
        str(lengths_path),
        *options,
    )
    assert code == 0, err
    plan = json.loads(out)
    lengths = [int(line) for line in lengths_path.read_text().split()]
    assert plan["num_gpus"] == 64
    assert plan["input_lengths"] == lengths
    assert plan["step_time_s"] > 0 and 0 < plan["lower_bound_s"] <= plan["step_time_s"] * (1 + 1e-9)
    placed: list[int] = []
    all_ranks: list[int] = []
    for pipeline in plan["pipelines"]:
        assert set(pipeline["scheme"]) == {"tp", "pp", "cp"}
        scheme = pipeline["scheme"]
        assert len(pipeline["ranks"]) == scheme["tp"] * scheme["pp"] * scheme["cp"]
        all_ranks += pipeline["ranks"]
        for batch in pipeline["micro_batches"]:
            placed += batch["sequence_ids"]
    assert sorted(all_ranks) == list(range(64))
    assert set(placed) == set(range(len(lengths)))


def test_lengths_from_standard_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, user_profile_path: Path
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("[300, 5000, 12000, 800]"))
    options = "--num-gpus 16 --json --time-limit-s 0.5".split()
    code, out, err = run(capsys, "plan", "--profile", str(user_profile_path), "--lengths", "-", *options)
    assert code == 0, err
    assert json.loads(out)["input_lengths"] == [300, 5000, 12000, 800]


def test_tiny_model_sampled_dataset_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", *TINY, "--dataset", "lognormal", "--seed", "5")
    assert code == 0, err
    assert "tiny on h100-sxm-80gb" in out and "8 GPUs, 8 per node" in out
    assert "seed 5" in out


def test_compare_shows_every_baseline_or_the_chosen_ones(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", *TINY, "--compare")
    assert code == 0, err
    for name in ("megatron", "wlb", "flexsp", "hydraulis"):
        row = next(line for line in out.splitlines() if line.startswith(name))
        assert row.rstrip().endswith("x")
    code, out, err = run(capsys, "plan", *TINY, "--compare", "wlb", "--json")
    assert code == 0, err
    assert [baseline["name"] for baseline in json.loads(out)["baselines"]] == ["wlb"]
    code, _, err = run(capsys, "plan", *TINY, "--compare", "megatron,nope")
    assert "unknown baseline 'nope'" in assert_one_line_error(code, err)


def test_baseline_plan_is_printed_and_checks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    code, out, err = run(capsys, "plan", *TINY, "--baseline", "hydraulis", "--out", str(path), "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["solver"]["backend"] == "baseline:hydraulis"
    assert all(pipeline["scheme"]["cp"] == 1 for pipeline in plan["pipelines"])
    assert run(capsys, "check", str(path))[0] == 0
    # the text summary says whose bound it is: the baseline's own, not hydraplan's
    code, out, err = run(capsys, "plan", *TINY, "--baseline", "hydraulis")
    assert code == 0, err
    assert "(hydraulis's own, over the schemes it chose; gap " in out


def test_previous_plan_file_sets_the_previous_strategy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "previous.json"
    assert run(capsys, "plan", *TINY, "--baseline", "megatron", "--out", str(path), "--json")[0] == 0
    previous = json.loads(path.read_text())["strategy"]
    code, out, err = run(capsys, "plan", *TINY, "--previous-plan", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["previous_strategy"] == previous
    code, _, err = run(capsys, "plan", *TINY, "--previous-plan", write(tmp_path, "bad.json", "{}"))
    assert "not a valid plan" in assert_one_line_error(code, err)


def test_strategies_refuses_more_batches_than_its_limit_or_its_budget_can_take(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 100,000 sample batches under --budget-s 1 ran for hours (0.05 s of search per batch at least,
    # and every candidate solved on every batch): both are refused before anything is sampled
    base = ["strategies", "--model", "tiny", "--num-gpus", "8"]
    code, _, err = run(capsys, *base, "--num-batches", "100000", "--budget-s", "1")
    assert assert_one_line_error(code, err) == "--num-batches 100000: at most 256 sample batches"
    code, _, err = run(capsys, *base, "--num-batches", "100", "--budget-s", "1")
    message = assert_one_line_error(code, err)
    assert message == "--budget-s 1 for 100 sample batches: at least 6.67 s (raise it, or lower --num-batches)"


def test_strategies_pool_then_plan_within_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pool_path = tmp_path / "pool.json"
    code, out, err = run(
        capsys,
        "strategies",
        "--model",
        "tiny",
        "--num-gpus",
        "8",
        "--num-tokens",
        "20000",
        "--num-batches",
        "3",
        "--pool-size",
        "2",
        "--budget-s",
        "3",
        "--out",
        str(pool_path),
    )
    assert code == 0, err
    assert "expected step time with the pool" in out
    pool = json.loads(pool_path.read_text())
    assert pool["schema_version"] == "hydraplan.pool/1" and 1 <= len(pool["strategies"]) <= 2
    code, out, err = run(capsys, "plan", *TINY, "--strategy-pool", str(pool_path), "--json")
    assert code == 0, err
    assert json.loads(out)["strategy"] in pool["strategies"]
    lines_pool = write(tmp_path, "pool.txt", "# one per line\n8x<1,1,1>\n")
    code, out, err = run(capsys, "plan", *TINY, "--strategy-pool", lines_pool, "--json")
    assert code == 0, err
    assert json.loads(out)["strategy"] == "8x<1,1,1>"
    code, _, err = run(capsys, "plan", *TINY, "--strategy-pool", write(tmp_path, "empty.txt", "\n"))
    assert "no strategies" in assert_one_line_error(code, err)
    code, _, err = run(capsys, "plan", *TINY, "--strategy-pool", write(tmp_path, "bad.txt", "eight\n"))
    assert "strategy_pool[0]" in assert_one_line_error(code, err)


def test_same_request_and_seed_give_the_same_plan(capsys: pytest.CaptureFixture[str]) -> None:
    # a budget far above what the work limits take here (~0.4 s of CPU): the clock cuts nothing, even
    # at load 15 on a 2-core host (where a 5 s budget was cut)
    reproducible = [*TINY[:-1], "120"]
    first = run(capsys, "plan", *reproducible, "--json")[1]
    second = run(capsys, "plan", *reproducible, "--json")[1]
    assert json.loads(first)["solver"]["cut_by_clock"] is False
    assert first == second


@pytest.mark.parametrize("backend", ["greedy", "lp"])
def test_solver_backend_is_passed_through(capsys: pytest.CaptureFixture[str], backend: str) -> None:
    code, out, err = run(capsys, "plan", *TINY, "--solver", backend, "--json")
    assert code == 0, err
    assert json.loads(out)["solver"]["backend"] == backend


def test_previous_strategy_is_planned_against(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", *TINY, "--previous-strategy", "1x<2,4,1>", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["previous_strategy"] == "1x<2,4,1>"
    assert plan["objective_s"] == pytest.approx(plan["step_time_s"] + plan["switch_cost_s"])
    code, _, err = run(capsys, "plan", *TINY, "--previous-strategy", "garbage")
    assert assert_one_line_error(code, err).startswith("--previous-strategy garbage: ")


@pytest.mark.parametrize("policy", ["split", "drop"])
def test_oversize_split_and_drop(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, user_profile_path: Path, policy: str
) -> None:
    lengths = write(tmp_path, "L.txt", "1000\n100000\n2000\n")  # 100000 > every capacity (65536)
    options = f"--num-gpus 16 --oversize {policy} --json --time-limit-s 0.5".split()
    code, out, err = run(capsys, "plan", "--profile", str(user_profile_path), "--lengths", lengths, *options)
    assert code == 0, err
    plan = json.loads(out)
    assert plan[f"{'split' if policy == 'split' else 'dropped'}_sequence_ids"] == [1]


def test_a_sequence_beyond_the_measured_range_is_noted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile = str(Path(__file__).resolve().parents[1] / "cost_models" / "data" / "tiny-cpu.json")  # to 3,072
    options = ["--num-gpus", "2", "--time-limit-s", "0.3"]
    code, _, err = run(
        capsys, "plan", "--profile", profile, "--lengths", write(tmp_path, "L.txt", "4000\n200\n"), *options
    )
    assert code == 0, err
    assert "the longest sequence (4,000 tokens) is longer than any the profile measured (3,072)" in err
    code, _, err = run(
        capsys, "plan", "--profile", profile, "--lengths", write(tmp_path, "S.txt", "3000\n200\n"), *options
    )
    assert code == 0 and "longer than any the profile measured" not in err


# ---------------------------------------------------------------------------------------------
# Bad input: exit 2, one line, no traceback
# ---------------------------------------------------------------------------------------------

BAD_PROFILE = {
    "time_unit": "ms",
    "num_layers": 4,
    "schemes": [{"tp": 1, "pp": 1, "b": 0.1, "capacity_tokens": 4096}],
}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("empty", "no lengths"),
        ("zero", "line 2: length 0 must be >= 1"),
        ("negative", "line 1: length -4 must be >= 1"),
        ("non-integer", "line 3: 'abc' is not an integer"),
        ("json-float", "index 1: 3.5 is not an integer"),
        ("missing-file", "missing.txt"),
        ("unknown-model", "unknown model 'gpt-9'; valid names:"),
        ("unknown-gpu", "unknown gpu 'tpu-v9'; valid names:"),
        ("too-big", "does not fit"),
        ("malformed-profile", "schemes[0].a"),
        ("profile-not-json", "not valid JSON"),
        ("uneven-cluster", "--num-gpus 12: not a multiple of --gpus-per-node 8"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    user_profile_path: Path,
    case: str,
    expected: str,
) -> None:
    profile = ["--profile", str(user_profile_path), "--num-gpus", "16"]
    lengths_text = {
        "empty": "\n",
        "zero": "5\n0\n",
        "negative": "-4\n",
        "non-integer": "1\n2\nabc\n",
        "json-float": "[1, 3.5]",
    }
    if case in lengths_text:
        argv = [*profile, "--lengths", write(tmp_path, "L.txt", lengths_text[case])]
    else:
        argv = {
            "missing-file": [*profile, "--lengths", str(tmp_path / "missing.txt")],
            "unknown-model": ["--model", "gpt-9"],
            "unknown-gpu": ["--gpu", "tpu-v9"],
            "too-big": "--model llama3-70b --gpu a100-40gb --num-gpus 1 --gpus-per-node 1".split(),
            "malformed-profile": [
                "--profile",
                write(tmp_path, "bad.json", json.dumps(BAD_PROFILE)),
            ],
            "profile-not-json": ["--profile", write(tmp_path, "garbage.json", "{not json")],
            "uneven-cluster": [
                *("--profile", str(user_profile_path)),
                *"--num-gpus 12 --num-tokens 20000".split(),
            ],
        }[case]
    code, _, err = run(capsys, "plan", "--time-limit-s", "0.5", *argv)
    message = assert_one_line_error(code, err)
    assert expected in message
    if case.startswith("unknown-"):
        assert ("llama3-8b" if case == "unknown-model" else "h100-sxm-80gb") in message


def test_oversize_error_says_how_many_and_the_largest_capacity(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, user_profile_path: Path
) -> None:
    lengths = write(tmp_path, "L.txt", "1000\n100000\n70000\n")
    profile = str(user_profile_path)
    code, _, err = run(capsys, "plan", "--profile", profile, "--lengths", lengths, "--num-gpus", "16")
    message = assert_one_line_error(code, err)
    assert "2" in message and ("65536" in message or "65,536" in message), message


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--num-gpus", "0")
    assert code == 2 and "--num-gpus: '0' must be >= 1" in err and "Traceback" not in err
    code, _, err = run(capsys, "plan", "--oversize", "ignore")
    assert code == 2 and "invalid choice: 'ignore'" in err
    code, _, err = run(capsys)
    assert code == 2 and "required" in err


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------


def _halve_step_time(plan: dict) -> None:
    plan["step_time_s"] /= 2


def _forget_a_sequence(plan: dict) -> None:
    batch = next(b for p in plan["pipelines"] for b in p["micro_batches"] if b["sequence_ids"])
    for field in ("sequence_ids", "lengths", "offsets"):
        batch[field].pop()


@pytest.mark.parametrize("tamper", [_halve_step_time, _forget_a_sequence])
def test_check_rejects_a_tampered_plan(capsys: pytest.CaptureFixture[str], tiny_plan_path: Path, tamper) -> None:
    plan = json.loads(tiny_plan_path.read_text())
    tamper(plan)
    tiny_plan_path.write_text(json.dumps(plan))
    code, out, err = run(capsys, "check", str(tiny_plan_path))
    assert code == 1, out + err
    assert out.startswith("plan INVALID: ")
    assert len(out.splitlines()) >= 2  # the violations are listed


def test_check_with_an_explicit_profile(
    capsys: pytest.CaptureFixture[str], tiny_plan_path: Path, tmp_path: Path
) -> None:
    profile_path = tmp_path / "profile.json"
    assert (
        run(
            capsys,
            "profile",
            "--analytic",
            "--model",
            "tiny",
            "--num-gpus",
            "8",
            "--out",
            str(profile_path),
        )[0]
        == 0
    )
    code, out, err = run(capsys, "check", str(tiny_plan_path), "--profile", str(profile_path))
    assert code == 0, out + err


def test_check_against_the_request_and_its_profile(
    capsys: pytest.CaptureFixture[str], tiny_plan_path: Path, tmp_path: Path
) -> None:
    """--request: the plan must answer it; with --profile (the profile it was planned with) its
    request_hash must be the hash of the two. An edited request or request_hash is named."""
    plan = json.loads(tiny_plan_path.read_text())
    request = {"lengths": list(plan["input_lengths"]), "num_gpus": 8, "options": {"time_limit_s": 0.5}}
    request_path, profile_path = tmp_path / "request.json", tmp_path / "profile.json"
    request_path.write_text(json.dumps(request))
    assert (
        run(capsys, "profile", "--analytic", "--model", "tiny", "--num-gpus", "8", "--out", str(profile_path))[0] == 0
    )
    code, out, err = run(
        capsys, "check", str(tiny_plan_path), "--request", str(request_path), "--profile", str(profile_path)
    )
    assert code == 0, out + err

    request["lengths"][3] += 1
    request_path.write_text(json.dumps(request))
    code, out, _ = run(capsys, "check", str(tiny_plan_path), "--request", str(request_path))
    assert code == 1 and f"sequence 3: the plan has length {plan['input_lengths'][3]}" in out, out
    request["lengths"][3] -= 1
    request_path.write_text(json.dumps(request))
    plan["request_hash"] = "rq-00000000000000000000"
    tiny_plan_path.write_text(json.dumps(plan))
    code, out, _ = run(
        capsys, "check", str(tiny_plan_path), "--request", str(request_path), "--profile", str(profile_path)
    )
    assert code == 1 and "request_hash 'rq-00000000000000000000' is not the hash of the request and profile" in out, out


def test_check_refuses_a_request_file_that_is_not_one(capsys: pytest.CaptureFixture[str], tiny_plan_path: Path) -> None:
    code, _, err = run(capsys, "check", str(tiny_plan_path), "--request", str(tiny_plan_path))
    assert assert_one_line_error(code, err) == f"{tiny_plan_path} is a plan, not a plan request"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "No such file"),
        ("{oops", "not a valid plan"),
        ("{}", "not a valid plan"),
        ('{"schema_version": "hydraplan.plan/9"}', "schema_version"),
    ],
)
def test_check_unreadable_plan_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str | None, expected: str
) -> None:
    path = tmp_path / "plan.json"
    if text is not None:
        path.write_text(text)
    code, _, err = run(capsys, "check", str(path))
    assert expected in assert_one_line_error(code, err)


# ---------------------------------------------------------------------------------------------
# schemes, profile, serve
# ---------------------------------------------------------------------------------------------


def test_schemes_from_the_catalog_and_from_a_profile(
    capsys: pytest.CaptureFixture[str], user_profile_path: Path
) -> None:
    code, out, err = run(capsys, "schemes", "--model", "tiny", "--num-gpus", "8")
    assert code == 0, err
    assert out.startswith("cost profile: analytic, tiny on h100-sxm-80gb")
    assert "<1,1,1>" in out and "capacity tokens" in out
    code, out, err = run(capsys, "schemes", "--profile", str(user_profile_path))
    assert code == 0, err
    assert "<4,2,1>" in out and "30,000" in out


def test_profile_analytic_round_trips_and_plans(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    code, _, err = run(capsys, "profile", "--analytic", "--model", "tiny", "--num-gpus", "8", "--out", str(path))
    assert code == 0, err
    profile = load_profile(path)
    assert profile.source == "analytic" and profile.model == "tiny"
    options = "--num-gpus 8 --num-tokens 20000 --time-limit-s 0.5".split()
    code, out, err = run(capsys, "plan", "--profile", str(path), *options)
    assert code == 0, err
    code, out, _ = run(capsys, "profile", "--analytic", "--model", "tiny", "--num-gpus", "8")
    assert code == 0 and json.loads(out)["model"] == "tiny"


def test_profile_needs_analytic(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "profile", "--out", "p.json")
    assert code == 2 and "--analytic" in err


def test_serve_without_the_service_extra(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # makes `import hydraplan.api.service.server` fail
    monkeypatch.setitem(sys.modules, "hydraplan.api.service.server", None)
    code, _, err = run(capsys, "serve", "--port", "8123")
    message = assert_one_line_error(code, err)
    assert "the service extra is not installed: pip install 'hydraplan[service]'" in message


def test_serve_passes_host_port_and_workers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int, int]] = []
    fake_server = types.SimpleNamespace(run=lambda *args: calls.append(args))
    monkeypatch.setitem(sys.modules, "hydraplan.api.service.server", fake_server)
    code, _, err = run(capsys, "serve", "--host", "0.0.0.0", "--port", "9001", "--workers", "3")
    assert code == 0, err
    code, _, err = run(capsys, "serve", "--root-path", "/api")
    assert code == 0, err
    assert calls == [("0.0.0.0", 9001, 3, ""), ("127.0.0.1", 8000, 1, "/api")]


@pytest.mark.parametrize(
    "flags",
    [
        ["check", "{file}"],
        ["show", "{file}"],
        ["plan", *TINY, "--previous-plan", "{file}"],
        ["plan", "--model", "tiny", "--num-gpus", "8", "--lengths", "{file}"],
        ["plan", *TINY, "--models-file", "{file}"],
        ["plan", *TINY, "--gpus-file", "{file}"],
        ["plan", "--profile", "{file}", "--num-gpus", "8", "--num-tokens", "2000"],
    ],
)
def test_json_nested_deeper_than_the_parser_recurses_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str]
) -> None:
    # json.loads raises RecursionError, not JSONDecodeError, on 100,000 nested arrays: it was a
    # traceback (exit 1) from every file reader; now one line naming the file, exit 2
    path = write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000)
    message = assert_one_line_error(*run(capsys, *[flag.format(file=path) for flag in flags])[::2])
    assert message.startswith(f"{path}: not a valid") and "maximum recursion depth exceeded" in message


@pytest.mark.parametrize("command", [["plan", *TINY], ["serve"]])
def test_more_worker_processes_than_the_cores_allow_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    # 100,000 asked of `plan --workers` once forked until the machine hung: above 4 per usable core
    # the flag is refused before any process starts, naming the value and the limit
    import hydraplan.api.cli.args as args_module

    monkeypatch.setattr(args_module, "usable_cores", lambda: 2)
    monkeypatch.setitem(sys.modules, "hydraplan.api.service.server", types.SimpleNamespace(run=lambda *a: None))
    message = assert_one_line_error(*run(capsys, *command, "--workers", "100000")[::2])
    assert message == "argument --workers: '100000' processes: at most 8 here (4 per core, 2 usable)"
    message = assert_one_line_error(*run(capsys, *command, "--workers", "9")[::2])
    assert "'9' processes: at most 8 here" in message


def test_the_cli_does_not_import_fastapi() -> None:
    probe = "import sys, hydraplan.api.cli; print('fastapi' in sys.modules, 'uvicorn' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False False"


# ---------------------------------------------------------------------------------------------
# The CLI surface (snapshot) and the installed script
# ---------------------------------------------------------------------------------------------

HELP_COMMANDS = [
    [],
    ["plan"],
    ["strategies"],
    ["check"],
    ["show"],
    ["schemes"],
    ["profile"],
    ["models"],
    ["gpus"],
    ["schema"],
    ["whatif"],
    ["serve"],
    ["run"],
    ["data"],
    ["data", "convert"],
    ["data", "lengths"],
    ["data", "info"],
]


def test_cli_help_snapshot(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Interface changes are deliberate: regenerate with UPDATE_SNAPSHOTS=1."""
    monkeypatch.setenv("COLUMNS", "100")
    parts = []
    for command in HELP_COMMANDS:
        code, out, _ = run(capsys, *command, "--help")
        assert code == 0
        parts.append(f"$ hydraplan {' '.join([*command, '--help'])}\n{out}")
    text = "\n".join(parts)
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(text, encoding="utf-8")
    assert text == SNAPSHOT.read_text(encoding="utf-8"), (
        "the CLI surface changed; if on purpose, rerun with UPDATE_SNAPSHOTS=1"
    )


@pytest.mark.skipif(shutil.which("hydraplan") is None, reason="the hydraplan script is not on PATH")
def test_installed_console_script() -> None:
    result = subprocess.run(["hydraplan", "plan", *TINY], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "strategy" in result.stdout and "tiny on h100-sxm-80gb" in result.stdout


def test_a_closed_stdout_ends_quietly() -> None:
    """`hydraplan plan --json | head -1`: no traceback, no error line, exit 141 (SIGPIPE)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hydraplan.api.cli", "plan", *TINY, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader goes away before the plan is written
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert stderr == ""


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("hydraplan ")


def test_readme_setup_commands_match_ci() -> None:
    """The README's set-up section has exactly two commands; CI runs the second one verbatim, in
    the fresh virtual environment it creates and activates first."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    section = readme.split("## ")[1]
    assert section.startswith("Set up")
    commands = [block.split("```")[0].strip() for block in section.split("```\n")[1::2]]
    assert commands == [
        "pip install . && hydraplan plan",
        'pip install -e ".[test]" && python -m pytest -q',
    ]
    ci_lines = (root / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[1] in ci_lines
    fresh = ci_lines.index("python3 -m venv --clear .ci-venv")
    assert fresh < ci_lines.index("source .ci-venv/bin/activate") < ci_lines.index(commands[1])


@pytest.mark.parametrize("prefix", ["api", "/api/"])
def test_serve_refuses_a_malformed_root_path(capsys: pytest.CaptureFixture[str], prefix: str) -> None:
    code, _, err = run(capsys, "serve", "--root-path", prefix)
    assert code == 2
    assert f"--root-path {prefix!r}: give a path like /api" in err and "Traceback" not in err
