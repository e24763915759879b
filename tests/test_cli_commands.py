"""`plan --compare` with a baseline that cannot plan, progress lines, the `models` and `gpus`
catalog commands, and a `hydraplan --help` that imports no solver."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import TINY, assert_one_line_error, run, write

from hydraplan.api.cli.progress import Progress
from hydraplan.api.render.plan_text import render_plan
from hydraplan.planner.baselines import BASELINES
from hydraplan.planner.errors import PlanningError
from hydraplan.planner.schemas import PlanRequest
from hydraplan.planner.solve import solve

# Only context-parallel schemes: hydraulis (cp == 1 only) cannot plan, the others can.
CP_ONLY_PROFILE = {
    "time_unit": "ms",
    "num_layers": 32,
    "grad_sync_s": 40.0,
    "schemes": [
        {"tp": 1, "pp": 1, "cp": 2, "a": 1.1e-6, "b": 0.065, "c": 1.0, "capacity_tokens": 16384},
        {"tp": 2, "pp": 1, "cp": 2, "a": 6.0e-7, "b": 0.035, "c": 1.0, "capacity_tokens": 32768},
    ],
}
HYDRAULIS_REASON = "no scheme of the profile with cp == 1 fits 8 GPUs"


@pytest.fixture
def cp_only(tmp_path: Path) -> list[str]:
    """`plan` flags for a batch on the CP-only profile."""
    profile = write(tmp_path, "cp_only.json", json.dumps(CP_ONLY_PROFILE))
    lengths = write(tmp_path, "L.txt", "\n".join(str(600 + 37 * i) for i in range(40)) + "\n")
    return ["--profile", profile, "--lengths", lengths, "--num-gpus", "8", "--time-limit-s", "0.5"]


# ---------------------------------------------------------------------------------------------
# plan --compare: one baseline failing loses neither the plan nor the other baselines
# ---------------------------------------------------------------------------------------------


def test_compare_reports_a_failing_baseline_as_a_row(capsys: pytest.CaptureFixture[str], cp_only: list[str]) -> None:
    code, out, err = run(capsys, "plan", *cp_only, "--compare")
    assert code == 0, err
    assert "strategy" in out and "step time" in out  # hydraplan's own plan
    for name in ("megatron", "wlb", "flexsp"):
        row = next(line for line in out.splitlines() if line.startswith(name))
        assert row.rstrip().endswith("x"), row
    failed = [line for line in out.splitlines() if line.startswith("hydraulis")]
    assert failed == [f"hydraulis  could not plan: {HYDRAULIS_REASON}"]


def test_compare_json_keeps_the_plan_and_warns_on_stderr(
    capsys: pytest.CaptureFixture[str], cp_only: list[str]
) -> None:
    code, out, err = run(capsys, "plan", *cp_only, "--compare", "hydraulis,megatron", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert [baseline["name"] for baseline in plan["baselines"]] == ["megatron"]
    assert err == f"hydraplan: baseline hydraulis could not plan: {HYDRAULIS_REASON}\n"


def test_an_unexpected_baseline_error_is_a_row_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(request, profile):
        raise RuntimeError("index out of range\nin the packing")

    monkeypatch.setitem(BASELINES, "wlb", broken)
    code, out, err = run(capsys, "plan", *TINY, "--compare")
    assert code == 0, err
    assert "wlb  could not plan: internal error: RuntimeError: index out of range in the packing" in out
    assert sum(line.rstrip().endswith("x") for line in out.splitlines()) == 5  # the other five


def test_compare_accepts_the_interleaved_baselines_and_prices_their_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    """`--compare megatron-vpp,wlb-vpp` plans both; the analytic profile then prices the chunk
    counts of the model's recipe (Llama 3 8B: 4 at pp 2, 2 at pp 4), and only then."""
    import argparse

    from hydraplan.api.cli.plan import recipe_counts

    argv = ["--model", "llama3-8b", "--num-gpus", "16", "--num-tokens", "60000", "--time-limit-s", "0.3"]
    code, out, err = run(capsys, "plan", *argv, "--compare", "megatron-vpp,wlb-vpp", "--json")
    assert code == 0, err
    assert [baseline["name"] for baseline in json.loads(out)["baselines"]] == ["megatron-vpp", "wlb-vpp"]
    args = argparse.Namespace(model="llama3-8b", models_file=None, num_gpus=16, baseline=None, profile=None)
    assert recipe_counts(args, ("megatron", "wlb-vpp")) == [2, 4]
    assert recipe_counts(args, ("megatron", "wlb")) == []
    assert recipe_counts(argparse.Namespace(**{**vars(args), "baseline": "megatron-vpp"}), ()) == [2, 4]
    code, _, err = run(capsys, "plan", *argv, "--compare", "megatron-pp")
    assert "unknown baseline 'megatron-pp' in --compare; valid: " in assert_one_line_error(code, err)


