"""Mutation testing of the guarantees: does the test suite notice when the checker, the 1F1B
simulator, the bound code or the API's token guard is broken?

    python benchmarks/mutation.py                       # every target (an hour or more on 2 cores)
    python benchmarks/mutation.py --targets checker,auth
    python benchmarks/mutation.py --targets simulate --sessions DIR    # keep the session databases
    python benchmarks/mutation.py --targets simulate --recheck DIR     # rerun DIR's survivors on HEAD
                                                                       # (each one's outcome: DIR/<target>-recheck.json)
    python benchmarks/mutation.py --targets bounds --workdir DIR --sessions DIR   # resumable: rerun to go on
    python benchmarks/mutation.py --targets verify-bound --sample 300 --seed 1    # a seeded random sample

Cosmic Ray (`pip install cosmic-ray`) mutates one file at a time *in place*, so the run happens in
a throwaway copy of the committed tree (`git archive HEAD`), installed editable into its own
virtual environment on top of this interpreter's packages; the checkout is never touched. Each
mutant runs the focused tests of its target (first failure stops it). Binary-operator swaps to
bitwise, shift, power and modulo operators are left out: they mostly make type errors that any
test kills, at a large cost in run time. The scores go to a section of benchmarks/RESULTS.md; the
survivors are listed only in benchmarks/results/mutation-<targets>.md (a recheck's outcomes beside
its run's), where each one is killed by a new test or explained.

Each mutant's tests start without pytest's plugin autoloading (only Hypothesis's plugin: the other
installed plugins cost seconds per mutant and none of these tests use them), and the exhaustive
optima of `tests/test_exhaustive.py` are enumerated once and shared between mutants (they depend
only on that file and planner/reference.py, which the bound code's mutants do not touch). Before
mutating, the focused tests must pass on the unmutated copy. `--workdir DIR` keeps the copy, its
venv and the session in DIR: a run stopped part way (the bound code's ~1,100 mutants take hours)
goes on from where it stopped when the same command is given again.

`--sample N` runs a uniform random sample of N mutants (seeded, so the same tree and seed give the
same sample) where the whole file would take too long (the verifier's ~2,500 take most of a day on
2 cores): the others are marked skipped ("not sampled") in the session, and the report gives the
score with its 95% Wilson interval as an estimate of the whole file's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import command_line, markdown_table, write_result

ROOT = Path(__file__).resolve().parents[1]
COSMIC_RAY = "cosmic-ray==8.7.0"
EXCLUDED_OPERATORS = [
    "core/ReplaceBinaryOperator_.*_(BitOr|BitAnd|BitXor|LShift|RShift|Pow|Mod|FloorDiv)",
    "core/ReplaceBinaryOperator_(BitOr|BitAnd|BitXor|LShift|RShift|Pow|Mod|FloorDiv)_.*",
]


@dataclass(frozen=True)
class Target:
    name: str
    module_path: str
    tests: tuple[str, ...]


TARGETS = {
    target.name: target
    for target in (
        Target("checker", "planner/check.py", ("tests/test_check.py", "tests/test_check_claims.py")),
        Target("reference", "planner/reference.py", ("tests/test_check_reference.py", "tests/test_check.py")),
        Target("simulate", "planner/simulate.py", ("tests/test_simulate.py", "tests/test_check_reference.py")),
        Target(
            "bubble-floor",
            "planner/bubble_floor.py",
            ("tests/test_bubble_floor_table.py", "tests/test_bubble_floor.py", "tests/test_bounds.py"),
        ),
        # the bound tests first (seconds), then the end-to-end exhaustive optimum (half a minute)
        Target(
            "bounds",
            "planner/bounds.py",
            (
                "tests/test_bound_values.py",
                "tests/test_bound_sets.py",
                "tests/test_bound_set_packing.py",
                "tests/test_bound_replica_split.py",
                "tests/test_bound_bubble_dual.py",
                "tests/test_bound_packing.py",
                "tests/test_bounds.py",
                "tests/test_exhaustive.py",
            ),
        ),
        Target("auth", "api/service/auth.py", ("tests/test_api_auth.py",)),
        # the independent bound verifier: its parts against their definitions (seconds), then
        # tampered certificates and the exhaustive optima
        Target(
            "verify-bound",
            "planner/verify_bound.py",
            ("tests/test_verify_bound_parts.py", "tests/test_verify_bound_kinds.py", "tests/test_verify_bound.py"),
        ),
    )
}


def prepare(workdir: Path) -> Path:
    """A copy of the committed tree with its own venv (this interpreter's packages + Cosmic Ray)."""
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive, check=True)
    venv = workdir / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    if sys.prefix != sys.base_prefix:  # run from a venv: the system's packages are not this interpreter's
        import site

        site_packages = next(venv.glob("lib/python*/site-packages"))
        (site_packages / "_parent_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", COSMIC_RAY], check=True)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(workdir)], check=True
    )
    return venv / "bin"


