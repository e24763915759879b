"""Install truth: every module of the installed package imports with what the test extra declares,
and the environment's requirements are consistent (`pip check`).

`.ci/run` runs the suite in a fresh virtual environment that holds only what the README's second
set-up line installs, so an import of a package no extra declares fails here, not on a user's
machine (scipy once passed CI only because the machine had it by hand)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import hydraplan

LAYERS = ("planner", "cost_models", "api", "runtime")


def all_module_names() -> list[str]:
    """Every module and package under the `hydraplan` namespace, as installed. The layers are
    walked from their own paths: an editable install maps them onto the top-level folders, which
    `hydraplan.__path__` does not contain."""
    names = {info.name for info in pkgutil.walk_packages(hydraplan.__path__, prefix="hydraplan.")}
    for layer in LAYERS:
        package = importlib.import_module(f"hydraplan.{layer}")
        names.add(package.__name__)
        names.update(info.name for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."))
    return sorted(names)


def test_the_walk_finds_every_layer() -> None:
    names = all_module_names()
    for layer in LAYERS:
        assert f"hydraplan.{layer}" in names
    assert "hydraplan.cost_models.fit" in names and "hydraplan.runtime.worker" in names
    assert len(names) > 120


IMPORT_EACH = """
import importlib, json, sys, traceback
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=3)
print(json.dumps(failed))
"""


def test_every_module_imports() -> None:
    """In a fresh process, so that nothing this test session imported first can stand in."""
    names = all_module_names()
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH, json.dumps(names)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{name}:\n{error}" for name, error in failed.items())


def test_pip_check_finds_no_broken_requirement() -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_importlib_reaches_the_fitter() -> None:
    """The module the missing declaration broke, in this process too (its NNLS comes from scipy)."""
    fit = importlib.import_module("hydraplan.cost_models.fit")
    assert callable(fit.build_profiled_profile)
