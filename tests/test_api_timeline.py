"""POST /v1/plans/timeline, the /v1/datasets endpoints and the web page's static routes."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from importlib import resources

import pytest
from api_support import assert_problem, client_fixture, make_client, test_settings  # noqa: F401
from fastapi.testclient import TestClient
from test_timeline import STRATEGY, assert_blocks_are_the_simulation, assert_document_is_the_simulation, svg_blocks

from hydraplan.api.datasets import sample_batch
from hydraplan.api.render import timeline
from hydraplan.api.service.app import create_app
from hydraplan.api.service.auth import OPEN_PATHS, UI_PATHS, unguarded_routes
from hydraplan.api.service.routes import ROUTERS
from hydraplan.planner.schemas import Plan

pytestmark = pytest.mark.service
TOKEN = "page-token"
LENGTHS = [64 + (index * 7919) % 6000 for index in range(196)] + [12000, 15000, 18000, 20000]


@pytest.fixture
def plans(user_profile_data: dict) -> tuple[dict, dict]:
    """A heterogeneous plan (with a 2-stage pipeline) and megatron's, both from the service."""
    body = {
        "lengths": LENGTHS,
        "num_gpus": 16,
        "gpus_per_node": 8,
        "profile": user_profile_data,
        # one fixed heterogeneous strategy: the plan does not depend on a loaded machine's clock
        "options": {"time_limit_s": 5, "solver": "greedy", "strategy_pool": [STRATEGY]},
    }
    with make_client() as client:
        planned = client.post("/v1/plans", json=body)
        assert planned.status_code == 200, planned.text
        estimated = client.post("/v1/estimate", json={**body, "baseline": "megatron"})
        assert estimated.status_code == 200, estimated.text
    return planned.json(), estimated.json()["plan"]


def test_svg_timeline_has_the_simulated_blocks(client, plans) -> None:
    plan, baseline = plans
    response = client.post(
        "/v1/plans/timeline", json={"plan": plan, "compare": [{"label": "megatron", "plan": baseline}]}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("image/svg+xml")
    root = ElementTree.fromstring(response.text)
    parsed = [Plan.model_validate(plan), Plan.model_validate(baseline)]
    assert any(p.scheme.pp > 1 for p in parsed[0].pipelines) and len({str(p.scheme) for p in parsed[0].pipelines}) > 1
    assert_blocks_are_the_simulation(parsed, svg_blocks(root))
    labels = [g.get("data-label") for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "plan"]
    assert labels == ["hydraplan", "megatron"]


def test_json_timeline_is_the_document_with_every_pipeline(client, plans) -> None:
    plan, baseline = plans
    body = {"plan": baseline, "label": "megatron", "pipelines": "all", "format": "json"}
    response = client.post("/v1/plans/timeline", json=body)
    assert response.status_code == 200, response.text
    document = response.json()
    assert [t["label"] for t in document["plans"]] == ["megatron"]
    assert len(document["plans"][0]["groups"]) == len(baseline["pipelines"])
    assert_document_is_the_simulation([Plan.model_validate(baseline)], document)


def test_bad_timeline_requests_are_problems(client, plans, monkeypatch) -> None:
    plan, _ = plans
    problem = assert_problem(client.post("/v1/plans/timeline", json={"plan": plan, "format": "pdf"}), 422)
    assert problem["errors"][0]["loc"] == ["body", "format"]
    too_many = [{"label": f"p{index}", "plan": plan} for index in range(9)]
    problem = assert_problem(client.post("/v1/plans/timeline", json={"plan": plan, "compare": too_many}), 422)
    assert problem["errors"][0]["loc"] == ["body", "compare"]
    monkeypatch.setattr(timeline, "MAX_DRAWN_BLOCKS", 10)
    problem = assert_problem(client.post("/v1/plans/timeline", json={"plan": plan}), 422, "more than the limit of 10")
    assert problem["errors"][0]["loc"] == ["body", "pipelines"]


def test_datasets_are_listed_and_sampled_as_the_cli_samples_them(client) -> None:
    listed = client.get("/v1/datasets")
    assert listed.status_code == 200
    assert {entry["name"] for entry in listed.json()["datasets"]} == {"wikipedia", "lognormal", "sft-mix", "longalign"}
    sample = client.get("/v1/datasets/sft-mix/sample", params={"num_tokens": 50_000, "seed": 4, "context_cap": 4096})
    assert sample.status_code == 200, sample.text
    assert sample.json()["lengths"] == sample_batch("sft-mix", 50_000, 4, 4096)
    assert sample.json()["num_tokens"] == sum(sample.json()["lengths"]) >= 50_000
    assert_problem(client.get("/v1/datasets/nope/sample"), 404, "dataset 'nope' is unknown", "wikipedia")
    problem = assert_problem(client.get("/v1/datasets/wikipedia/sample", params={"num_tokens": 0}), 422)
    assert problem["errors"][0]["loc"] == ["query", "num_tokens"]


@pytest.mark.parametrize("root_path", ["", "/api"])
def test_the_page_and_its_assets_are_public_and_the_api_is_not(root_path: str) -> None:
    app = create_app(test_settings(api_token=TOKEN))
    with TestClient(app, root_path=root_path, raise_server_exceptions=False) as client:
        for path in sorted(UI_PATHS):
            response = client.get(root_path + path)
            assert response.status_code == 200, (path, response.text)
            assert "default-src 'none'" in response.headers["content-security-policy"]
        page = client.get(root_path + "/ui").text
        assert f'src="{root_path}/ui/app.js"' in page and f'content="{root_path}"' in page
        assert client.get(root_path + "/ui/app.js").headers["content-type"].startswith("text/javascript")
        for method, path in [("GET", "/v1/datasets"), ("POST", "/v1/plans/timeline"), ("GET", "/ui/other.js")]:
            assert_problem(client.request(method, root_path + path, json={} if method == "POST" else None), 401)
    assert unguarded_routes(ROUTERS) == []
    assert UI_PATHS <= OPEN_PATHS and not any(path.startswith("/v1") for path in UI_PATHS)


def test_the_page_calls_only_the_v1_api() -> None:
    """No second code path: every request of the script goes to a /v1 endpoint of this server."""
    script = resources.files("hydraplan.api.service").joinpath("web", "app.js").read_text()
    called = set(re.findall(r'(?:getJson|postJson)\(\s*[`"](/[^`"?$]*)', script))
    assert called == {"/v1/models", "/v1/gpus", "/v1/datasets", "/v1/datasets/", "/v1/plans", "/v1/estimate",
                      "/v1/plans/timeline"}  # fmt: skip
    assert "fetch(ROOT + path" in script and script.count("fetch(") == 1
