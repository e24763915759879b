"""The distribution: one `hydraplan` namespace in the wheel, clean metadata, and a wheel that works
from a fresh virtual environment beside a user's own `api/` and `planner/` packages.

The sdist and wheel are built once per session (`python -m build`, no isolation: the test extra
brings setuptools, wheel, build and twine) from a copy of the source tree, so the checkout itself
gets no `build/` or `*.egg-info` folders.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["planner", "cost_models", "api", "runtime"]
SOURCES = ["pyproject.toml", "README.md", "hydraplan", *LAYERS]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the sdist and the wheel built from a copy of the source tree."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("hydraplan-*.whl")
    return wheel


# Modules and data files, the web page's included (api/service/web/), the what-if report's template.
SHIPPED_SUFFIXES = {".py", ".json", ".txt", ".md", ".html", ".js", ".css", ".j2"}


def test_the_wheel_installs_only_the_hydraplan_namespace(dist: Path) -> None:
    names = zipfile.ZipFile(wheel_of(dist)).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"hydraplan"}
    # Every module and data file of every layer made it in (an unlisted subpackage would not).
    expected = {"hydraplan/__init__.py", "hydraplan/py.typed", "hydraplan/integrations/torch.py"}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*"):
            if path.is_file() and path.suffix in SHIPPED_SUFFIXES and "__pycache__" not in path.parts:
                expected.add(f"hydraplan/{path.relative_to(ROOT).as_posix()}")
    assert expected - set(names) == set()
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "hydraplan = hydraplan.api.cli:main" in zipfile.ZipFile(wheel_of(dist)).read(entry_points).decode()


def test_twine_accepts_the_metadata(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_wheel_works_in_a_fresh_venv_beside_decoy_packages(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    subprocess.run([*install, str(wheel_of(dist))], check=True, capture_output=True)
    # The dependencies (numpy, pydantic, the solvers) come from this interpreter's site-packages
    # through a .pth file; .pth files inside that folder are not run, so the editable hydraplan of
    # the checkout stays invisible there.
    venv_site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # (every site-packages folder of this interpreter: its own, and its base's when it is a venv)
    host_site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    host_site |= {entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages")}
    (venv_site / "host_dependencies.pth").write_text("\n".join(sorted(host_site)) + "\n")
    project = tmp_path / "user_project"
    for decoy in ["api", "planner", "runtime"]:
        (project / decoy).mkdir(parents=True)
        (project / decoy / "__init__.py").write_text(f"WHO = 'the user {decoy}'\n")
    probe = (
        "import api, planner, runtime, hydraplan, hydraplan.api.cli, hydraplan.planner.solve, hydraplan.runtime;"
        "print(api.WHO, planner.WHO, runtime.WHO, sep=',');"
        "print(hydraplan.__file__); print(hydraplan.api.cli.__file__); print(hydraplan.planner.solve.__file__)"
    )
    result = subprocess.run([str(python), "-c", probe], cwd=project, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "the user api,the user planner,the user runtime"
    for module_file in lines[1:]:
        assert Path(module_file).is_relative_to(venv_site), module_file
    # The console script runs the embedded default from the installed wheel.
    cli = subprocess.run(
        [str(venv / "bin" / "hydraplan"), "plan", "--time-limit-s", "0.3", "--json"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert '"schema_version"' in cli.stdout
