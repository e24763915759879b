"""The web page in a real headless browser (Debian's chromium, driven by Playwright) against a
real server with a token set: load the page, plan a batch, see the strategy and the timeline,
submit bad input and see the message next to the field. Screenshots go to tests/artifacts/.

Skipped, with the reason printed, only where Playwright or a Chromium binary is missing; in CI
(`CI=true`, where `.ci/run` installs both) that is a failure instead.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_support import start_uvicorn, wait_for
from test_timeline import assert_blocks_are_the_simulation

from hydraplan.planner.schemas import Plan

pytestmark = pytest.mark.service
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
TOKEN = "browser-token"
BATCH = "4096\n1024\n512\n8192\n2048\n300\n7000\n128\n30000\n900"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WAIT_MS = 60_000  # a loaded 2-core CI machine plans, estimates and draws within this


def _chromium() -> str:
    """A Chromium binary (HYDRAPLAN_CHROMIUM, or the first of CHROMIUM_NAMES on PATH)."""
    candidates = [os.environ.get("HYDRAPLAN_CHROMIUM", ""), *(shutil.which(name) or "" for name in CHROMIUM_NAMES)]
    found = next((path for path in candidates if path and Path(path).exists()), None)
    if found is None:
        _unavailable("no Chromium binary: apt-get install -y chromium (or set HYDRAPLAN_CHROMIUM)")
    return found


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the browser test must run in CI: {reason}")
    print(f"test_web_page skipped: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed: pip install -e '.[test]'")
    executable = _chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    running = start_uvicorn({"HYDRAPLAN_API_TOKEN": TOKEN}, token=TOKEN)
    yield running
    running.stop()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    opened = context.new_page()
    opened.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.goto(server.url + "/")
    yield opened
    context.close()
    assert errors == [], f"script errors on the page: {errors}"


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def enter_token(page) -> None:
    page.fill("#token", TOKEN)
    page.press("#token", "Tab")  # leaving the field commits it: the page reloads the catalogs with it
    page.wait_for_selector("#status:text-is('ready')")


def fill_tiny_batch(page, lengths: str | None = BATCH) -> None:
    """The tiny model on one 8-GPU node with a 0.5 s budget; `lengths` typed unless None."""
    page.select_option("#model", "tiny")
    if lengths is not None:
        page.fill("#lengths", lengths)
    page.fill("#num-gpus", "8")
    page.fill("#time-limit", "0.5")


def field_error(page, field: str) -> str:
    selector = f".field-error[data-field={field}]"
    page.wait_for_selector(f"{selector}:not(:empty)")
    return page.inner_text(selector)


def test_the_page_plans_a_batch_and_draws_its_timeline(page) -> None:
    # without the token the catalogs are refused: the page says so next to the token field
    assert "needs its API token" in field_error(page, "token")
    enter_token(page)
    fill_tiny_batch(page)
    with page.expect_response(lambda response: response.url.endswith("/v1/plans")) as answer:
        page.click("#submit")
    plan = answer.value.json()
    page.wait_for_selector("#timeline svg rect[data-kind]")
    page.wait_for_selector("#baselines-table tbody tr[data-baseline=hydraulis]")
    screenshot(page, "web_plan.png")
    # the strategy and the summary are the plan's
    assert page.inner_text("dd[data-fact=strategy]") == plan["strategy"]
    assert page.inner_text("#plan-id") == plan["plan_id"]
    assert "gap" in page.inner_text("dd[data-fact='lower bound']")
    # the timeline: the plan and each chosen baseline, every block the simulator's
    labels = page.eval_on_selector_all("#timeline g.plan", "groups => groups.map(g => g.dataset.label)")
    assert labels == ["hydraplan", "megatron", "hydraulis"]
    blocks = page.eval_on_selector_all(
        "#timeline g.plan[data-plan='0'] rect[data-kind]",
        "rects => rects.map(r => [r.dataset.pipeline, r.dataset.stage, r.dataset.microBatch, r.dataset.kind, "
        "r.dataset.startS, r.dataset.endS])",
    )
    drawn: dict[int, dict] = {}
    for pipeline, stage, micro_batch, kind, start_s, end_s in blocks:
        drawn.setdefault(int(pipeline), {})[(int(stage), int(micro_batch), kind)] = (float(start_s), float(end_s))
    assert_blocks_are_the_simulation([Plan.model_validate(plan)], {0: drawn})
    # baselines and speedups, as the plan reports them
    for baseline in plan["baselines"]:
        row = page.inner_text(f"#baselines-table tbody tr[data-baseline={baseline['name']}]")
        assert baseline["strategy"] in row and f"{baseline['speedup']:.2f}x" in row
    assert page.locator("#pipelines-table tbody tr").count() == len(plan["pipelines"])
    # the download is the plan JSON the service sent
    assert page.get_attribute("#download", "download") == f"{plan['plan_id']}.json"
    with page.expect_download() as download:
        page.click("#download")
    assert download.value.suggested_filename == f"{plan['plan_id']}.json"
    assert json.loads(Path(download.value.path()).read_text()) == plan


def test_bad_input_is_shown_next_to_the_field_it_names(page, tmp_path) -> None:
    enter_token(page)
    fill_tiny_batch(page, "")
    uploaded = tmp_path / "batch.txt"
    uploaded.write_text("100\n-5\nabc\n")
    page.set_input_files("#lengths-file", str(uploaded))  # an uploaded file fills the lengths
    wait_for(lambda: page.input_value("#lengths") == "100\n-5\nabc\n", timeout_s=WAIT_MS / 1e3)
    page.click("#submit")
    message = field_error(page, "lengths")
    screenshot(page, "web_bad_lengths.png")
    assert "entry 2: Input should be greater than or equal to 1" in message
    assert "entry 3: Input should be a valid integer" in message
    assert "invalid" in page.get_attribute("#lengths", "class")
    assert page.is_hidden("#result")
    fill_tiny_batch(page)
    page.fill("#num-gpus", "12")
    page.click("#submit")
    assert "not a multiple of gpus_per_node 8" in field_error(page, "num_gpus")
    assert page.inner_text(".field-error[data-field=lengths]") == ""  # the earlier message is gone
    page.fill("#num-gpus", "8")
    page.fill("#time-limit", "0")
    page.click("#submit")
    assert "Time budget: Input should be greater than 0" in field_error(page, "time_limit_s")
    screenshot(page, "web_bad_budget.png")


def test_a_bundled_dataset_can_be_planned(page) -> None:
    enter_token(page)
    page.check("input[name=source][value=dataset]")
    page.select_option("#dataset", "sft-mix")
    page.fill("#num-tokens", "20000")
    fill_tiny_batch(page, None)
    page.uncheck("input[name=baseline][value=hydraulis]")
    # a token change reloads the catalogs: the choices made stay
    page.dispatch_event("#token", "change")
    page.wait_for_selector("#status:text-is('ready')")
    assert page.input_value("#dataset") == "sft-mix" and page.input_value("#model") == "tiny"
    with page.expect_response(lambda response: "/v1/datasets/sft-mix/sample" in response.url) as sampled:
        page.click("#submit")
    lengths = sampled.value.json()["lengths"]
    page.wait_for_selector("#timeline svg rect[data-kind]")
    assert page.inner_text("dd[data-fact=sequences]").startswith(f"{len(lengths)} (")
    page.fill("#num-tokens", "0")
    page.click("#submit")
    assert "Tokens to sample" in field_error(page, "num_tokens")
    screenshot(page, "web_dataset.png")
