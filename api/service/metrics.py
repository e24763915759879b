"""Prometheus metrics of one app, in the app's own registry (tests create many apps).

With `hydraplan serve --workers N` each worker process keeps its own registry; a scrape of
`/metrics` sees the worker that answered it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SOLVE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
ERROR_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
GAP_BUCKETS = (0.0, 0.0001, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class Metrics:
    """Request, solver and load-shedding metrics."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            "hydraplan_http_requests_total",
            "HTTP requests by route template, method and status.",
            ("route", "method", "status"),
            registry=registry,
        )
        self.latency = Histogram(
            "hydraplan_http_request_duration_seconds",
            "Time from request start to the last response byte.",
            ("route", "method"),
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.in_flight = Gauge("hydraplan_http_requests_in_flight", "Requests being served.", registry=registry)
        self.solve_time = Histogram(
            "hydraplan_solve_duration_seconds",
            "Wall time of one solve (profile lookup included), by origin.",
            ("origin",),
            buckets=SOLVE_BUCKETS_S,
            registry=registry,
        )
        self.gap = Histogram(
            "hydraplan_plan_gap",
            "Relative optimality gap of returned plans.",
            buckets=GAP_BUCKETS,
            registry=registry,
        )
        self.plans = Counter(
            "hydraplan_plans_total",
            "Plans returned, by solve status.",
            ("status",),
            registry=registry,
        )
        self.solves_running = Gauge("hydraplan_solves_running", "Solves running in worker threads.", registry=registry)
        self.rejections = Counter(
            "hydraplan_rejections_total",
            "Requests refused with 503 because the service was saturated, by pool.",
            ("pool",),
            registry=registry,
        )
        self.jobs = Counter(
            "hydraplan_jobs_total",
            "Jobs finished, by kind and final status.",
            ("kind", "status"),
            registry=registry,
        )

        self.session_fit_error = Histogram(
            "hydraplan_session_fit_error",
            "Median relative stage-time error of each measured step against the profile version that planned it.",
            buckets=ERROR_BUCKETS,
            registry=registry,
        )
        self.session_error_jumps = Counter(
            "hydraplan_session_error_jumps_total",
            "Measured steps whose median error jumped (over 3x the recent median and over 10%).",
            registry=registry,
        )
        self.session_slow_ranks = Counter(
            "hydraplan_session_slow_ranks_total",
            "Ranks a session newly estimated slow (cost_models/rank_speed.py): its next plans move work from them.",
            registry=registry,
        )
        self.session_rank_slowdown = Histogram(
            "hydraplan_session_rank_slowdown",
            "Slowdown factor of each rank a session holds slow, observed after each measured step.",
            buckets=(1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0),
            registry=registry,
        )
        self.session_capacity_lowered = Counter(
            "hydraplan_session_capacity_lowered_total",
            "Scheme capacities a session lowered on a measured peak, by reason.",
            ("reason",),
            registry=registry,
        )

    def observe_plan(self, status: str, gap: float, solve_time_s: float, origin: str) -> None:
        self.plans.labels(status=status).inc()
        self.gap.observe(max(0.0, gap))
        self.solve_time.labels(origin=origin).observe(solve_time_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
