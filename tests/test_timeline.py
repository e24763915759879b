"""Timelines of plans (api/render/, `plan --timeline`, `show --timeline`): every drawn block
is read back from the file (SVG data attributes, HTML embedded data, PNG text chunk) and must
equal the block the planner's 1F1B simulation gives for that pipeline."""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from hydraplan.api.cli import main
from hydraplan.api.render.svg import render_html, render_svg
from hydraplan.api.render.timeline import MAX_GROUPS, timeline_document
from hydraplan.planner.baselines import run_baseline
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest, SolverOptions
from hydraplan.planner.simulate import schedule_1f1b
from hydraplan.planner.solve import evaluate_strategy
from hydraplan.planner.strategies import parse_strategy

SVG = "{http://www.w3.org/2000/svg}"
IN_CI = os.environ.get("CI") == "true"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# A heterogeneous strategy with a 2-stage pipeline, fixed by a one-strategy pool (and the greedy
# backend) so that a loaded machine's clock cannot change the plan the tests draw.
STRATEGY = "1x<4,2,1> + 1x<2,1,1> + 6x<1,1,1>"


@pytest.fixture
def batch(user_profile_path: Path, lengths_path: Path) -> list[str]:
    """The conftest profile and lengths on 16 GPUs."""
    return ["--profile", str(user_profile_path), "--lengths", str(lengths_path), "--num-gpus", "16"]


@pytest.fixture
def fixed(tmp_path: Path) -> list[str]:
    pool = tmp_path / "pool.txt"
    pool.write_text(STRATEGY + "\n")
    return ["--strategy-pool", str(pool), "--solver", "greedy", "--time-limit-s", "5"]


@pytest.fixture
def plan_and_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], batch: list[str], fixed: list[str]
) -> tuple[Path, Path]:
    plan_path, baseline_path = tmp_path / "plan.json", tmp_path / "megatron.json"
    assert run(capsys, "plan", *batch, *fixed, "--out", str(plan_path))[0] == 0
    assert run(capsys, "plan", *batch, "--baseline", "megatron", "--out", str(baseline_path))[0] == 0
    return plan_path, baseline_path


def load(path: Path) -> Plan:
    return Plan.model_validate_json(path.read_text())


def expected_blocks(plan: Plan, pipeline_index: int) -> dict[tuple[int, int, str], tuple[float, float]]:
    """The planner's simulation of one pipeline, keyed (stage, micro-batch, F|B)."""
    pipeline = plan.pipelines[pipeline_index]
    entry = next(
        e for e in plan.cost_profile.schemes if (e.tp, e.pp, e.cp) == tuple(pipeline.scheme.model_dump().values())
    )
    blocks = schedule_1f1b([b.stage_time_s for b in pipeline.micro_batches], pipeline.scheme.pp, entry.fwd_fraction)
    return {(b.stage, b.micro_batch, "F" if b.is_forward else "B"): (b.start_s, b.end_s) for b in blocks}


def svg_blocks(root: ElementTree.Element) -> dict[int, dict[int, dict[tuple[int, int, str], tuple[float, float]]]]:
    """plan index -> pipeline index -> block key -> (start, end), from the rects' data attributes."""
    found: dict[int, dict[int, dict]] = {}
    for rect in root.iter(f"{SVG}rect"):
        if "data-kind" not in rect.attrib:
            continue
        key = (int(rect.get("data-stage")), int(rect.get("data-micro-batch")), rect.get("data-kind"))
        times = (float(rect.get("data-start-s")), float(rect.get("data-end-s")))
        found.setdefault(int(rect.get("data-plan")), {}).setdefault(int(rect.get("data-pipeline")), {})[key] = times
    return found


def assert_blocks_are_the_simulation(plans: list[Plan], drawn: dict[int, dict[int, dict]]) -> None:
    assert sorted(drawn) == list(range(len(plans)))
    for plan_index, plan in enumerate(plans):
        assert drawn[plan_index], f"plan {plan_index} has no blocks"
        for pipeline_index, blocks in drawn[plan_index].items():
            assert blocks == expected_blocks(plan, pipeline_index)  # exact: the simulator's own floats
            last = max(end for _, end in blocks.values())
            assert last == pytest.approx(plan.pipelines[pipeline_index].time_s, rel=1e-12)


def assert_document_is_the_simulation(plans: list[Plan], document: dict) -> None:
    assert document["schema_version"] == "hydraplan.timeline/1"
    drawn: dict[int, dict[int, dict]] = {}
    for plan_index, timeline in enumerate(document["plans"]):
        assert timeline["plan_id"] == plans[plan_index].plan_id
        for group in timeline["groups"]:
            blocks = {(s, m, k): (start, end) for s, m, k, start, end in group["blocks"]}
            for member in group["pipelines"]:  # every member of a group runs the drawn schedule
                drawn.setdefault(plan_index, {})[member] = blocks
    assert_blocks_are_the_simulation(plans, drawn)


