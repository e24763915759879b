"""The REST service behind `hydraplan serve` (the `service` extra: FastAPI, uvicorn, Redis).

- `app`: the app factory `create_app`; `server`: uvicorn running it (`hydraplan serve`).
- `routes/`: one router per resource; `web/`: the static web page that `routes/web.py` serves.
- `schemas`, `problems`, `openapi`: request and response bodies, RFC 9457 problem details, the
  OpenAPI document.
- `settings`, `dependencies`, `auth`, `middleware`, `observability`, `metrics`: the environment,
  the app's long-lived services, the bearer token, the request guard, JSON logs, Prometheus.
- `planning`, `solving`, `sessions`, `jobs`, `leases`, `store`: the planner behind a bounded
  solver pool, planning sessions, background jobs, the leases that free a dead worker's state,
  and the store (memory or Redis) where sessions, profiles and jobs live.

Of the rest of `api` the service imports only `whatif` (sweep jobs), `render` (timelines) and
`datasets` (sample batches); never the command line, which imports `server` only inside
`hydraplan serve`, so the CLI runs without FastAPI.
"""
