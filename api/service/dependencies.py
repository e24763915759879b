"""The app's long-lived services, built once by `create_app`, and their route dependency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from hydraplan.api.service.jobs import JobRunner
from hydraplan.api.service.metrics import Metrics
from hydraplan.api.service.planning import Planning
from hydraplan.api.service.sessions import Sessions
from hydraplan.api.service.settings import Settings
from hydraplan.api.service.solving import SolverPool
from hydraplan.api.service.store import Store, open_store


@dataclass(frozen=True)
class Services:
    """Everything a route needs; one instance per app (tests build many apps side by side)."""

    settings: Settings
    store: Store
    metrics: Metrics
    planning: Planning
    solver: SolverPool
    sessions: Sessions
    jobs: JobRunner

    @classmethod
    def build(cls, settings: Settings) -> Services:
        store = open_store(settings.redis_url, settings.redis_prefix)
        metrics = Metrics()
        planning = Planning(settings, store, metrics)
        solver = SolverPool(
            settings.max_concurrent_solves,
            settings.max_queued_solves,
            settings.retry_after_s,
            metrics,
        )
        return cls(
            settings=settings,
            store=store,
            metrics=metrics,
            planning=planning,
            solver=solver,
            sessions=Sessions(settings, store, planning),
            jobs=JobRunner(settings, store, planning, metrics),
        )

    def close(self) -> None:
        """Graceful shutdown: solves stop with their incumbents, running jobs record their state
        (bounded by `shutdown_grace_s`), and only then is the store closed."""
        self.solver.shutdown()
        self.jobs.shutdown()
        self.sessions.close()
        self.store.close()


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