def test_svg_of_a_heterogeneous_plan_and_a_baseline_has_the_simulated_blocks(tmp_path, capsys, plan_and_baseline):
    plan_path, baseline_path = plan_and_baseline
    out = tmp_path / "timeline.svg"
    code, _, err = run(capsys, "show", str(plan_path), "--compare-with", str(baseline_path), "--timeline", str(out))
    assert code == 0, err
    assert f"wrote the timeline of plan, megatron to {out}" in err
    plans = [load(plan_path), load(baseline_path)]
    assert len({str(p.scheme) for p in plans[0].pipelines}) > 1, "the fixture must be heterogeneous"
    assert any(p.scheme.pp > 1 for p in plans[0].pipelines), "the fixture must have a multi-stage pipeline"
    root = ElementTree.parse(out).getroot()
    assert_blocks_are_the_simulation(plans, svg_blocks(root))
    # the marks: slowest pipeline, gradient sync, the plan's lower bound (none for the baseline)
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "pipeline"]
    slowest = [g for g in groups if g.get("data-slowest") == "true"]
    assert len(slowest) == 2
    bounds = [line for line in root.iter(f"{SVG}line") if line.get("class") == "lower-bound"]
    assert [float(line.get("data-time-s")) for line in bounds] == [plans[0].lower_bound_s]
    syncs = [rect for rect in root.iter(f"{SVG}rect") if rect.get("class") == "grad-sync"]
    assert [float(rect.get("data-end-s")) for rect in syncs] == [plan.step_time_s for plan in plans]
    assert float(root.get("data-time-max-s")) == max(plan.step_time_s for plan in plans)


def test_html_embeds_the_timeline_data_and_its_svg(tmp_path, capsys, plan_and_baseline):
    plan_path, baseline_path = plan_and_baseline
    out = tmp_path / "timeline.html"
    code, _, err = run(
        capsys,
        "show",
        str(plan_path),
        "--compare-with",
        str(baseline_path),
        "--timeline",
        str(out),
        "--pipelines",
        "all",
    )
    assert code == 0, err
    text = out.read_text()
    start = text.index("<script type='application/json' id='hydraplan-timeline'>")
    payload = text[text.index(">", start) + 1 : text.index("</script>", start)]
    document = json.loads(payload)
    plans = [load(plan_path), load(baseline_path)]
    assert_document_is_the_simulation(plans, document)
    # --pipelines all: every pipeline drawn on its own
    assert [len(t["groups"]) for t in document["plans"]] == [len(plan.pipelines) for plan in plans]
    assert "<svg" in text and text.count("data-kind=") == sum(
        len(g["blocks"]) for t in document["plans"] for g in t["groups"]
    )


def test_png_carries_the_timeline_data(tmp_path, capsys, plan_and_baseline):
    if not IN_CI:
        pytest.importorskip("matplotlib", reason="the plots extra (matplotlib) is not installed")
    from PIL import Image

    plan_path, baseline_path = plan_and_baseline
    out = tmp_path / "timeline.png"
    code, _, err = run(capsys, "show", str(plan_path), "--compare-with", str(baseline_path), "--timeline", str(out))
    assert code == 0, err
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > 600
        document = json.loads(image.text["hydraplan-timeline"])
    assert_document_is_the_simulation([load(plan_path), load(baseline_path)], document)


def test_plan_compare_draws_the_baselines_on_the_same_axis(tmp_path, capsys, batch, fixed, user_profile_path):
    out, plan_path = tmp_path / "compare.svg", tmp_path / "plan.json"
    code, stdout, err = run(
        capsys, "plan", *batch, *fixed, "--compare", "megatron,hydraulis", "--timeline", str(out),
        "--out", str(plan_path),
    )  # fmt: skip
    assert code == 0, err
    assert "speedup of this plan" in stdout and load(plan_path).strategy == STRATEGY
    plan = load(plan_path)
    request = PlanRequest(lengths=plan.input_lengths, num_gpus=16, gpus_per_node=8, options=SolverOptions())
    profile = CostProfile.model_validate_json(user_profile_path.read_text())
    baselines = [run_baseline(name, request, profile) for name in ("megatron", "hydraulis")]
    root = ElementTree.parse(out).getroot()
    labels = [g.get("data-label") for g in root.iter(f"{SVG}g") if g.get("class") == "plan"]
    assert labels == ["hydraplan", "megatron", "hydraulis"]
    assert_blocks_are_the_simulation([plan, *baselines], svg_blocks(root))