def config_text(target: Target, python: Path, timeout_s: float) -> str:
    excluded = ", ".join(json.dumps(pattern) for pattern in EXCLUDED_OPERATORS)
    return f"""[cosmic-ray]
module-path = "{target.module_path}"
timeout = {timeout_s}
excluded-modules = []
test-command = "{" ".join(_test_command(target, python))}"

[cosmic-ray.distributor]
name = "local"

[cosmic-ray.filters.operators-filter]
exclude-operators = [{excluded}]
"""


def _test_command(target: Target, python: Path) -> list[str]:
    plugins = ["-p", "no:cacheprovider", "-p", "_hypothesis_pytestplugin"]
    return [str(python), "-m", "pytest", "-x", "-q", *plugins, *target.tests]


def _test_env(workdir: Path) -> dict[str, str]:
    """The environment of every test run: no plugin autoloading, the shared exhaustive optima."""
    return {
        **os.environ,
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "HYDRAPLAN_EXHAUSTIVE_OPTIMA": str(workdir / "exhaustive-optima.json"),
    }


def _dump(bin_dir: Path, session: Path, workdir: Path) -> list[tuple[dict, dict]]:
    dump = subprocess.run(
        [str(bin_dir / "cosmic-ray"), "dump", str(session)], cwd=workdir, capture_output=True, text=True, check=True
    )
    return [tuple(json.loads(line)) for line in dump.stdout.splitlines()]


def apply_recorded_mutation(source: str, diff: str) -> str | None:
    """`source` with the mutation a session recorded as a unified diff, found by the diff's lines
    rather than by position, so code moved since the run is still hit: the hunk with its context
    when that is still in `source` once, else its removed lines alone, nearest to where they were;
    None when those are gone (the code was changed)."""
    header, _, hunk = diff[diff.index("@@") :].partition("\n") if "@@" in diff else ("", "", "")
    before, after, removed, first_removed = [], [], [], None
    for line in hunk.splitlines():
        kind, text = (line[:1] or " "), line[1:]
        if kind in "- ":
            before.append(text)
        if kind in "+ ":
            after.append(text)
        if kind == "-":
            first_removed = len(before) - 1 if first_removed is None else first_removed
            removed.append(text)
    if first_removed is None:
        return None
    lines = source.split("\n")

    def hits(block: list[str]) -> list[int]:
        return [i for i in range(len(lines) - len(block) + 1) if lines[i : i + len(block)] == block]

    whole = hits(before)
    if len(whole) == 1:
        start, old = whole[0], before
        new = after
    else:
        was = int(header.split()[1].lstrip("-").split(",")[0]) - 1 + first_removed  # 0-based row in the run
        candidates = hits(removed)
        if not candidates:
            return None
        start, old = min(candidates, key=lambda i: abs(i - was)), removed
        new = after[first_removed : len(after) - (len(before) - first_removed - len(removed))]
    return "\n".join(lines[:start] + new + lines[start + len(old) :])


