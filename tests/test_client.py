"""`hydraplan.Client` and `hydraplan.AsyncClient` against a real uvicorn server: every call,
the 503 back-off, token and validation errors as `ServiceError`, and the client examples of the
README's tour and of docs/service.md run as they are written."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from api_support import ROOT, TINY_LENGTHS, Server, plan_body, session_body, start_uvicorn

import hydraplan

pytestmark = [pytest.mark.service, pytest.mark.slow]
TOKEN = "client-test-token"
TINY = {"num_gpus": 8, "model": "tiny", "gpu": "h100-sxm-80gb", "options": {"time_limit_s": 0.3}}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # one solver slot and no queue: a second concurrent solve is shed with 503 + Retry-After: 1
    settings = {
        "HYDRAPLAN_API_TOKEN": TOKEN,
        "HYDRAPLAN_MAX_CONCURRENT_SOLVES": "1",
        "HYDRAPLAN_MAX_QUEUED_SOLVES": "0",
    }
    running = start_uvicorn(settings, token=TOKEN)
    yield running
    running.stop()


def test_every_call_of_the_blocking_client(server: Server, user_profile_data: dict) -> None:
    with hydraplan.Client(server.url, token=TOKEN) as client:
        plan = client.plan(TINY_LENGTHS, **TINY)
        assert isinstance(plan, hydraplan.Plan) and plan.input_lengths == TINY_LENGTHS
        assert client.check(plan) == {
            "plan_id": plan.plan_id,
            "valid": True,
            "violations": [],
            "verified_bound_s": None,  # the bound is verified only when asked (`bound`)
        }
        estimate = client.estimate(TINY_LENGTHS, strategy=[{"tp": 1, "pp": 1, "num_pipelines": 8}], **TINY)
        assert estimate["strategy"] == "8x<1,1,1>"
        profile_id = client.upload_profile(user_profile_data)
        from_upload = client.plan(TINY_LENGTHS, num_gpus=8, profile_id=profile_id, options={"time_limit_s": 0.3})
        assert from_upload.cost_profile.time_unit == "ms"
        session = client.open_session(**TINY)
        first = session.plan(TINY_LENGTHS)
        second, third = session.plan_batches([TINY_LENGTHS[:30], TINY_LENGTHS[5:]])
        assert second.previous_strategy == first.strategy and third.previous_strategy == second.strategy
        assert session.view()["num_plans"] == 3
        session.close()
        with pytest.raises(hydraplan.ServiceError) as gone:
            session.view()
        assert gone.value.status == 404
        job_id = client.submit_job({"kind": "plan", "request": plan_body()})
        assert client.wait_for_job(job_id, timeout_s=60)["status"] == "succeeded"


def test_errors_are_typed_and_name_the_field(server: Server) -> None:
    with hydraplan.Client(server.url, token=TOKEN) as client:
        with pytest.raises(hydraplan.ServiceError) as invalid:
            client.plan([100, 0], **TINY)
        assert invalid.value.status == 422 and invalid.value.field == "body.lengths.1"
        assert invalid.value.request_id
    for token in (None, "wrong"):
        with hydraplan.Client(server.url, token=token) as anonymous, pytest.raises(hydraplan.ServiceError) as refused:
            anonymous.plan(TINY_LENGTHS, **TINY)
        assert refused.value.status == 401 and refused.value.field is None
    with hydraplan.Client("http://127.0.0.1:9", token=TOKEN, timeout_s=2) as nowhere:
        with pytest.raises(hydraplan.ServiceError) as unreachable:
            nowhere.plan(TINY_LENGTHS, **TINY)
        assert unreachable.value.status == 0


def hold_the_solver_slot(server: Server) -> threading.Thread:
    """A 3 s search (1,500 sequences on 64 GPUs) in the one slot, running before this returns."""
    lengths = [64 + (index * 7919) % 16000 for index in range(1500)]
    slow = {"lengths": lengths, "num_gpus": 64, "model": "llama3-8b", "gpu": "h100-sxm-80gb"}
    slow["options"] = {"time_limit_s": 3, "max_strategies_solved": 100000}
    thread = threading.Thread(target=lambda: server.client().post("/v1/plans", json=slow))
    thread.start()
    time.sleep(1.0)
    return thread


def test_503_is_waited_out_as_the_server_asks(server: Server) -> None:
    holder = hold_the_solver_slot(server)
    with hydraplan.Client(server.url, token=TOKEN, max_retries=0) as impatient:
        with pytest.raises(hydraplan.ServiceError) as shed:
            impatient.plan(TINY_LENGTHS, **TINY)
        assert shed.value.status == 503
    started = time.monotonic()
    with hydraplan.Client(server.url, token=TOKEN, max_retries=10, max_retry_wait_s=1) as patient:
        plan = patient.plan(TINY_LENGTHS, **TINY)
    waited_s = time.monotonic() - started
    holder.join(30)
    assert plan.input_lengths == TINY_LENGTHS
    assert waited_s >= 1.0  # at least one Retry-After: 1 was honoured


def test_the_async_client(server: Server) -> None:
    async def scenario() -> None:
        async with hydraplan.AsyncClient(server.url, token=TOKEN) as client:
            plans = await asyncio.gather(*(client.plan(TINY_LENGTHS[i:], **TINY) for i in range(2)))
            assert [len(plan.input_lengths) for plan in plans] == [len(TINY_LENGTHS), len(TINY_LENGTHS) - 1]
            assert (await client.check(plans[0]))["valid"] is True
            session_id = await client.open_session(**session_body())
            plan = await client.session_plan(session_id, TINY_LENGTHS)
            assert plan.num_gpus == 8
            await client.close_session(session_id)
            job = await client.submit_job({"kind": "plan", "request": plan_body()})
            assert (await client.job(job))["kind"] == "plan"
            with pytest.raises(hydraplan.ServiceError) as invalid:
                await client.plan([True], **TINY)
            assert invalid.value.field == "body.lengths.0"

    asyncio.run(scenario())


def test_the_readme_tour_client_example_runs(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    readme = ROOT / "README.md"
    code = readme.read_text(encoding="utf-8").split("### Serve it to a training orchestrator", 1)[1]
    code = code.split("```python", 1)[1].split("```", 1)[0]
    assert '"http://127.0.0.1:8000", token="change-me"' in code  # the example's server, swapped for the test's
    code = code.replace('"http://127.0.0.1:8000", token="change-me"', f"{server.url!r}, token={TOKEN!r}")
    exec(compile(code, str(readme), "exec"), {"__name__": "readme_tour"})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and all(line.endswith(" ms") for line in printed)


def test_the_service_doc_orchestrator_example_runs(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    doc = ROOT / "docs" / "service.md"
    code = doc.read_text(encoding="utf-8").split("\n## An orchestrator client\n", 1)[1]
    code = code.split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {"__name__": "doc_example"}
    exec(compile(code, str(doc), "exec"), namespace)
    plans = namespace["train"](server.url, TOKEN, [TINY_LENGTHS, TINY_LENGTHS[10:]])
    assert [plan.num_sequences for plan in plans] == [len(TINY_LENGTHS), len(TINY_LENGTHS) - 10]
    assert plans[1].previous_strategy == plans[0].strategy
    assert plans[0].plan_id in capsys.readouterr().out
    with pytest.raises(hydraplan.ServiceError):
        namespace["train"](server.url, TOKEN, [[100, 0]])
    out = capsys.readouterr().out
    assert "hydraplan refused step 0" in out and "(field body.lengths.1)" in out