def _estimate(strategy: str, lengths: list[int], num_gpus: int, profile: CostProfile) -> Plan:
    request = PlanRequest(lengths=lengths, num_gpus=num_gpus, gpus_per_node=8, options=SolverOptions(time_limit_s=0.3))
    return evaluate_strategy(request, profile, parse_strategy(strategy))


def test_identical_pipelines_are_drawn_once(user_profile_data):
    profile = CostProfile.model_validate(user_profile_data)
    plan = _estimate("8x<1,1,1>", [2048] * 16, 8, profile)
    document = timeline_document([("hydraplan", plan)])
    (timeline,) = document.plans
    assert [sorted(group.pipelines) for group in timeline.groups] == [list(range(8))]
    assert timeline.hidden_pipelines == [] and timeline.histogram is None
    svg = render_svg(document)
    assert "#0,1,2,3,... &lt;1,1,1&gt; x8" in svg  # one labelled row stands for all eight
    every = timeline_document([("hydraplan", plan)], pipelines="all").plans[0]
    assert [group.pipelines for group in every.groups] == [[index] for index in range(8)]


def test_large_plans_draw_the_slowest_groups_and_a_histogram_of_the_rest(user_profile_data):
    profile = CostProfile.model_validate(user_profile_data)
    lengths = [500 + 37 * index for index in range(96)]
    plan = _estimate("32x<1,1,1>", lengths, 32, profile)
    timeline = timeline_document([("hydraplan", plan)]).plans[0]
    drawn = [plan.pipelines[group.pipelines[0]].time_s for group in timeline.groups]
    hidden = [plan.pipelines[index].time_s for index in timeline.hidden_pipelines]
    assert len(timeline.groups) == MAX_GROUPS
    drawn_members = sum(len(group.pipelines) for group in timeline.groups)
    assert drawn_members + len(hidden) == 32 and sum(timeline.histogram.counts) == len(hidden)
    assert min(drawn) >= max(hidden)  # the slowest are the ones drawn
    assert drawn == sorted(drawn, reverse=True)
    assert timeline.slowest_pipeline == max(plan.pipelines, key=lambda p: p.time_s).index
    assert timeline.histogram.edges_s[0] == min(hidden) and timeline.histogram.edges_s[-1] == max(hidden)
    html = render_html(timeline_document([("hydraplan", plan)]))
    assert f"{len(hidden)} other pipelines" in html


def test_labels_are_escaped(user_profile_data):
    profile = CostProfile.model_validate(user_profile_data)
    plan = _estimate("2x<1,1,1>", [1000, 2000], 2, profile)
    svg = render_svg(timeline_document([("<script>&", plan)]))
    ElementTree.fromstring(svg)  # still well-formed XML
    assert "<script>&" not in svg and "&lt;script&gt;&amp;" in svg
    html = render_html(timeline_document([("</script><b>", plan)]))
    assert "</script><b>" not in html


@pytest.mark.parametrize("name", ["timeline.pdf", "timeline"])
def test_an_unknown_timeline_format_is_refused_before_planning(tmp_path, capsys, batch, name):
    code, out, err = run(capsys, "plan", *batch, "--timeline", str(tmp_path / name))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"hydraplan: error: --timeline {tmp_path / name}: unknown format")
    assert "give .svg, .html or .png" in err


def test_png_without_matplotlib_is_a_usage_error(tmp_path, capsys, plan_and_baseline, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    plan_path, _ = plan_and_baseline
    out = tmp_path / "t.png"
    code, _, err = run(capsys, "show", str(plan_path), "--timeline", str(out))
    assert code == 2 and err.count("\n") == 1
    assert "--timeline" in err and "pip install 'hydraplan[plots]'" in err and not out.exists()


def test_svg_and_html_timelines_need_neither_matplotlib_nor_the_service():
    import subprocess

    code = (
        "import sys, hydraplan.api.cli.timeline, hydraplan.api.render.svg;"
        "bad = [m for m in ('matplotlib', 'fastapi', 'starlette', 'torch') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_timeline_too_large_to_draw_is_a_usage_error(tmp_path, capsys, plan_and_baseline, monkeypatch):
    from hydraplan.api.render import timeline

    monkeypatch.setattr(timeline, "MAX_DRAWN_BLOCKS", 10)
    plan_path, _ = plan_and_baseline
    out = tmp_path / "t.svg"
    code, _, err = run(capsys, "show", str(plan_path), "--timeline", str(out))
    assert code == 2 and err.count("\n") == 1 and not out.exists()
    assert err.startswith(f"hydraplan: error: --timeline {out}: the timeline of plan would draw")
    assert "more than the limit of 10" in err
