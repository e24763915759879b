"""Imports flow one way: planner <- cost_models <- api; runtime depends only on the plan schema."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "planner": {"planner"},
    "cost_models": {"planner", "cost_models"},
    "runtime": {"runtime", "planner"},
    "api": {"api", "planner", "cost_models"},
}
PROJECT = set(ALLOWED) | {"benchmarks", "tests"}


def imported_project_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names & PROJECT


def test_packages_import_only_downstream_layers():
    offenders = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            extra = imported_project_packages(path) - allowed
            if extra:
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(extra)}")
    assert offenders == []


def test_runtime_uses_only_the_plan_schema_from_planner():
    for path in (ROOT / "runtime").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("planner"):
                assert node.module in {"planner.schemas", "planner.scheme"}, f"{path}: {node.module}"


def test_importing_the_planner_pulls_no_service_or_torch():
    code = (
        "import sys, planner, planner.solve, planner.check, cost_models.analytic;"
        "bad = [m for m in ('fastapi', 'uvicorn', 'torch', 'starlette') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
