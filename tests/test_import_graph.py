"""Imports flow one way: planner <- cost_models <- api; runtime depends only on the plan schema,
the measurement types its profiler writes and the plan checker (to refuse a plan that fails it
before any compute), and on the model catalog, to build a catalog model; api imports the runtime
only inside functions. torch is imported inside runtime/ only.

Every layer imports the others through the one namespace, `hydraplan.<layer>`; a bare `planner` or
`api` import would only work from the repository root and is an error here.

Inside api, the parts (its sub-packages and top-level modules) import one way too: the two front
doors, the command line (`cli`) and the REST service (`service`), sit on shared libraries
(`whatif`, `render`, `datasets`, `files`, `client`) that import neither front door; the service
never imports the CLI, and the CLI imports the service only inside `hydraplan serve`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "planner": {"planner"},
    "cost_models": {"planner", "cost_models"},
    "runtime": {"runtime", "planner", "cost_models"},
    "api": {"api", "planner", "cost_models"},
}
# Layers a layer may import only inside a function, never at module level: `hydraplan run`
# (api/cli/run.py) and `hydraplan profile --device` (api/cli/profile.py) import the runtime when
# the command runs, so the CLI never needs torch.
ALLOWED_LAZY = {"api": {"runtime"}}
PROJECT = set(ALLOWED) | {"benchmarks", "tests"}
# The parts of api (its sub-packages and top-level modules) and the other parts each may import.
API_ALLOWED = {
    # the front doors
    "cli": {"files", "datasets", "render", "whatif", "client"},
    "service": {"datasets", "render", "whatif"},
    # the libraries they share: what-if sweeps (CLI and sweep jobs), timelines, sample batches,
    # the readers of user files (CLI and what-if spec files), the REST clients
    "whatif": {"files", "datasets"},
    "render": set(),
    "datasets": set(),
    "files": set(),
    "client": set(),
}
# Parts a part may import only inside a function: `hydraplan serve` imports the service's server
# when the command runs, so the CLI never needs FastAPI.
API_ALLOWED_LAZY = {"cli": {"service"}}


def imported_modules(path: Path) -> list[str]:
    """Absolute module names a file imports (relative imports are not used in this project)."""
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names.append(node.module)
    return names


def imported_project_packages(path: Path) -> set[str]:
    """The layers a file imports: `hydraplan.planner.solve` -> `planner`."""
    layers = set()
    for name in imported_modules(path):
        parts = name.split(".")
        if parts[0] == "hydraplan" and len(parts) > 1:
            layers.add(parts[1])
    return layers & PROJECT


def test_layers_are_imported_only_through_the_namespace():
    offenders = []
    for folder in [*ALLOWED, "benchmarks", "tests", "hydraplan"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            bare = {name for name in imported_modules(path) if name.split(".")[0] in ALLOWED}
            if bare:
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bare)}")
    assert offenders == []


def test_packages_import_only_downstream_layers():
    offenders = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            extra = imported_project_packages(path) - allowed - ALLOWED_LAZY.get(package, set())
            if extra:
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(extra)}")
    assert offenders == []


def test_lazily_allowed_layers_are_not_imported_at_module_level():
    offenders = []
    for package, lazy in ALLOWED_LAZY.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in tree.body:  # module-level statements only (a function body is not walked)
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module]
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "hydraplan" and len(parts) > 1 and parts[1] in lazy:
                        offenders.append(f"{path.relative_to(ROOT)} imports {name} at module level")
    assert offenders == []


def test_runtime_uses_only_the_plan_schema_measurements_and_checker_from_planner():
    for path in (ROOT / "runtime").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("hydraplan.planner"):
                allowed = {
                    "hydraplan.planner.schemas",
                    "hydraplan.planner.scheme",
                    "hydraplan.planner.measurements",
                    "hydraplan.planner.check",
                }
                assert node.module in allowed, f"{path}: {node.module}"


def test_runtime_uses_only_the_model_catalog_from_cost_models():
    for path in (ROOT / "runtime").rglob("*.py"):
        for name in imported_modules(path):
            if name.startswith("hydraplan.cost_models"):
                assert name == "hydraplan.cost_models.catalog", f"{path}: {name}"


def test_torch_is_imported_only_inside_the_runtime():
    offenders = []
    for folder in [*(set(ALLOWED) - {"runtime"}), "hydraplan"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(name.split(".")[0] == "torch" for name in imported_modules(path)):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_importing_the_planner_pulls_no_service_or_torch():
    code = (
        "import sys, hydraplan, hydraplan.planner.solve, hydraplan.planner.check, hydraplan.cost_models.analytic;"
        "bad = [m for m in ('fastapi', 'uvicorn', 'torch', 'starlette') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_whatif_engine_imports_no_plotting_ray_service_or_torch():
    """Workers import the engine for every task: matplotlib and Ray load only when used."""
    code = (
        "import sys, hydraplan.api.whatif.engine, hydraplan.api.whatif.spec, hydraplan.api.whatif.executors,"
        " hydraplan.api.whatif.sweep, hydraplan.api.cli.whatif;"
        "bad = [m for m in ('matplotlib', 'ray', 'fastapi', 'starlette', 'torch') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------
# Inside api: the front doors and the libraries they share
# ---------------------------------------------------------------------------------------------


def api_part(path: Path) -> str:
    """The part of api a file belongs to: `api/cli/plan.py` -> `cli`, `api/files.py` -> `files`."""
    return path.relative_to(ROOT / "api").parts[0].removesuffix(".py")


def api_imports(path: Path) -> list[tuple[str, str, bool]]:
    """(api part, imported module, imported inside a function) for every import of an api part."""
    tree = ast.parse(path.read_text())
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function.update(id(inner) for inner in ast.walk(node) if inner is not node)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "hydraplan.api":  # `from hydraplan.api import cli`
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["hydraplan", "api"] and len(parts) > 2:
                found.append((parts[2], module, id(node) in in_function))
    return found


def test_every_part_of_api_has_its_import_rule():
    """A new sub-package or top-level module of api must say what it may import."""
    parts = {api_part(path) for path in (ROOT / "api").glob("*") if path.name not in ("__init__.py", "__pycache__")}
    assert parts == set(API_ALLOWED)


def test_api_parts_import_only_the_parts_below_them():
    offenders = []
    for path in sorted((ROOT / "api").rglob("*.py")):
        if path.parent == ROOT / "api" and path.name == "__init__.py":
            continue
        part = api_part(path)
        allowed = {part} | API_ALLOWED.get(part, set()) | API_ALLOWED_LAZY.get(part, set())
        for imported, module, _ in api_imports(path):
            if imported not in allowed:
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []


def test_the_cli_imports_only_the_server_of_the_service_and_only_when_serving():
    offenders = []
    for part, lazy in API_ALLOWED_LAZY.items():
        for path in sorted((ROOT / "api" / part).rglob("*.py")):
            for imported, module, in_function in api_imports(path):
                if imported in lazy and (not in_function or module != "hydraplan.api.service.server"):
                    offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []


def test_the_api_package_itself_imports_nothing():
    """`import hydraplan.api.<part>` runs api/__init__.py first: it must stay empty of imports."""
    tree = ast.parse((ROOT / "api" / "__init__.py").read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
