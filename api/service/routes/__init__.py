"""One router per resource; `ROUTERS` is what `create_app` mounts, in this order."""

from hydraplan.api.service.routes import (
    catalog,
    datasets,
    docs,
    estimate,
    health,
    jobs,
    plans,
    profiles,
    sessions,
    timelines,
    web,
)

ROUTERS = (
    plans.router,
    estimate.router,
    catalog.router,
    profiles.router,
    sessions.router,
    jobs.router,
    health.router,
    timelines.router,
    datasets.router,
    web.router,
    docs.router,
)
