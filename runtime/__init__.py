"""hydraplan runtime: all torch code (the model, its parallel layers, launching local ranks).

- `runtime.model`: the Llama-style decoder, cut into pipeline stages, on packed micro-batches;
- `runtime.parallel`: tensor and context parallelism of a stage (`parallelize_stage`, `cp_shard`);
- `runtime.launch`: run a function on local ranks of a fresh process group (`run_ranks`);
- `runtime.collectives`: measured all-reduce / all-gather / send-recv times.

It depends only on the plan schema and the model catalog, never re-plans; torch comes with the
`runtime` extra (`pip install -e ".[runtime]"`, torch==2.13.0). Importing this package imports no torch.
"""