def recheck_target(
    target: Target, session: Path, workdir: Path, bin_dir: Path, timeout_s: float, known_killed: frozenset = frozenset()
) -> dict:
    """Apply each survivor of a kept session to this tree, rerun the focused tests: killed now or not.
    Mutants in `known_killed` (job ids an earlier recheck of this tree killed) are not rerun."""
    module = workdir / target.module_path
    original = module.read_text()
    started = time.perf_counter()
    rows, outcomes, taken = [], {}, 0
    for job, result in _dump(bin_dir, session, workdir):
        result = result or {}
        # a timeout counts as a kill; on a loaded machine it may be a slow survivor, so rerun those too
        if result.get("test_outcome") != "survived" and result.get("output") != "timeout":
            continue
        mutation = job["mutations"][0]
        diff = result.get("diff") or ""
        code = next((line[1:].strip() for line in diff.splitlines() if line.startswith("-") and line[1:2] != "-"), "")
        mutated = apply_recorded_mutation(original, diff)
        if mutated is None:
            now = "code changed"
        elif job["job_id"] in known_killed:
            now = "killed"
            taken += 1
        else:
            module.write_text(mutated)
            try:
                tests = subprocess.run(
                    _test_command(target, bin_dir / "python"),
                    cwd=workdir,
                    env=_test_env(workdir),
                    capture_output=True,
                    timeout=timeout_s,
                )
                now = "killed" if tests.returncode != 0 else "survives"
            except subprocess.TimeoutExpired:
                now = "timed out"
            finally:
                module.write_text(original)
        then = "survived" if result.get("test_outcome") == "survived" else "timed out"
        rows.append((mutation["start_pos"][0], mutation["operator_name"], code, then, now))
        outcomes[job["job_id"]] = now
    return {"rows": sorted(rows), "elapsed_s": time.perf_counter() - started, "outcomes": outcomes, "known": taken}


def recheck_report(results: dict[str, dict], screen: tuple[str, ...] | None = None) -> str:
    body = [
        "The survivors of a kept session (and the mutants whose tests timed out), each applied to the tree "
        "at HEAD (from the diff the session recorded, found by its lines: lines are those of the run) and "
        "run against its target's focused tests again"
        + (
            f" (here only {', '.join(f'`{name}`' for name in screen)}: `survives` means these tests miss it)."
            if screen
            else "."
        ),
    ]
    for name, result in results.items():
        rows = result["rows"]
        body += ["", f"### {recheck_line(name, result)}", ""]
        if result.get("known"):
            body += [
                f"{result['known']} of the kills are taken from earlier rechecks of this tree with some of these "
                "tests (`--known-killed`) and were not rerun.",
                "",
            ]
        body.append(
            markdown_table(
                ["line", "operator", "code", "in the run", "now"],
                [[row, op.removeprefix("core/"), f"`{code}`", then, now] for row, op, code, then, now in rows],
            )
        )
    return "\n".join(body)


def recheck_line(name: str, result: dict) -> str:
    """One target's recheck in a line: survivors killed now, timed-out mutants that fail again."""
    survivors = [row for row in result["rows"] if row[3] == "survived"]
    timeouts = [row for row in result["rows"] if row[3] == "timed out"]
    return (
        f"{name}: {sum(row[4] == 'killed' for row in survivors)} of {len(survivors)} survivors killed now; "
        f"{sum(row[4] != 'survives' for row in timeouts)} of {len(timeouts)} timed-out mutants fail "
        f"or time out again ({result['elapsed_s'] / 60:.0f} min)"
    )


NOT_SAMPLED = "not sampled"

# run by the copy's interpreter, where Cosmic Ray is installed: keep a seeded sample of the pending
# mutants (chosen from their job ids in sorted order) and mark the others skipped
_SAMPLE_SCRIPT = """
import random, sys
from cosmic_ray.work_db import use_db, WorkDB
from cosmic_ray.work_item import WorkResult, WorkerOutcome
session, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with use_db(session, WorkDB.Mode.open) as db:
    pending = sorted(item.job_id for item in db.pending_work_items)
    kept = set(random.Random(seed).sample(pending, min(size, len(pending))))
    left = [job for job in pending if job not in kept]
    db.set_multiple_results(left, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=sys.argv[4]))
print(len(kept), len(left))
"""


