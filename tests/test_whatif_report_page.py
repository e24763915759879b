"""The what-if report in a real headless browser (the same Chromium as tests/test_web_page.py): a
large sweep's report fits a laptop window, answer first, raw spec last and collapsed.

The rows are made up (no planning): 72 configurations over 4 GPU types, 6 cluster sizes and 3
context caps, 20 schemes per cluster, 4 baselines, as a big sweep gives. Skipped, with the reason
printed, only where Playwright or a Chromium binary is missing (a failure in CI).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from test_web_page import ARTIFACTS, browser  # noqa: F401 - the browser fixture
from whatif_support import tiny_configurations

from hydraplan.api.whatif.report import write_report
from hydraplan.api.whatif.schemas import RowStatus, WhatifRow

LAPTOP = {"width": 1280, "height": 800}
MAX_SCREENS = 5  # the page is at most this many windows tall, however many rows the sweep has
GPUS = ("h100-sxm-80gb", "a100-80gb", "h200-141gb", "a100-40gb")
SCHEMES = [
    f"<{tp},{pp},{cp}>" for tp, pp, cp in itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2)) if tp * pp * cp <= 32
]
BASELINES = ("megatron", "wlb", "flexsp", "hydraulis")


def made_up_rows() -> list[WhatifRow]:
    rows = []
    settings = itertools.product(GPUS, (8, 16, 32, 64, 128, 256), (4096, 32768, None))
    for index, (gpu, num_gpus, cap) in enumerate(settings):
        step_time_s = 2.0 / num_gpus**0.9
        rows.append(
            WhatifRow(
                index=index,
                key=f"k{index}",
                model="llama3-8b",
                gpu=gpu,
                num_gpus=num_gpus,
                gpus_per_node=8,
                dataset="wikipedia",
                context_cap=cap,
                tokens_per_step=1_048_576,
                cost_source="analytic",
                planner="hydraplan",
                num_steps=3,
                status=RowStatus.OK,
                mean_tokens=1_048_000.0,
                step_time_s=step_time_s,
                step_times_s=[step_time_s * 0.98, step_time_s, step_time_s * 1.02],
                tokens_per_s=1_048_000 / step_time_s,
                tokens_per_s_per_gpu=1_048_000 / step_time_s / num_gpus,
                mfu=0.3 + index / 1000,
                gap=index / 7000,
                plan_status=("optimal", "feasible")[index % 2],
                strategy=f"{index % 5 + 1}x<2,1,1> + 2x<4,2,1> + 1x<8,1,2>",
                strategy_mix={"<2,1,1>": 0.5, "<4,2,1>": 0.3, "<8,1,2>": 0.2},
                speedups={name: 1.0 + 0.05 * position + index / 500 for position, name in enumerate(BASELINES)},
                max_context_any_scheme_tokens=131072,
                max_context_every_scheme_tokens=8192,
                scheme_capacity_tokens={scheme: 4096 * (position + 1) for position, scheme in enumerate(SCHEMES)},
                price_per_gpu_hour=2.5,
                cost_per_hour=2.5 * num_gpus,
                cost_per_1m_tokens=0.01 * num_gpus,
            )
        )
    return rows


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hydraplan.api.whatif.plots import write_plots

    folder = tmp_path_factory.mktemp("report")
    rows = made_up_rows()
    figures = write_plots(folder / "plots", rows)
    return write_report(folder, rows, tiny_configurations(), [], figures, '{"models": ["llama3-8b"]}')


def test_a_large_sweeps_report_fits_a_laptop_window(browser, report: Path) -> None:  # noqa: F811
    context = browser.new_context(viewport=LAPTOP)
    page = context.new_page()
    page.goto(report.as_uri())
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "whatif_report.png"), full_page=True)
    width, height = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    # no horizontal scrolling of the page: the tables wider than the window scroll inside their boxes
    assert width <= LAPTOP["width"]
    widest = page.evaluate("Math.max(...[...document.querySelectorAll('table')].map(table => table.scrollWidth))")
    assert widest > LAPTOP["width"]
    assert height <= MAX_SCREENS * LAPTOP["height"], f"the report is {height} px tall"
    # answer first: the summary and the throughput figure come before the table; the spec is last, closed
    headings = page.evaluate("[...document.querySelectorAll('h2')].map(h2 => h2.textContent)")
    assert headings.index("Summary") == 0 and headings.index("Configurations") == 2
    assert page.evaluate("document.querySelector('img').alt") == "throughput"
    assert page.evaluate("document.body.lastElementChild.tagName") == "DETAILS"
    assert page.evaluate("document.querySelector('details').open") is False
    headers = page.evaluate("[...document.querySelectorAll('#rows th')].map(th => th.textContent)")
    assert "step time (s)" in headers and "speedup over flexsp" in headers
    assert not any("_" in header for header in headers)
    context.close()