def test_solve_reports_a_baseline_that_cannot_plan(tmp_path: Path) -> None:
    """The planner's own baseline loop (used by the REST API) keeps the plan, and lists the
    baseline that could not plan with its reason."""
    from hydraplan.cost_models.profile_io import load_profile

    profile = load_profile(CP_ONLY_PROFILE)
    request = PlanRequest(lengths=[600 + 37 * i for i in range(40)], num_gpus=8)
    plan = solve(request, profile, baselines=("megatron", "hydraulis"))
    megatron, hydraulis = plan.baselines
    assert megatron.name == "megatron" and megatron.error is None and megatron.speedup > 0
    assert hydraulis.name == "hydraulis" and hydraulis.strategy is None
    assert hydraulis.error == "hydraulis: no scheme of the profile with cp == 1 fits 8 GPUs"
    assert "could not plan: hydraulis: no scheme" in render_plan(plan)
    with pytest.raises(PlanningError, match="unknown baseline 'nope'"):
        solve(request, profile, baselines=("nope",))


# ---------------------------------------------------------------------------------------------
# Progress: standard error only, never in --json output
# ---------------------------------------------------------------------------------------------


class TerminalStderr(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_lines_go_to_stderr_and_json_stays_parseable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", *TINY, "--compare", "megatron", "--progress", "--json")
    assert code == 0, err
    assert json.loads(out)["baselines"][0]["name"] == "megatron"
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert (
        lines[0].startswith("hydraplan: planning ")
        and "sequences" in lines[0]
        and "on 8 GPUs, budget 0.5 s" in lines[0]
    )
    assert lines[0].endswith(" s") and " ... done in " in lines[0]
    assert lines[1].startswith("hydraplan: baseline megatron ... done in ")


def test_progress_defaults_to_a_terminal_and_a_long_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(capsys, "plan", *TINY, "--compare", "megatron")[2] == ""  # captured stderr: no terminal
    terminal = TerminalStderr()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main_exit("plan", *TINY, "--compare", "megatron") == 0
    assert "hydraplan: baseline megatron ... done in " in terminal.getvalue()
    for argv in (TINY, [*TINY, "--compare", "megatron", "--no-progress"]):  # 0.5 s expected; silenced
        terminal.seek(0)
        terminal.truncate()
        assert main_exit("plan", *argv) == 0
        assert terminal.getvalue() == "", argv


def main_exit(*argv: str) -> int:
    from hydraplan.api.cli import main

    return main(list(argv))


def test_progress_choice_rule() -> None:
    assert Progress.for_command(True, 0.1).enabled and not Progress.for_command(False, 60).enabled
    assert not Progress.for_command(None, 60).enabled  # pytest's stderr is no terminal


def test_a_failing_step_says_so_before_the_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lengths = write(tmp_path, "L.txt", "100\n1000000000\n")  # longer than every capacity
    code, _, err = run(capsys, "plan", *TINY, "--lengths", lengths, "--progress")
    first, second = err.splitlines()
    assert code == 2 and " ... failed after " in first and second.startswith("hydraplan: error: ")


def test_strategies_progress(capsys: pytest.CaptureFixture[str]) -> None:
    flags = "--model tiny --num-gpus 8 --num-tokens 20000 --num-batches 2 --pool-size 1 --budget-s 1".split()
    code, out, err = run(capsys, "strategies", *flags, "--progress")
    assert code == 0, err
    assert err.startswith("hydraplan: proposing a pool of 1 strategies from 2 sample batches on 8 GPUs, budget 1.0 s")
    assert " ... done in " in err and "hydraplan:" not in out


# ---------------------------------------------------------------------------------------------
# models and gpus
# ---------------------------------------------------------------------------------------------

MINI_MODEL = {
    "name": "mini",
    "num_layers": 2,
    "hidden_size": 128,
    "ffn_hidden_size": 344,
    "num_heads": 2,
    "num_kv_heads": 2,
    "vocab_size": 512,
    "source": "a test entry",
}
SLOW_GPU = {
    "name": "h100-sxm-80gb",  # replaces the catalog entry
    "memory_bytes": 40e9,
    "peak_bf16_flops": 100e12,
    "hbm_bandwidth_bytes_per_s": 1e12,
    "intra_node_bandwidth_bytes_per_s": 1e11,
    "inter_node_bandwidth_bytes_per_s": 1e10,
}


def test_models_and_gpus_list_the_catalogs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "models")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("llama3-8b "))
    assert row.split() == ["llama3-8b", "32", "4,096", "14,336", "32", "8", "128,256", "8.03", "B"]
    code, out, err = run(capsys, "gpus")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("h100-sxm-80gb "))
    assert row.split() == ["h100-sxm-80gb", "80", "990", "3,350", "450", "50.0"]


