"""The largest inputs the planner accepts: one set of bounds for the CLI, the REST API and Python.

Every bound sits far above any real training step, so no real request is refused, and exists so
that a typo or a hostile request is refused in milliseconds, naming the offending value, instead of
running for minutes or exhausting memory. The boundary types (`planner.schemas`) enforce them; the
service may lower some of them (its settings), never raise them.
"""

from __future__ import annotations

# Largest cluster. The largest published training run used 16,384 H100s (Llama 3 405B, Dubey et
# al. 2024, section 3.3); 4x that leaves room for what comes next. Placement and the plan list
# every rank, so the bound also caps a plan's size.
MAX_NUM_GPUS = 65_536

# GPUs per node: the largest NVLink domain shipped is 72 GPUs (GB200 NVL72). Scheme enumeration
# loops over the divisors of the node size.
MAX_GPUS_PER_NODE = 72

# Model chunks per GPU of an interleaved 1F1B scheme (`<tp,pp,cp,v>`), and how many chunk counts one
# request may offer: v divides the layers per stage, so v <= layers / 2; the deepest bundled models
# have 126 layers (Llama 3 405B; NeMo's recipe runs it at pp 9 with v = 2), 128 leaves room.
MAX_VIRTUAL_STAGES = 128

# Longest sequence: token offsets and lengths stay in int32 arithmetic.
MAX_SEQUENCE_TOKENS = 2**31 - 1

# Sequences of one global batch: 16M tokens of median-347-token Wikipedia documents are ~46K
# sequences; 2M sequences is 40x that. A plan lists every sequence.
MAX_SEQUENCES = 2_000_000

# Tokens of one global batch: Llama 3 405B trained on 16M-token batches (Dubey et al. 2024); 2^32
# (4.3B) is 256x that.
MAX_BATCH_TOKENS = 2**32

# Items after the oversize policy splits long sequences into capacity-sized chunks: a batch of
# MAX_SEQUENCES sequences may at most double. Checked before any chunk is made.
MAX_ITEMS = 2 * MAX_SEQUENCES

# Terms of a strategy string ('1x<8,1,2> + 6x<4,2,1>'): a strategy has at most a few distinct
# schemes (SolverOptions.max_schemes <= 8); 64 leaves room for hand-written pools.
MAX_STRATEGY_TERMS = 64

# Strategies in a strategy pool: each may get a full solve.
MAX_POOL_STRATEGIES = 256

# Transformer layers (the largest published dense models have 126: Llama 3 405B); PP stages are
# at most the layers.
MAX_LAYERS = 4096

# 1F1B operations of a plan to check or estimate: two per (stage, micro-batch) of every pipeline,
# summed. A 4096-GPU plan of 64M tokens has ~10^5 (16 stages x 4K micro-batches: 1.3 x 10^5); 1M
# keeps the checker's reference simulation (~3 us per operation) to a few seconds on one core.
MAX_SCHEDULE_OPERATIONS = 1_000_000

# Cost coefficients and hardware numbers, in the profile's time unit or in bytes (FLOP/s, bytes/s).
# Seven or more orders of magnitude above real devices (an 8B model on an H100 has a ~ 1e-10 s per
# squared token, b ~ 1e-4 s per token), so every product the planner forms stays finite and below
# HiGHS's infinity (1e20) for the longest batches allowed above.
MAX_COST_A = 1e-3  # per squared token
MAX_COST_B = 1.0  # per token
MAX_COST_C = 1e3  # per micro-batch
MAX_RANK_SLOWDOWN = 1e3  # a rank's slowdown factor (planner/slowdowns.py): 1000x slower at most
MAX_TIME_S = 1e6  # fixed times (grad_sync_s): ~11 days
MAX_BYTES = 1e15  # memory sizes: 1 PB per GPU
MAX_RATE = 1e18  # FLOP/s and bytes/s: 1 EFLOP/s, 1 EB/s per GPU
# Largest file (or standard input) a command reads: a plan of MAX_SEQUENCES sequences is ~210 MB as
# `--out` writes it (indented JSON; 105 bytes per sequence measured at 8B / 1,024 H100, 15K sequences)
MAX_INPUT_FILE_BYTES = 1 << 29


def schedule_operations(num_stages: int, num_micro_batches: int) -> int:
    """1F1B operations of one pipeline: one forward and one backward per stage (virtual stage, for an
    interleaved pipeline: pass pp * v) and micro-batch."""
    return 2 * num_stages * num_micro_batches


# A bound certificate (`schemas.BoundCertificate`): the scheme sets it lists as expanded and the
# strategy witnesses per set (the search expands at most a few thousand sets, and lists
# witnesses only for strategies near the global bound)
MAX_CERTIFIED_SETS = 100_000
MAX_CERTIFIED_STRATEGIES = 10_000
MAX_PROFILE_SCHEMES = 4096
