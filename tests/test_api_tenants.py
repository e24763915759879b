"""Tenants (issue 29 item 6): a token file of digests, each tenant apart, an admin that sees all."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from api_support import assert_problem, make_client, plan_body, session_body, wait_for

from hydraplan.api.service.settings import Settings

pytestmark = pytest.mark.service
TOKENS = {"alice": "alice-token", "bob": "bob-token", "root": "root-token"}


def digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(name="tokens_file")
def tokens_file_fixture(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(
        "# tenants of the test server\n"
        f"alice {digest(TOKENS['alice'])}\n"
        f"bob   {digest(TOKENS['bob'])}   # a comment\n"
        "\n"
        f"root  {digest(TOKENS['root'])} admin\n",
        encoding="utf-8",
    )
    return str(path)


def as_(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def test_each_tenant_sees_only_its_own_state(tokens_file: str, user_profile_data: dict) -> None:
    with make_client(api_tokens_file=tokens_file) as client:
        assert_problem(client.get("/v1/models", headers={"Authorization": "Bearer nobody"}), 401)
        assert_problem(client.get("/v1/models", headers={"Authorization": f"Bearer {digest('alice-token')}"}), 401)
        job = client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}, headers=as_("alice")).json()
        session = client.post("/v1/sessions", json=session_body(), headers=as_("alice")).json()
        profile = client.post("/v1/profiles", json=user_profile_data, headers=as_("alice")).json()
        paths = [f"/v1/jobs/{job['job_id']}", f"/v1/sessions/{session['session_id']}"]
        paths.append(f"/v1/profiles/{profile['profile_id']}")
        for path in paths:
            assert client.get(path, headers=as_("alice")).status_code == 200
            assert client.get(path, headers=as_("root")).status_code == 200  # the admin sees all
            assert_problem(client.get(path, headers=as_("bob")), 404, "unknown")
            assert_problem(client.delete(path, headers=as_("bob")), 404, "unknown")
        assert client.get(paths[0], headers=as_("alice")).json()["owner"] == "alice"
        using = plan_body(model=None, gpu=None, profile_id=profile["profile_id"])
        assert_problem(client.post("/v1/plans", json=using, headers=as_("bob")), 404, profile["profile_id"])
        assert client.post("/v1/plans", json=using, headers=as_("alice")).status_code == 200
        # the same profile uploaded by bob is bob's own, under another id
        bobs = client.post("/v1/profiles", json=user_profile_data, headers=as_("bob")).json()
        assert bobs["profile_id"] != profile["profile_id"]
        wait_for(lambda: client.get(paths[0], headers=as_("alice")).json()["status"] == "succeeded", 30)
        for path in paths:
            assert client.delete(path, headers=as_("alice")).status_code == 204
            assert_problem(client.get(path, headers=as_("root")), 404)


def test_a_single_token_is_the_admin_default_tenant(tokens_file: str) -> None:
    """HYDRAPLAN_API_TOKEN beside the file is the tenant `default`, an admin: what it made before
    tenants existed stays visible to it."""
    with make_client(api_token="single", api_tokens_file=tokens_file) as client:
        job = client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}, headers=as_("alice")).json()
        seen = client.get(f"/v1/jobs/{job['job_id']}", headers={"Authorization": "Bearer single"})
        assert seen.status_code == 200 and seen.json()["owner"] == "alice"


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("alice alice-token", "line 1: the token must be given as sha256:"),
        ("Alice " + digest("x"), "line 1: tenant 'Alice'"),
        ("alice " + digest("x") + " root", "line 1: expected"),
        (f"alice {digest('x')}\nbob {digest('x')}", "line 2: the same token digest"),
        ("# nothing\n", "lists no token"),
    ],
)
def test_a_bad_token_file_stops_the_start_naming_its_line(tmp_path: Path, line: str, named: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="HYDRAPLAN_API_TOKENS_FILE") as raised:
        Settings.from_env({"HYDRAPLAN_API_TOKENS_FILE": str(path)})
    assert named in str(raised.value)
    assert "alice-token" not in str(raised.value)  # a token in clear is refused, never echoed


def test_quotas_hold_each_tenant_to_its_share(tokens_file: str, user_profile_data: dict) -> None:
    """Per-tenant caps: one tenant's full quota neither blocks another tenant nor an admin, and
    DELETE gives the place back."""
    quotas = {"max_jobs_per_tenant": 1, "max_sessions_per_tenant": 1, "max_profiles_per_tenant": 1}
    with make_client(api_tokens_file=tokens_file, **quotas) as client:
        job = client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}, headers=as_("alice")).json()
        session = client.post("/v1/sessions", json=session_body(), headers=as_("alice")).json()
        profile = client.post("/v1/profiles", json=user_profile_data, headers=as_("alice")).json()
        other = {**user_profile_data, "notes": "another"}
        for path, body, named in (
            ("/v1/jobs", {"kind": "plan", "request": plan_body()}, "tenant 'alice' keeps at most 1 jobs"),
            ("/v1/sessions", session_body(), "tenant 'alice' keeps at most 1 live sessions"),
            ("/v1/profiles", other, "tenant 'alice' keeps at most 1 uploaded profiles"),
        ):
            assert_problem(client.post(path, json=body, headers=as_("alice")), 507, named)
            assert client.post(path, json=body, headers=as_("bob")).status_code in (201, 202)
            assert client.post(path, json=body, headers=as_("root")).status_code in (201, 202)
        wait_for(lambda: client.get(f"/v1/jobs/{job['job_id']}", headers=as_("alice")).json()["status"] == "succeeded")
        for path in (
            f"/v1/jobs/{job['job_id']}",
            f"/v1/sessions/{session['session_id']}",
            f"/v1/profiles/{profile['profile_id']}",
        ):
            assert client.delete(path, headers=as_("alice")).status_code == 204
        again = client.post("/v1/jobs", json={"kind": "plan", "request": plan_body()}, headers=as_("alice"))
        assert again.status_code == 202
        assert client.post("/v1/sessions", json=session_body(), headers=as_("alice")).status_code == 201
        assert client.post("/v1/profiles", json=other, headers=as_("alice")).status_code == 201
