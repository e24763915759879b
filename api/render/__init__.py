"""Timelines of plans (the data, and the drawings made from it) and the CLI's text tables.

- `timeline`: every pipeline's simulated 1F1B schedule as one `hydraplan.timeline/1` document.
- `svg`: the SVG and HTML drawings of a document (no drawing library needed).
- `png`: the PNG drawing, with matplotlib (the optional `plots` extra).
- `tables`: the CLI's tables, drawn by rich (plain ASCII off a terminal); `plan_text`: a plan's
  summary and a strategy pool as text; `schemes`: a cost profile's scheme table (`hydraplan schemes`).

Both front doors draw with these: `hydraplan plan/show --timeline` (`api.cli.timeline`) and
`POST /v1/plans/timeline` (`api.service.routes.timelines`). This package imports neither of
them, nor anything else of `api`: it needs only the planner (plan schema, simulator, cost model)
and rich.
"""