def sample_session(bin_dir: Path, session: Path, size: int, seed: int) -> tuple[int, int]:
    """Keep `size` of the session's pending mutants (seeded); the others are marked not sampled."""
    done = subprocess.run(
        [str(bin_dir / "python"), "-c", _SAMPLE_SCRIPT, str(session), str(size), str(seed), NOT_SAMPLED],
        capture_output=True,
        text=True,
        check=True,
    )
    kept, left = (int(word) for word in done.stdout.split())
    return kept, left


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for z = 1.96)."""
    if trials == 0:
        return 0.0, 1.0
    share = successes / trials
    centre = (share + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * (share * (1 - share) / trials + z * z / (4 * trials * trials)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def run_target(
    target: Target,
    workdir: Path,
    bin_dir: Path,
    timeout_s: float,
    execute: bool = True,
    sample: tuple[int, int] | None = None,
) -> dict:
    """Mutate one file; the counts and every surviving mutant (line, operator, the code mutated).
    Without `execute`, only the counts of the session kept in `workdir` as it stands."""
    config, session = workdir / f"{target.name}.toml", workdir / f"{target.name}.sqlite"
    config.write_text(config_text(target, bin_dir / "python", timeout_s))
    started = time.perf_counter()
    # a run stopped mid-mutant leaves its file mutated: put back the copy taken before the first
    module, pristine = workdir / target.module_path, workdir / ".pristine" / target.module_path
    if pristine.exists():
        shutil.copy(pristine, module)
    else:
        pristine.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(module, pristine)
    if not execute:
        return _summary(target, workdir, bin_dir, session, None)
    baseline = subprocess.run(
        _test_command(target, bin_dir / "python"), cwd=workdir, env=_test_env(workdir), capture_output=True, text=True
    )
    if baseline.returncode != 0:
        raise SystemExit(f"{target.name}: the focused tests fail without any mutation:\n{baseline.stdout[-2000:]}")

    def run(*command: str) -> None:
        arguments = [str(session), str(config)] if command == ("cr-filter-operators",) else [str(config), str(session)]
        subprocess.run(
            [str(bin_dir / command[0]), *command[1:], *arguments], cwd=workdir, env=_test_env(workdir), check=True
        )

    if not session.exists():  # else a stopped run goes on (with the sample it was given)
        run("cosmic-ray", "init")
        run("cr-filter-operators")
        if sample is not None:
            sample_session(bin_dir, session, *sample)
    run("cosmic-ray", "exec")
    return _summary(target, workdir, bin_dir, session, started)


def _summary(target: Target, workdir: Path, bin_dir: Path, session: Path, started: float | None) -> dict:
    source = (workdir / target.module_path).read_text().splitlines()
    counts = {"killed": 0, "survived": 0, "incompetent": 0, "skipped": 0, "pending": 0, "not sampled": 0}
    survivors = []
    for job, result in _dump(bin_dir, session, workdir):
        result = result or {}
        outcome = result.get("test_outcome") or result.get("worker_outcome") or "pending"
        if outcome == "skipped" and result.get("output") == NOT_SAMPLED:
            outcome = "not sampled"
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "survived":
            mutation = job["mutations"][0]
            row = mutation["start_pos"][0]
            survivors.append((row, mutation["operator_name"], source[row - 1].strip()))
    return {
        "counts": counts,
        "survivors": sorted(survivors),
        "elapsed_s": None if started is None else time.perf_counter() - started,  # None: not run now
        "session": session,
    }


def score_table(results: dict[str, dict]) -> str:
    """Mutants run, killed and survived per target: the summary of a run."""
    rows = []
    for name, result in results.items():
        counts = result["counts"]
        tested = counts["killed"] + counts["survived"]
        score = f"{100 * counts['killed'] / tested:.1f}%" if tested else "-"
        if tested and counts.get("not sampled"):
            low, high = wilson_interval(counts["killed"], tested)
            score += f" (95%: {100 * low:.1f}-{100 * high:.1f}%; a sample: {counts['not sampled']} not sampled)"
        rows.append(
            [
                name,
                TARGETS[name].module_path,
                tested,
                counts["killed"],
                counts["survived"],
                score,
                counts["pending"],
                "-" if result["elapsed_s"] is None else f"{result['elapsed_s'] / 60:.0f} min",
            ]
        )
    return markdown_table(["target", "file", "mutants run", "killed", "survived", "score", "not run yet", "time"], rows)


def report(results: dict[str, dict]) -> str:
    """The scores and every surviving mutant (line, operator, the code mutated), per target."""
    body = [
        "Each target file is mutated by Cosmic Ray (every operator but binary swaps to bitwise, shift, "
        "power and modulo operators); a mutant is killed when its target's focused tests fail.",
        "",
        score_table(results),
    ]
    for name, result in results.items():
        if result["survivors"]:
            body += ["", f"### Surviving mutants: {name}", ""]
            body.append(
                markdown_table(
                    ["line", "operator", "code"],
                    [[row, operator.removeprefix("core/"), f"`{code}`"] for row, operator, code in result["survivors"]],
                )
            )
    return "\n".join(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated: " + ", ".join(TARGETS))
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per mutant (a hang counts as killed)")
    parser.add_argument("--sessions", type=Path, help="keep each target's session database here (<target>.sqlite)")
    parser.add_argument("--recheck", type=Path, help="rerun the survivors of the sessions kept in this folder")
    parser.add_argument("--workdir", type=Path, help="keep the mutated copy here; a stopped run goes on from DIR")
    parser.add_argument(
        "--report-only", action="store_true", help="write the section from the --workdir sessions as they stand"
    )
    parser.add_argument(
        "--sample", type=int, help="run a seeded uniform random sample of this many mutants per target (a new session)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (with --sample)")
    parser.add_argument(
        "--known-killed",
        type=Path,
        help="with --recheck: a JSON of job ids (a list, or an object whose values say 'killed') that earlier "
        "rechecks of this tree killed with these tests: not rerun, reported as killed",
    )
    parser.add_argument(
        "--tests",
        help="with --recheck: comma-separated test files to run instead of the target's focused tests (a quick "
        "screen: a mutant they kill is killed; one they miss may still fall to the others)",
    )
    args = parser.parse_args()
    names = [name.strip() for name in args.targets.split(",") if name.strip()]
    unknown = [name for name in names if name not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; valid: {', '.join(TARGETS)}")
    if args.report_only and args.workdir is None:
        parser.error("--report-only reads the sessions of a --workdir")
    if args.recheck is not None and args.workdir is not None:
        parser.error("--recheck applies the survivors to HEAD's tree: it takes no --workdir")
    if args.tests is not None and args.recheck is None:
        parser.error("--tests narrows a --recheck")
    if args.sample is not None and (args.sample < 1 or args.recheck is not None or args.report_only):
        parser.error(f"--sample {args.sample}: a positive count, for a run (not with --recheck or --report-only)")
    known_killed: frozenset = frozenset()
    if args.known_killed is not None:
        if args.recheck is None:
            parser.error("--known-killed goes with --recheck")
        try:
            known = json.loads(args.known_killed.read_text())
        except (OSError, ValueError) as error:
            parser.error(f"--known-killed {args.known_killed}: {error}")
        if isinstance(known, dict):
            known = [job for job, outcome in known.items() if outcome == "killed"]
        if not isinstance(known, list) or not all(isinstance(job, str) for job in known):
            parser.error(f"--known-killed {args.known_killed}: expected a list of job ids or an object of outcomes")
        known_killed = frozenset(known)
    screen = None
    if args.tests is not None:
        screen = tuple(name.strip() for name in args.tests.split(",") if name.strip())
        absent = [name for name in screen if not (ROOT / name).is_file()]
        if not screen or absent:
            parser.error(f"--tests {args.tests!r}: no such test files {absent}")
        for name in names:
            TARGETS[name] = dataclasses.replace(TARGETS[name], tests=screen)
    if args.recheck is not None:
        missing = [name for name in names if not (args.recheck / f"{name}.sqlite").is_file()]
        if missing:
            parser.error(f"--recheck {args.recheck}: no session database for {missing}")
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hydraplan-mutation-")))
        else:
            workdir = args.workdir.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        # a kept copy is reused as it is (the tree of the run that made it); a new one is HEAD's
        bin_dir = workdir / ".venv" / "bin" if (workdir / ".venv" / "bin" / "cosmic-ray").exists() else prepare(workdir)
        if args.recheck is not None:
            rechecked = {
                name: recheck_target(
                    TARGETS[name], args.recheck / f"{name}.sqlite", workdir, bin_dir, args.timeout_s, known_killed
                )
                for name in names
            }
            text = recheck_report(rechecked, screen)
            print(text)
            for name, result in rechecked.items():  # per mutant, for explaining the survivors by job id
                (args.recheck / f"{name}-recheck.json").write_text(json.dumps(result["outcomes"], indent=1) + "\n")
            summary = "\n".join(f"- {recheck_line(name, result)}" for name, result in rechecked.items())
            file = "mutation-" + "+".join(names)  # beside the run's survivors
            write_result("mutation-recheck-" + "+".join(names), command_line(), text, summary, file=file)
            return 0
        results = {}
        for name in names:
            sample = None if args.sample is None else (args.sample, args.seed)
            results[name] = run_target(TARGETS[name], workdir, bin_dir, args.timeout_s, not args.report_only, sample)
            if args.sessions is not None:
                args.sessions.mkdir(parents=True, exist_ok=True)
                shutil.copy(results[name]["session"], args.sessions / f"{name}.sqlite")
    text = report(results)
    print(text)
    # one section per set of targets: a run of some targets keeps the others' results (and notes);
    # the survivors go to the results file only
    write_result("mutation-" + "+".join(names), command_line(), text, score_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