def test_models_and_gpus_json_and_catalog_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    models_file = write(tmp_path, "models.json", json.dumps({"models": [MINI_MODEL]}))
    gpus_file = write(tmp_path, "gpus.json", json.dumps({"gpus": [SLOW_GPU]}))
    code, out, err = run(capsys, "models", "--models-file", models_file, "--json")
    assert code == 0, err
    models = json.loads(out)
    assert {"tiny", "llama3-8b", "mini"} <= {model["name"] for model in models}
    assert next(model for model in models if model["name"] == "mini")["hidden_size"] == 128
    code, out, err = run(capsys, "gpus", "--gpus-file", gpus_file, "--json")
    assert code == 0, err
    gpus = json.loads(out)
    assert [gpu["memory_bytes"] for gpu in gpus if gpu["name"] == "h100-sxm-80gb"] == [40e9]
    code, out, err = run(capsys, "plan", *TINY, "--model", "mini", "--models-file", models_file)
    assert code == 0, err
    assert "mini on h100-sxm-80gb" in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (json.dumps([MINI_MODEL]), "the top level must be a JSON object, got list"),
        (json.dumps({"models": {"mini": MINI_MODEL}}), "models: a list of entries is required"),
        (json.dumps({"models": [{**MINI_MODEL, "num_heads": 3}]}), "models[0]: hidden_size 128 is not divisible"),
    ],
)
def test_a_bad_models_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, "models.json", text)
    code, _, err = run(capsys, "models", "--models-file", path)
    message = assert_one_line_error(code, err)
    assert message.startswith(f"{path}: ") and expected in message


# ---------------------------------------------------------------------------------------------
# A light `hydraplan --help`
# ---------------------------------------------------------------------------------------------

# third-party roots, and hydraplan modules that pull numpy, pydantic or the solvers
HEAVY_ROOTS = ("ortools", "highspy", "pulp", "numpy", "pydantic", "pydantic_core")
HEAVY_PREFIXES = ("hydraplan.planner", "hydraplan.cost_models", "hydraplan.api.datasets", "hydraplan.api.cli.")


def loaded_heavy_modules(code: str) -> list[str]:
    """The heavy modules loaded after running `code` in a fresh interpreter."""
    probe = (
        f"import json, sys\n{code}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY_ROOTS!r} "
        f"or m.startswith({HEAVY_PREFIXES!r}))))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def test_importing_the_cli_imports_no_solver_numpy_or_pydantic() -> None:
    assert loaded_heavy_modules("import hydraplan.api.cli") == []


def test_top_level_help_and_version_import_nothing_heavy() -> None:
    run_main = "from hydraplan.api.cli import main\nfor argv in (['--help'], ['--version']):\n    main(argv)"
    assert loaded_heavy_modules(run_main) == []


def test_a_command_help_imports_no_solver_library() -> None:
    loaded = loaded_heavy_modules("from hydraplan.api.cli import main\nmain(['plan', '--help'])")
    assert "hydraplan.api.cli.plan" in loaded  # the command's flags were loaded on demand ...
    assert not [name for name in loaded if name.split(".")[0] in HEAVY_ROOTS[:3]]  # ... but no solver


def test_the_cli_doc_catalog_file_examples_load(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    section = doc.split("\n## Catalog files")[1]
    block = section.split("```\n")[1]
    models_text, gpus_text = block.split('\n{"gpus"')
    models_file = write(tmp_path, "models.json", models_text)
    gpus_file = write(tmp_path, "gpus.json", '{"gpus"' + gpus_text)
    code, out, err = run(capsys, "models", "--models-file", models_file)
    assert code == 0 and "mini" in out, err
    code, out, err = run(capsys, "gpus", "--gpus-file", gpus_file)
    assert code == 0 and "my-gpu" in out, err
