"""Load test of the REST service: uvicorn on 127.0.0.1, N concurrent clients for a fixed time.

    python benchmarks/api_load.py                      # 50 clients, 20 s, 64-sequence plans
    python benchmarks/api_load.py --mix plan64:4,session64:2,plan1k:1,models:1 --duration-s 30

Two measurements, written in full to benchmarks/results/api_load.md and in short (the overhead and
one line per worker count) to the `api_load` section of benchmarks/RESULTS.md:

1. **API overhead** for a 1K-sequence request: the same request planned by a direct library call
   (`planner.solve.solve` with a cached analytic profile) and through the HTTP API by one client,
   alternately, `--overhead-samples` times each; medians. The solver is an anytime search whose
   time varies by tens of ms from call to call, which drowns a difference of medians, so the
   overhead proper is measured per request: client latency minus the time the server spent inside
   `planner.solve.solve` (its `Server-Timing: solve;dur=...` header). That is everything the API
   adds: HTTP, JSON in and out, validation, profile lookup, the hop to the solver thread.
2. **Load**: `--clients` asyncio clients (httpx) send the request mix for `--duration-s` seconds
   (and at most `--max-requests`); a client honours `Retry-After` on 503 as an orchestrator
   should. Throughput, p50/p99 latency of successful requests, counts by status and the cost of
   a 503 (the p50 latency of the refusals, which the guard answers before reading the body).

Targets (issue 4): no 5xx other than deliberate 503s; p50 overhead <= 10 ms for 1K sequences;
>= 20 plans/s for 64-sequence / 8-GPU requests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.report import command_line, markdown_table, write_result  # noqa: E402
from hydraplan.cost_models.analytic import build_profile  # noqa: E402
from hydraplan.cost_models.catalog import get_gpu, get_model  # noqa: E402
from hydraplan.planner.schemas import PlanRequest, SolverOptions  # noqa: E402
from hydraplan.planner.solve import solve  # noqa: E402

MODEL, GPU, NUM_GPUS, GPUS_PER_NODE = "tiny", "h100-sxm-80gb", 8, 8
KINDS = ("plan64", "plan1k", "session64", "estimate64", "models")


def batch(num_sequences: int, seed: int) -> list[int]:
    """A long-tailed batch: mostly short sequences, a few up to 16K tokens."""
    rng = random.Random(seed)
    return [min(16384, max(32, int(rng.lognormvariate(7.0, 1.0)))) for _ in range(num_sequences)]


def plan_body(lengths: list[int], time_limit_s: float) -> dict:
    return {
        "lengths": lengths,
        "num_gpus": NUM_GPUS,
        "gpus_per_node": GPUS_PER_NODE,
        "model": MODEL,
        "gpu": GPU,
        "options": {"time_limit_s": time_limit_s, "seed": 0},
    }


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_redis() -> tuple[subprocess.Popen, str]:
    """A throwaway redis-server on 127.0.0.1 (several workers must share their store)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--workers > 1 needs redis-server (apt-get install redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    return process, f"redis://127.0.0.1:{port}/0"


def start_server(port: int, workers: int, environment: dict[str, str]) -> subprocess.Popen:
    """`api.service.server.run` (what `hydraplan serve` calls) in a subprocess; waits for /healthz."""
    code = f"from api.service.server import run; run('127.0.0.1', {port}, {workers})"
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **environment},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not become healthy within 60 s")


# ---------------------------------------------------------------------------------------------
# 1. Overhead of the API over a direct library call
# ---------------------------------------------------------------------------------------------


@dataclass
class OverheadResult:
    num_sequences: int
    direct_ms: list[float] = field(default_factory=list)
    api_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)  # API latency minus the server's solve


def measure_overhead(base_url: str, num_sequences: int, samples: int, time_limit_s: float) -> OverheadResult:
    lengths = batch(num_sequences, seed=1)
    body = plan_body(lengths, time_limit_s)
    request = PlanRequest(
        lengths=lengths,
        num_gpus=NUM_GPUS,
        gpus_per_node=GPUS_PER_NODE,
        options=SolverOptions(time_limit_s=time_limit_s, seed=0),
    )
    profile = build_profile(get_model(MODEL), get_gpu(GPU), NUM_GPUS, GPUS_PER_NODE)
    result = OverheadResult(num_sequences)
    with httpx.Client(base_url=base_url, timeout=60) as client:
        client.post("/v1/plans", json=body).raise_for_status()  # warm the server's profile cache
        solve(request, profile)
        for _ in range(samples):
            started = time.perf_counter()
            solve(request, profile)
            result.direct_ms.append((time.perf_counter() - started) * 1e3)

            started = time.perf_counter()
            response = client.post("/v1/plans", json=body)
            response.raise_for_status()
            response.json()
            wall_ms = (time.perf_counter() - started) * 1e3
            result.api_ms.append(wall_ms)
            result.overhead_ms.append(wall_ms - server_solve_ms(response.headers["server-timing"]))
    return result


