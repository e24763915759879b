"""hydraplan runtime: reserved for the torch.distributed workers that will execute a `Plan`.

Not built yet: no issue so far asks for it. It will depend only on the plan schema
(`planner.schemas.Plan`) and never re-plan; torch comes with the `runtime` extra.
"""
