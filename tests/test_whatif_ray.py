"""The Ray executor on a local Ray instance gives the rows of the in-process executor.

Skipped, with the reason printed, only where Ray is missing or cannot start; under CI=true (where
the test extra installs Ray) that is a failure instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from whatif_support import comparable, tiny_configurations

from hydraplan.api.whatif.executors import InlineExecutor, RayExecutor
from hydraplan.api.whatif.progress import SweepProgress
from hydraplan.api.whatif.results import RowsFile
from hydraplan.api.whatif.sweep import run_sweep

pytestmark = pytest.mark.slow


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Ray must run in CI: {reason}")
    pytest.skip(reason)


def test_ray_on_a_local_instance_gives_the_inline_rows(tmp_path: Path) -> None:
    try:
        import ray
    except ImportError:
        _unavailable("Ray is not installed (pip install 'hydraplan[whatif]')")
    configurations = tiny_configurations(num_gpus=[8, 16], seeds=2)
    executor = RayExecutor(None, 2)
    progress = SweepProgress(len(configurations), 0, enabled=False)
    try:
        rows = run_sweep(configurations, executor, RowsFile(tmp_path / "ray", configurations, False), progress)
    except (ConnectionError, RuntimeError, OSError) as exc:  # the local instance did not start
        if ray.is_initialized():
            ray.shutdown()
        _unavailable(f"a local Ray instance could not start: {type(exc).__name__}: {exc}")
    assert not ray.is_initialized()  # the instance it started is shut down again
    progress = SweepProgress(len(configurations), 0, enabled=False)
    inline = run_sweep(configurations, InlineExecutor(), RowsFile(tmp_path / "inline", configurations, False), progress)
    assert len(rows) == 2
    assert comparable(rows) == comparable(inline)
