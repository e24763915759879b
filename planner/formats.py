"""The versioned file formats as JSON Schema: the contract for consumers that are not Python.

`hydraplan schema NAME` prints one; the committed copies under `docs/schemas/` are checked against
these models by the test suite, so a format change is always deliberate (and versioned by its
`schema_version`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from hydraplan.planner.schemas import (
    PLAN_SCHEMA,
    POOL_SCHEMA,
    PROFILE_SCHEMA,
    CostProfile,
    Plan,
    PlanRequest,
    StrategyPoolFile,
)

FORMATS: dict[str, tuple[type[BaseModel], str]] = {
    "plan": (Plan, PLAN_SCHEMA),
    "profile": (CostProfile, PROFILE_SCHEMA),
    "request": (PlanRequest, "hydraplan.request/1"),
    "pool": (StrategyPoolFile, POOL_SCHEMA),
}


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of format `name`, with its identity and version."""
    try:
        model, version = FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; valid: {', '.join(FORMATS)}") from None
    schema = model.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:{version.replace('/', ':v')}",
        "x-hydraplan-version": version,
        **schema,
    }