def server_solve_ms(header: str) -> float:
    """The `dur` of the `solve` metric of a Server-Timing header."""
    for metric in header.split(","):
        name, *params = (part.strip() for part in metric.split(";"))
        if name == "solve":
            return sum(float(param[4:]) for param in params if param.startswith("dur="))
    raise ValueError(f"no solve metric in Server-Timing {header!r}")


def planner_ceiling_per_s(time_limit_s: float, samples: int = 10) -> tuple[float, float]:
    """CPU seconds of one direct 64-sequence solve, and the plans/s all cores could give at most."""
    profile = build_profile(get_model(MODEL), get_gpu(GPU), NUM_GPUS, GPUS_PER_NODE)
    options = SolverOptions(time_limit_s=time_limit_s, seed=0)
    cpu_s = []
    for seed in range(samples):
        request = PlanRequest(lengths=batch(64, seed), num_gpus=NUM_GPUS, gpus_per_node=GPUS_PER_NODE, options=options)
        started = time.process_time()
        solve(request, profile)
        cpu_s.append(time.process_time() - started)
    per_plan_s = statistics.median(cpu_s)
    return per_plan_s, (os.cpu_count() or 1) / per_plan_s


# ---------------------------------------------------------------------------------------------
# 2. Load
# ---------------------------------------------------------------------------------------------


@dataclass
class Sample:
    kind: str
    status: int
    latency_s: float
    failure: str = ""  # the httpx error class of a connection-level failure (status 0)


def parse_mix(text: str) -> dict[str, float]:
    mix = {}
    for part in text.split(","):
        kind, _, weight = part.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise argparse.ArgumentTypeError(f"unknown request kind {kind!r}; valid: {', '.join(KINDS)}")
        mix[kind] = float(weight or 1)
    if not mix or sum(mix.values()) <= 0:
        raise argparse.ArgumentTypeError("the mix needs a positive weight")
    return mix


