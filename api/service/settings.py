"""Service settings: every knob of the REST service, read from `HYDRAPLAN_*` environment variables.

This is the only module of the service that reads the environment. Each field `name` is set by the
variable `HYDRAPLAN_<NAME>` (e.g. `max_sequences` by `HYDRAPLAN_MAX_SEQUENCES`); an empty variable
counts as unset. Invalid values fail at start-up with the variable named.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from hydraplan.api.service.tenants import read_token_file
from hydraplan.planner import limits

ENV_PREFIX = "HYDRAPLAN_"
MIB = 1 << 20
SECRET_FIELDS = frozenset({"api_token"})  # never echoed in an error


class Settings(BaseModel):
    """Limits, concurrency, state and access settings of one service process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_token: str | None = Field(
        None,
        min_length=1,
        description="When set, every /v1 call needs `Authorization: Bearer <token>`.",
    )
    api_tokens_file: str | None = Field(
        None,
        min_length=1,
        description="A file of tenants' token digests ('<tenant> sha256:<hex> [admin]' per line): each tenant "
        "sees only its own jobs, sessions and profiles, an admin all (api/service/tenants.py).",
    )
    redis_url: str | None = Field(
        None,
        min_length=1,
        description="redis://host:port/db of the shared store; unset keeps state in-process.",
    )
    redis_prefix: str = Field("hydraplan:", description="Prefix of every Redis key.")
    max_sequences: int = Field(200_000, ge=1, description="Most sequences per request (413).")
    max_body_bytes: int = Field(16 * MIB, ge=1024, description="Largest request body (413).")
    max_body_bytes_in_flight: int | None = Field(
        None,
        ge=1024,
        description="Bytes of request bodies one worker holds at once, from their first byte until their "
        "response is sent (503 beyond, before reading); unset: max_body_bytes. Parsing JSON takes up to "
        "~70x its size in memory (a list of empty objects), so this bounds the memory bodies take.",
    )
    max_body_read_s: float = Field(
        30.0,
        gt=0,
        description="A body must have arrived whole this long after its request (408 otherwise): a client "
        "that declares a body and sends it slowly, or never, holds its share of the in-flight budget.",
    )
    max_num_gpus: int = Field(16_384, ge=1, description="Largest cluster a request may name (422).")
    max_check_operations: int = Field(
        200_000,
        ge=1,
        le=limits.MAX_SCHEDULE_OPERATIONS,
        description="Most 1F1B operations (2 x stages x micro-batches, over every plan of the body) that one "
        "/v1/plans/check or /v1/plans/timeline simulates (422): about 1.5 s of one core's time.",
    )
    max_sync_time_limit_s: float = Field(
        60.0, gt=0, description="Largest options.time_limit_s of a synchronous plan (422); 'auto' counts as 60 s."
    )
    max_concurrent_solves: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1),
        ge=1,
        description="Solves running at once in one process (threads off the event loop).",
    )
    max_queued_solves: int = Field(8, ge=0, description="Solves waiting for a free slot before new ones get 503.")
    retry_after_s: int = Field(1, ge=1, description="Retry-After of a 503 when saturated.")
    session_idle_timeout_s: float = Field(
        3600.0, gt=0, description="A session expires after this long without a request."
    )
    max_session_batches: int = Field(16, ge=1, description="Most batches of one session call.")
    job_workers: int = Field(2, ge=1, description="Background threads running jobs.")
    max_pending_jobs: int = Field(
        64, ge=1, description="Queued plus running jobs of one process before new ones get 503."
    )
    max_sweep_items: int = Field(64, ge=1, description="Most plans one sweep job may ask for (422).")
    max_sweep_sequences: int = Field(
        400_000, ge=1, description="Most sequences over all the items of one sweep (413), so its results stay small."
    )
    job_ttl_s: float = Field(86_400.0, gt=0, description="How long a job and its result are kept.")
    profile_ttl_s: float = Field(7 * 86_400.0, gt=0, description="How long an uploaded profile is kept.")
    max_profiles: int = Field(128, ge=1, description="Uploaded profiles kept at once (507 when full).")
    max_profile_bytes: int = Field(4 * MIB, ge=1024, description="Largest uploaded profile, as stored JSON (413).")
    max_sessions: int = Field(1024, ge=1, description="Live sessions at once (507 when full).")
    max_jobs: int = Field(256, ge=1, description="Jobs kept at once, finished ones until job_ttl_s (507 when full).")
    max_jobs_per_tenant: int | None = Field(
        None, ge=1, description="Jobs one tenant (not an admin) keeps at once (507 beyond); unset: only max_jobs."
    )
    max_sessions_per_tenant: int | None = Field(
        None, ge=1, description="Live sessions of one tenant (not an admin) (507 beyond); unset: only max_sessions."
    )
    max_profiles_per_tenant: int | None = Field(
        None, ge=1, description="Uploaded profiles of one tenant (not an admin) (507 beyond); unset: only max_profiles."
    )
    max_job_bytes: int = Field(
        32 * MIB, ge=1024, description="Largest stored job value (a plan or a sweep item); a larger result fails."
    )
    lease_ttl_s: float = Field(
        10.0, gt=0, description="A dead worker's session locks and running jobs are released after this long."
    )
    store_retry_s: float = Field(
        30.0,
        ge=0,
        description="How long a job rides out a store outage: every read and write of its loop is retried "
        "(exponential backoff up to 1 s) this long before the job gives up.",
    )
    shutdown_grace_s: float = Field(
        10.0, ge=0, description="How long a graceful shutdown waits for running jobs to record their state."
    )
    profile_cache_bytes: int = Field(
        64 * MIB, ge=MIB, description="Memory for analytic and uploaded profiles kept parsed (half each)."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Level of the JSON logs.")

    @field_validator("api_token")
    @classmethod
    def _token_fits_a_header(cls, token: str | None) -> str | None:
        """A token must travel in an HTTP header (ISO-8859-1, and clients send ASCII): one with
        other characters, or with spaces, could never authenticate. The error names the
        position, never the secret."""
        if token is None:
            return None
        for position, character in enumerate(token):
            if not (character.isascii() and character.isprintable()) or character.isspace():
                raise ValueError(
                    f"character {position + 1} of the token (U+{ord(character):04X}) is not printable ASCII "
                    "without spaces; an Authorization header could never carry it"
                )
        return token

    @field_validator("api_tokens_file")
    @classmethod
    def _token_file_reads(cls, path: str | None) -> str | None:
        if path is not None:
            read_token_file(path)  # a bad file stops the service at start-up, naming its line
        return path

    @field_validator("max_body_bytes_in_flight")
    @classmethod
    def _budget_holds_a_body(cls, budget: int | None, info: ValidationInfo) -> int | None:
        largest = info.data.get("max_body_bytes")
        if budget is not None and largest is not None and budget < largest:
            raise ValueError(f"{budget} is below max_body_bytes {largest}: no body of the largest size could be read")
        return budget

    @property
    def body_bytes_in_flight(self) -> int:
        """The in-flight body budget in effect (`max_body_bytes` when unset)."""
        return self.max_body_bytes_in_flight or self.max_body_bytes

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from `HYDRAPLAN_*` variables of `environ` (default `os.environ`)."""
        environ = os.environ if environ is None else environ
        values = {}
        for name in cls.model_fields:
            raw = environ.get(env_var(name), "").strip()
            if raw:
                values[name] = raw
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            name = str(first["loc"][0]) if first["loc"] else ""
            shown = "<hidden>" if name in SECRET_FIELDS else repr(values.get(name))
            raise ValueError(f"{env_var(name)}={shown}: {first['msg']}") from None


def env_var(field_name: str) -> str:
    """The environment variable that sets `field_name`."""
    return ENV_PREFIX + field_name.upper()
