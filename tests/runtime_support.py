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
