"""hydraplan runtime: all torch code (the model, its parallel layers, the profiler, the workers).

- `runtime.model` (`batch`, `attention`): the Llama-style decoder, cut into pipeline stages, on
  packed micro-batches;
- `runtime.parallel`: tensor and context parallelism of a stage (`parallelize_stage`, `cp_shard`);
- `runtime.launch`: run a function on local ranks of a fresh process group (`run_ranks`);
- `runtime.watchdog`: the ranks' progress beats and the stall watchdogs (launcher, torchrun);
  `runtime.faults`: the test hooks that make a rank exit, hang or stop (SIGSTOP);
- `runtime.collectives`: measured all-reduce / all-gather / send-recv times;
- `runtime.profiler` (`profiler_ranks`): the measurements of `hydraplan profile --device`;
- executing plans (`hydraplan run`): `assignment` (plan -> what each rank runs), `plan_feed`
  (each step's plan: from files, or planned on rank 0 and broadcast), `step_data` (the step's
  tokens), `pipeline_exec` (1F1B with variable-shape send/recv, posted in NCCL-safe batches:
  `p2p_order`, with the checker of NCCL's semantics), `comm_count` (collectives counted per
  micro-batch against Megatron-LM's closed form), `grad_sync`
  (gradient sync across pipelines of different layouts by canonical slices, bucketed and
  overlapped with the last backward), `reshard`
  (strategy switches), `worker` (one rank's steps), `equivalence` (the one-process `--check`),
  `timeline` (the measured critical path), `step_timing` (the measured step as the planner
  models it, from the op, collective (`comm_meter`), sync and optimizer times); `token_data`
  (pre-tokenised documents, numpy only) and `data_feed` (`--data`), `checkpoint` (DCP
  checkpoints by canonical slices, `--save`/`--load`), `run_io` (those flags checked before any
  rank starts), `faults` (out-of-memory messages, too); `cpu_allocator` (the C heap a CPU rank
  trains and is profiled on, pinned so that its memory peak is the step's).

It depends on the plan schema, the measurement types and the plan checker, and on the model
catalog; it never re-plans. torch comes with the `runtime` extra (`pip install -e ".[runtime]"`,
torch==2.13.0). Importing this package imports no torch.
"""