class LoadRun:
    """Shared state of one load run: the deadline, the request budget and the samples."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.deadline = 0.0
        self.remaining = args.max_requests
        self.samples: list[Sample] = []
        self.batches = {
            64: [batch(64, seed) for seed in range(32)],
            1000: [batch(1000, seed) for seed in range(4)],
        }

    def request_for(self, kind: str, rng: random.Random, session_url: str) -> tuple[str, str, dict | None]:
        limit = self.args.time_limit_s
        if kind == "plan64":
            return "POST", "/v1/plans", plan_body(rng.choice(self.batches[64]), limit)
        if kind == "plan1k":
            return "POST", "/v1/plans", plan_body(rng.choice(self.batches[1000]), limit)
        if kind == "session64":
            return "POST", f"{session_url}/plans", {"lengths": rng.choice(self.batches[64])}
        if kind == "estimate64":
            body = plan_body(rng.choice(self.batches[64]), limit)
            return "POST", "/v1/estimate", {**body, "baseline": "megatron"}
        return "GET", "/v1/models", None

    async def client(self, index: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(index)
        kinds, weights = list(self.args.mix), list(self.args.mix.values())
        session_url = ""
        if "session64" in kinds:  # one session per client, like one orchestrator per training job
            body = plan_body([1], self.args.time_limit_s)
            del body["lengths"]
            session_url = (await http.post("/v1/sessions", json=body)).headers["location"]
        while time.monotonic() < self.deadline and self.remaining > 0:
            self.remaining -= 1
            kind = rng.choices(kinds, weights)[0]
            method, path, body = self.request_for(kind, rng, session_url)
            started = time.monotonic()
            try:
                response = await http.request(method, path, json=body)
                status = response.status_code
            except httpx.HTTPError as error:
                status, response, failure = 0, None, type(error).__name__  # connection-level failure
            else:
                failure = ""
            self.samples.append(Sample(kind, status, time.monotonic() - started, failure))
            if status == 503 and response is not None:
                pause = float(response.headers.get("retry-after", "1"))
                await asyncio.sleep(min(pause, max(0.0, self.deadline - time.monotonic())))

    async def run(self, base_url: str) -> float:
        limits = httpx.Limits(max_connections=self.args.clients, max_keepalive_connections=self.args.clients)
        async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as http:
            started = time.monotonic()
            self.deadline = started + self.args.duration_s
            await asyncio.gather(*(self.client(index, http) for index in range(self.args.clients)))
            return time.monotonic() - started


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[position]


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def overhead_table(result: OverheadResult) -> tuple[str, float]:
    direct, api = statistics.median(result.direct_ms), statistics.median(result.api_ms)
    overhead = statistics.median(result.overhead_ms)
    rows = [
        [
            f"{result.num_sequences} sequences, {NUM_GPUS} GPUs",
            len(result.api_ms),
            f"{direct:.1f}",
            f"{api:.1f}",
            f"{api - direct:.1f}",
            f"{overhead:.1f}",
            f"{percentile(result.overhead_ms, 0.9):.1f}",
        ]
    ]
    headers = [
        "request",
        "samples",
        "direct call p50 ms",
        "API p50 ms",
        "difference of p50s ms",
        "API overhead p50 ms",
        "API overhead p90 ms",
    ]
    return markdown_table(headers, rows), overhead


# the last column is the cost of a refusal: the p50 latency of the 503s (issue 29: refused before
# the body is read, it should cost about a round trip)
LOAD_HEADERS = [
    "kind",
    "requests",
    "2xx",
    "503 (shed)",
    "other 4xx",
    "5xx + failed",
    "2xx/s",
    "p50 ms",
    "p99 ms",
    "503 p50 ms",
]


def load_table(samples: list[Sample], elapsed_s: float) -> tuple[str, dict[str, dict[str, float]], list[object]]:
    """The table by request kind, each kind's throughput and server errors, and the row of all kinds."""
    by_kind: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_kind[sample.kind].append(sample)
    by_kind["all"] = list(samples)
    rows, summary = [], {}
    for kind, group in by_kind.items():
        statuses = Counter(sample.status for sample in group)
        ok = [sample.latency_s * 1e3 for sample in group if 200 <= sample.status < 300]
        shed = [sample.latency_s * 1e3 for sample in group if sample.status == 503]
        server_errors = sum(count for status, count in statuses.items() if status >= 500 and status != 503)
        client_errors = sum(count for status, count in statuses.items() if 400 <= status < 500)
        summary[kind] = {
            "ok_per_s": len(ok) / elapsed_s,
            "server_errors": server_errors + statuses[0],
        }
        rows.append(
            [
                kind,
                len(group),
                len(ok),
                statuses[503],
                client_errors,
                server_errors + statuses[0],
                f"{len(ok) / elapsed_s:.1f}",
                f"{percentile(ok, 0.5):.1f}",
                f"{percentile(ok, 0.99):.1f}",
                f"{percentile(shed, 0.5):.1f}" if shed else "-",
            ]
        )
    status_line = ", ".join(
        f"{status or 'connection error'}: {count}"
        for status, count in sorted(Counter(sample.status for sample in samples).items())
    )
    failures = Counter(sample.failure for sample in samples if sample.failure)
    if failures:
        status_line += " (connection errors: " + ", ".join(f"{name} {n}" for name, n in sorted(failures.items())) + ")"
    return markdown_table(LOAD_HEADERS, rows) + f"\n\nResponses by status: {status_line}.", summary, rows[-1]


def verdicts(summary: dict[str, dict[str, float]], overhead_ms: float, args: argparse.Namespace) -> str:
    server_errors = int(summary["all"]["server_errors"])
    lines = [
        f"- No 5xx other than deliberate 503s: {'met' if server_errors == 0 else 'MISSED'} "
        f"({server_errors} server errors or failed connections).",
        f"- p50 API overhead <= 10 ms for a 1K-sequence request: "
        f"{'met' if overhead_ms <= 10 else 'MISSED'} ({overhead_ms:.1f} ms).",
    ]
    if "plan64" in summary:
        rate = summary["plan64"]["ok_per_s"]
        share = args.mix["plan64"] / sum(args.mix.values())
        lines.append(
            f"- >= 20 plans/s for 64-sequence / 8-GPU requests: "
            f"{'met' if rate >= 20 else 'MISSED'} "
            f"({rate:.1f} plans/s{'' if share == 1 else f', {share:.0%} of the mix'})."
        )
    return "\n".join(lines)


