"""What-if capacity studies: one sweep engine behind `hydraplan whatif` and the REST sweep job.

- `schemas`: the boundary types (a `Configuration` to evaluate, the `WhatifRow` it gives).
- `spec`: a sweep's axes (flags or a YAML/TOML/JSON file), checked and expanded into configurations.
- `engine`: one configuration's seeded steps planned and summarised into a row; the sweep loop.
- `executors`: where configurations run (in process, a local process pool, a Ray cluster).
- `results`: the rows file a sweep appends to (and `--resume` reads), CSV and JSON tables.
- `questions`: the smallest cluster reaching a throughput, the fastest configuration in a budget.
- `plots` and `report`: matplotlib figures and one self-contained HTML report.
"""
