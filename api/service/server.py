"""`hydraplan serve`: run the service under uvicorn (the CLI imports this lazily)."""

from __future__ import annotations

import uvicorn

from hydraplan.api.service.observability import uvicorn_log_config
from hydraplan.api.service.settings import Settings


def run(host: str, port: int, workers: int, root_path: str = "") -> None:
    """Serve `api.service.app:create_app` on host:port with `workers` processes, under
    `root_path` when a proxy forwards a prefixed path with the prefix stripped.

    Settings are read from the environment by each worker; they are validated here first so that
    a bad HYDRAPLAN_* variable fails before any worker starts. Several workers need
    HYDRAPLAN_REDIS_URL: with in-process stores a session created on one worker would be unknown
    to the next request's worker. Raises `ValueError` (the CLI prints it as one line).
    """
    if root_path and (not root_path.startswith("/") or root_path.endswith("/")):
        raise ValueError(f"--root-path {root_path!r}: give a path like /api (leading slash, no trailing one)")
    settings = Settings.from_env()
    if workers > 1 and not settings.redis_url:
        raise ValueError(
            f"--workers {workers} needs HYDRAPLAN_REDIS_URL: sessions, profiles and jobs must be "
            "shared between worker processes (or use --workers 1)"
        )
    uvicorn.run(
        "hydraplan.api.service.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        root_path=root_path,
        access_log=False,  # the app writes one JSON line per request itself
        log_config=uvicorn_log_config(settings.log_level),
        timeout_graceful_shutdown=30,
    )
