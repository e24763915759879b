"""Shared by the torch runtime tests: torch is required in CI, skipped (with the reason) elsewhere."""

from __future__ import annotations

import os

import pytest


def require_torch():
    """The torch module; a skip naming the missing extra locally, a failure when CI=true."""
    try:
        import torch
    except ImportError:
        message = "torch is not installed: pip install -e '.[runtime]' (torch==2.13.0, the CPU wheel)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)
    return torch


def assert_nccl_safe(reports: list[dict]) -> int:
    """Every step's point-to-point batches (a strategy switch's re-sharding, then the pipeline's),
    as the ranks posted them, complete under NCCL's
    ordering and rendezvous rules (`runtime.p2p_order.find_nccl_deadlock`); returns the batches checked."""
    from hydraplan.runtime.p2p_order import find_nccl_deadlock

    checked = 0
    for step in range(len(reports[0]["steps"])):
        traces = {}
        for report in reports:
            record = report["steps"][step]
            switch = (record.get("switch") or {}).get("p2p_batches", [])  # re-sharding comes first
            traces[report["rank"]] = [[tuple(message) for message in batch] for batch in switch + record["p2p_batches"]]
        problem = find_nccl_deadlock(traces)
        assert problem is None, f"step {step}: {problem}"
        checked += sum(map(len, traces.values()))
    return checked
