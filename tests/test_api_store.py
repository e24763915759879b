"""The store interface, against both backends: in-process memory and a real Redis server.

Two app instances sharing one Redis (as two workers or replicas would) see the same sessions,
uploaded profiles and jobs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from api_support import make_client, plan_body, redis_url_fixture, session_body, wait_for  # noqa: F401

from hydraplan.api.service.store import MemoryStore, RedisStore, Store, StoreUnavailable, open_store

pytestmark = pytest.mark.service


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    url = request.getfixturevalue("redis_url")
    backend = RedisStore(url, prefix=f"test-{time.monotonic_ns()}:")
    yield backend
    backend.close()


def test_get_set_delete(store: Store) -> None:
    assert store.get("a") is None
    assert store.set("a", '{"x": 1}')
    assert store.get("a") == '{"x": 1}'
    assert store.delete("a") is True
    assert store.delete("a") is False
    assert store.get("a") is None


def test_set_if_absent_and_delete_if_equal(store: Store) -> None:
    assert store.set("lock", "me", 10, only_if_absent=True)
    assert not store.set("lock", "you", 10, only_if_absent=True)
    assert not store.delete_if_equal("lock", "you")
    assert store.get("lock") == "me"
    assert store.delete_if_equal("lock", "me")
    assert store.set("lock", "you", 10, only_if_absent=True)


def test_ttl_and_expire(store: Store) -> None:
    store.set("short", "v", ttl_s=0.2)
    store.set("kept", "v", ttl_s=0.2)
    assert store.expire("kept", 5)
    assert not store.expire("missing", 5)
    wait_for(lambda: store.get("short") is None, timeout_s=5)
    assert store.get("kept") == "v"
    store.ping()


def test_renew_if_equal_is_a_lease_heartbeat(store: Store) -> None:
    assert store.set("lease", "owner", ttl_s=0.3)
    assert not store.renew_if_equal("lease", "intruder", 5)
    assert store.renew_if_equal("lease", "owner", 5)
    time.sleep(0.5)
    assert store.get("lease") == "owner"  # renewed past its first TTL
    assert not store.renew_if_equal("missing", "owner", 5)


def test_admit_caps_live_members(store: Store) -> None:
    assert store.admit("reg", "a", 0.3, max_members=2)
    assert store.admit("reg", "b", 30, max_members=2)
    assert not store.admit("reg", "c", 30, max_members=2)  # full
    assert store.admit("reg", "b", 30, max_members=2)  # a known member renews
    wait_for(lambda: store.admit("reg", "c", 30, max_members=2), timeout_s=5)  # "a" expired
    assert not store.admit("reg", "d", 30, max_members=2)
    store.forget("reg", "b")
    assert store.admit("reg", "d", 30, max_members=2)
    assert store.admit("other", "x", 30, max_members=1)  # registries are separate


def test_open_store_picks_the_backend(redis_url: str) -> None:
    assert isinstance(open_store(None), MemoryStore)
    redis_store = open_store(redis_url)
    assert isinstance(redis_store, RedisStore) and redis_store.backend == "redis"
    redis_store.close()


def test_unreachable_redis_is_503() -> None:
    from api_support import free_port

    with make_client(redis_url=f"redis://127.0.0.1:{free_port()}/0") as test_client:
        ready = test_client.get("/readyz")
        assert ready.status_code == 503
        assert ready.headers["content-type"].startswith("application/problem+json")
        assert "redis store unavailable" in ready.json()["detail"]
        assert test_client.get("/v1/sessions/ses-x").status_code == 503


def test_two_apps_share_sessions_profiles_and_jobs(redis_url: str, user_profile_data: dict) -> None:
    prefix = f"shared-{time.monotonic_ns()}:"
    with (
        make_client(redis_url=redis_url, redis_prefix=prefix) as first,
        make_client(redis_url=redis_url, redis_prefix=prefix) as second,
    ):
        assert first.get("/readyz").json()["store"] == "redis"

        session_id = first.post("/v1/sessions", json=session_body()).json()["session_id"]
        planned = second.post(f"/v1/sessions/{session_id}/plans", json={"lengths": plan_body()["lengths"]})
        assert planned.status_code == 200, planned.text
        view = first.get(f"/v1/sessions/{session_id}").json()
        assert view["num_plans"] == 1 and view["last_plan_id"] == planned.json()["plan_id"]

        profile_id = first.post("/v1/profiles", json=user_profile_data).json()["profile_id"]
        assert second.get(f"/v1/profiles/{profile_id}").status_code == 200

        job_id = first.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}).json()["job_id"]
        finished = wait_for(lambda: (view := second.get(f"/v1/jobs/{job_id}").json())["status"] == "succeeded" and view)
        assert finished["result"]["input_lengths"] == plan_body()["lengths"]
        assert second.delete(f"/v1/jobs/{job_id}").status_code == 204  # finished: deleted on any worker
        assert first.get(f"/v1/jobs/{job_id}").status_code == 404
        assert second.delete(f"/v1/profiles/{profile_id}").status_code == 204
        assert first.get(f"/v1/profiles/{profile_id}").status_code == 404  # its parsed copy is not used
        assert first.post("/v1/plans", json=plan_body(model=None, gpu=None, profile_id=profile_id)).status_code == 404

        assert second.delete(f"/v1/sessions/{session_id}").status_code == 204
        assert first.get(f"/v1/sessions/{session_id}").status_code == 404


def test_cancel_through_another_app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """DELETE on one worker stops a job running on another (the flag travels through Redis)."""
    import hydraplan.api.service.planning

    real_solve = hydraplan.api.service.planning.solve

    def anytime_solve(request, profile, baselines=(), previous_plan=None, cancel=None):
        wait_for(lambda: cancel is not None and cancel(), timeout_s=10)
        return real_solve(request, profile, baselines=baselines)

    monkeypatch.setattr(hydraplan.api.service.planning, "solve", anytime_solve)
    prefix = f"cancel-{time.monotonic_ns()}:"
    with (
        make_client(redis_url=redis_url, redis_prefix=prefix) as runner,
        make_client(redis_url=redis_url, redis_prefix=prefix) as other,
    ):
        job_id = runner.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}).json()["job_id"]
        wait_for(lambda: other.get(f"/v1/jobs/{job_id}").json()["status"] == "running")
        assert other.delete(f"/v1/jobs/{job_id}").status_code == 202
        view = wait_for(lambda: (view := runner.get(f"/v1/jobs/{job_id}").json())["status"] == "cancelled" and view)
        assert view["result"] is not None and view["cancel_requested"] is True


def test_store_errors_are_store_unavailable() -> None:
    from api_support import free_port

    unreachable = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    with pytest.raises(StoreUnavailable):
        unreachable.get("x")
