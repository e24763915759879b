"""hydraplan runtime: executes a `Plan` on torch.distributed workers and reports measured times.

It never re-plans: it depends only on the plan schema (`planner.schemas.Plan`). torch comes with
the `runtime` extra (`pip install -e ".[runtime]"`, the CPU wheel in CI).
"""