def load_on_server(args: argparse.Namespace, workers: int, measure: bool) -> tuple:
    """Start a server with `workers` processes, optionally measure the overhead, run the load."""
    environment = {"HYDRAPLAN_LOG_LEVEL": "INFO"}
    redis = None
    if workers > 1:
        redis, environment["HYDRAPLAN_REDIS_URL"] = start_redis()
    port = free_port()
    server = start_server(port, workers, environment)
    base_url = f"http://127.0.0.1:{port}"
    try:
        overhead = measure_overhead(base_url, 1000, args.overhead_samples, args.time_limit_s) if measure else None
        run = LoadRun(args)
        elapsed_s = asyncio.run(run.run(base_url))
    finally:
        server.terminate()
        server.wait(timeout=30)
        if redis is not None:
            redis.terminate()
            redis.wait(timeout=10)
    return overhead, run.samples, elapsed_s


def worker_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",")]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("worker counts must be >= 1")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="load duration (default 20)")
    parser.add_argument("--max-requests", type=int, default=20_000, help="request budget (default 20000)")
    parser.add_argument(
        "--mix",
        type=parse_mix,
        default=parse_mix("plan64:1"),
        help=f"kind:weight,... of {', '.join(KINDS)} (default plan64:1)",
    )
    parser.add_argument(
        "--workers",
        type=worker_counts,
        default=[1, 2],
        help="uvicorn worker counts, one load run each; >1 starts redis (default 1,2)",
    )
    parser.add_argument(
        "--time-limit-s",
        type=float,
        default=0.1,
        help="options.time_limit_s of every request (default 0.1: a per-step budget)",
    )
    parser.add_argument("--overhead-samples", type=int, default=15, help="samples per side (default 15)")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results")
    args = parser.parse_args(argv)

    overhead_text, overhead_ms, load_sections, summaries, totals = "", float("nan"), [], {}, []
    for index, workers in enumerate(args.workers):
        overhead, samples, elapsed_s = load_on_server(args, workers, measure=index == 0)
        if overhead is not None:
            overhead_text, overhead_ms = overhead_table(overhead)
        text, summaries[workers], total = load_table(samples, elapsed_s)
        store = "in-process store" if workers == 1 else "Redis store"
        load_sections.append(f"#### {workers} worker(s), {store}, {elapsed_s:.1f} s\n\n{text}")
        totals.append([workers, store, f"{elapsed_s:.1f}", *total[1:]])

    cpu_per_plan_s, ceiling = planner_ceiling_per_s(args.time_limit_s)
    mix = ", ".join(f"{kind} x{weight:g}" for kind, weight in args.mix.items())
    body = (
        f"Server: `api.service.server.run` (= `hydraplan serve`, uvicorn) on 127.0.0.1, default settings "
        f"(solver threads per worker = cores); `{MODEL}` on {NUM_GPUS} x {GPU}, "
        f"options.time_limit_s={args.time_limit_s:g}. Clients run in the same machine and share "
        f"its cores with the server.\n\n"
        f"### API overhead ({args.workers[0]} worker, one client, alternating with direct library "
        f"calls)\n\n{overhead_text}\n\n"
        f"### Load: {args.clients} clients, {args.duration_s:g} s, mix {mix}\n\n"
        + "\n\n".join(load_sections)
        + f"\n\nPlanner ceiling: one direct 64-sequence solve takes {cpu_per_plan_s * 1e3:.0f} ms "
        f"of CPU at this budget (the search uses its whole time limit), so {os.cpu_count()} "
        f"cores give at most {ceiling:.1f} plans/s before any HTTP work."
        + "\n\n### Targets\n\n"
        + "\n".join(
            f"With {workers} worker(s):\n{verdicts(summary, overhead_ms, args)}"
            for workers, summary in summaries.items()
        )
        + "\n"
    )
    print(body)
    if not args.no_write:
        summary = overhead_text + "\n\n" + markdown_table(["workers", "store", "s", *LOAD_HEADERS[1:]], totals)
        write_result("api_load", command_line(), body, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
