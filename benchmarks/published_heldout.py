"""Held-out published runs (issue 13): rows no parameter of the analytic model was fitted on.

The A100 entry of `cost_models/data/efficiency.json` was fitted on the 10 rows of
`benchmarks/published_runs.py` (its training subset); the H100 entry comes from cited figures
only. The rows here test both out of sample. Each row states which of its figures were read in a
source here (through the search tools of this project) and which were recalled or derived.

Sources:

- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (arXiv 2104.04473, 2021-04), Table 1 (weak scaling, A100, batch, TP, PP) and
  Table 2 (PTD-P rows of the 175B GPT, micro-batch 1). Read here in two independent structured
  summaries of the paper's tables (repository notes found by `find_string`; they agree on every
  figure used). TFLOP/s per GPU are converted to tokens/s with the paper's own FLOP count
  (`narayanan_flops_per_token`, its eq. 3, which counts the recomputed forward).
- Llama Team 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783, 2024-07), Table 4: 405B on
  8,192 and 16,384 H100. GPUs, TP, CP, PP, tokens per batch and TFLOP/s per GPU read here on
  https://glennklockwood.com/garden/llama-3.1 (the same table as shown by P. Balaji at SC'24);
  the data-parallel size and batch follow from them. TFLOP/s are converted with the PaLM model-FLOP
  count `6N + 12*L*h*s` (Chowdhery et al. 2022, App. B), the usual MFU definition; the paper's
  own convention is not stated in what was read.
- NVIDIA DGX Cloud benchmarking recipe "Nemotron4 340B 25.01.1"
  (https://catalog.ngc.nvidia.com/orgs/nvidia/teams/dgxc-benchmarking/resources/nemotron340b-dgxc-benchmarking-a,
  2025-03): BF16 on 128 H100, TP 8, PP 8, VP 12, micro-batch 1, global batch 32, step 4.77 s, all
  read here. Architecture: nvidia/Nemotron-4-340B-Base `model_config.yaml` (read here).

Llama 3 405B and Nemotron-4 340B are defined here, as they were when these rows were frozen. Llama 3
405B has since joined the bundled catalog (`cost_models/data/models.json`, the same architecture,
with its stage counts 7, 9, 14, 18, 21, 42, 63 and 126 added to the bubble-floor table); Nemotron-4
340B has not (its 96 layers would add 24, 48 and 96 stages).
"""

from __future__ import annotations

from benchmarks.published_runs import PublishedRun, megatron_gpt
from hydraplan.planner.schemas import ModelSpec

__all__ = [
    "FIRST_EVALUATED",
    "HELD_OUT",
    "HELD_OUT_MODELS",
    "LLAMA3_405B",
    "NEMOTRON4_340B",
    "narayanan_flops_per_token",
    "palm_flops_per_token",
]

NARAYANAN = "https://arxiv.org/abs/2104.04473 (Narayanan et al. 2021-04, Tables 1-2)"
LLAMA3 = "https://arxiv.org/abs/2407.21783 (Llama Team 2024-07, Table 4)"
NGC_NEMOTRON = (
    "https://catalog.ngc.nvidia.com/orgs/nvidia/teams/dgxc-benchmarking/resources/"
    "nemotron340b-dgxc-benchmarking-a (NVIDIA DGXC recipe 25.01.1, 2025-03)"
)
NARAYANAN_RECALLED = (
    " Recalled: full activation recomputation, no overlap of the gradient all-reduce (2021 "
    "Megatron-LM), fp16 gradients."
)
NARAYANAN_TABLE1 = (
    "read: model shape, TP, PP, GPUs, batch, TFLOP/s (Table 1). Derived: DP. Assumed: micro-batch 1 "
    "(not in Table 1; pp = 1, so it only moves the per-micro-batch overhead)." + NARAYANAN_RECALLED
)
NARAYANAN_TABLE2 = (
    "read: model size, t*p = 96, GPUs, batch 1,536, micro-batch 1, TFLOP/s (Table 2) and the 175B "
    "shape (Table 1's 96 heads, 12,288 hidden, 96 layers for GPT-3). Derived: PP 12 from t*p = 96 "
    "with t = 8 (the paper keeps TP inside an 8-GPU node); DP." + NARAYANAN_RECALLED
)
LLAMA3_READ = (
    "read: GPUs, TP, CP, PP, 16M tokens per batch, TFLOP/s per GPU; derived: DP, sequences per "
    "DP group (16M taken as 2^24: 2,048 sequences of 8,192, 32 per DP group of 64), and v = 8 "
    "model chunks per GPU from the recalled §3.3.2 text (one layer each taken off the first and "
    "the last stage, 'the first model chunk on the first stage has only the embedding': 128 slots "
    "of 126 layers, embedding and loss over 16 ranks are 8 per rank, and a chunk holding only the "
    "embedding is one slot, so 8 chunks); recalled: sequence lengths 8,192 / 131,072, the 38-43% "
    "MFU (consistent with the TFLOP/s over 989), the interleaved schedule with bubble "
    "(pp-1)/(v*m) and that uneven split (§3.3.2); assumed: micro-batch 1 sequence, gradients and "
    "optimizer state sharded (zero2: FSDP without resharding weights), selective recompute, "
    "overlapped data-parallel sync, TP collectives not overlapped."
)
NGC_READ = (
    "read: GPUs, TP, PP, VP, micro-batch, batch, sequence length, step time 4.77 s (NGC page); the "
    "recipe's settings in NVIDIA/dgxc-benchmarking nemotron/configure.sh (35a9aec: global batch 2 "
    "per node, TP 8, PP 8, VP 12, micro-batch 1, ub_tp_comm_overlap, sequence parallel, "
    "overlap_p2p_comm) and nemotron/nemotron4-340b-synth.yaml (8f5cbb3: selective activation "
    "checkpointing, optimizer distributed_fused_adam with dtype bf16 and grad_sync_dtype bf16, "
    "contiguous grad buffer, overlap_grad_sync and overlap_param_sync); NeMo at tag 24.09-alpha.rc0 "
    "(the recipe's 24.09 container) passes that dtype to apex's DistributedFusedAdam and, the state "
    "dtype being the model's, keeps no master copy (megatron_base_model.py, setup_optimization). "
    "Priced as zero1 with bf16 gradients and bf16 Adam moments plus an fp32 master copy: 2 bytes "
    "per parameter conservative over DP 2. Not read: activation offloading (none in the yaml)."
)


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    """A GPT of Narayanan et al. 2021 Table 1 (the same Megatron GPT shape)."""
    return megatron_gpt(name, layers, hidden, heads, source="Narayanan et al. 2021 (arXiv 2104.04473), Table 1")


LLAMA3_405B = ModelSpec(
    name="llama3-405b",
    num_layers=126,
    hidden_size=16384,
    ffn_hidden_size=53248,
    num_heads=128,
    num_kv_heads=8,
    vocab_size=128256,
    gated_mlp=True,
    tied_embeddings=False,
    source="Llama Team 2024, 'The Llama 3 Herd of Models' (arXiv 2407.21783), Table 3: 126 layers, model "
    "dimension 16,384, FFN 53,248, 128 heads, 8 key/value heads, vocabulary 128,256",
)

NEMOTRON4_340B = ModelSpec(
    name="nemotron4-340b",
    num_layers=96,
    hidden_size=18432,
    ffn_hidden_size=73728,
    num_heads=96,
    num_kv_heads=8,
    vocab_size=256000,
    gated_mlp=False,
    tied_embeddings=False,
    source="nvidia/Nemotron-4-340B-Base model_config.yaml: 96 layers, hidden 18,432, FFN 73,728 (squared "
    "ReLU, not gated), 96 heads, 8 query groups, untied embeddings; vocabulary 256,000 (its "
    "nemotron_2_256k tokenizer; Nemotron-4 340B Technical Report, arXiv 2406.11704)",
)


HELD_OUT_MODELS: dict[str, ModelSpec] = {
    "gpt-1.7b": _gpt("gpt-1.7b", 24, 2304, 24),
    "gpt-3.6b": _gpt("gpt-3.6b", 30, 3072, 32),
    "gpt-7.5b": _gpt("gpt-7.5b", 36, 4096, 32),
    "gpt-18.4b": _gpt("gpt-18.4b", 40, 6144, 48),
    "gpt-175b-narayanan": _gpt("gpt-175b-narayanan", 96, 12288, 96),
    "llama3-405b": LLAMA3_405B,
    "nemotron4-340b": NEMOTRON4_340B,
}


def narayanan_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Narayanan et al. 2021 eq. 3 per token: `96*l*h^2*(1 + s/(6h) + V/(16*l*h))` (with the
    recomputed forward), the count behind their TFLOP/s."""
    h, layers, vocab = model.hidden_size, model.num_layers, model.vocab_size
    return 96 * layers * h**2 * (1 + seq_len / (6 * h) + vocab / (16 * layers * h))


def palm_flops_per_token(model: ModelSpec, seq_len: int, num_layers: int | None = None) -> float:
    """Model FLOPs per token `6N + 12*L*h*s` (Chowdhery et al. 2022, "PaLM", App. B): N the
    parameters without the input embedding, attention counted without the causal saving."""
    layers = num_layers or model.num_layers
    params = layers * model.params_per_layer + model.vocab_size * model.hidden_size
    return 6 * params + 12 * layers * model.hidden_size * seq_len


def _narayanan(
    name: str, model: str, num_gpus: int, tp: int, pp: int, batch: int, tflops: float, table: int
) -> PublishedRun:
    spec = HELD_OUT_MODELS[model]
    return PublishedRun(
        name=name,
        model=model,
        gpu="a100-80gb",
        num_gpus=num_gpus,
        tp=tp,
        pp=pp,
        cp=1,
        seq_len=2048,
        global_batch=batch,
        micro_batch=1,
        recompute="full",
        sharding="zero1",
        grad_dtype="fp32",
        grad_reduce_dtype="bf16",
        overlap=False,
        published_tokens_per_s_per_gpu=tflops * 1e12 / narayanan_flops_per_token(spec, 2048),
        published_as=f"{tflops:.0f} TFLOP/s (Table {table})",
        source=NARAYANAN,
        held_out=True,
        provenance=NARAYANAN_TABLE1 if table == 1 else NARAYANAN_TABLE2,
    )


LLAMA3_MEMORY = (
    "its memory recipe is not published: with selective recompute and Megatron-Core's interleaved "
    "schedule (micro-batch groups of pp per chunk) rank 1 keeps 128-141 layer-micro-batches of "
    "activations in flight, where 1F1B keeps 120 and fits, as do groups of 12 or fewer "
    "(interleaving sensitivity list); Llama 3 sets that group size freely (its §3.3.2) and does "
    "not give it"
)


def _llama3(name: str, num_gpus: int, cp: int, seq_len: int, tflops: float) -> PublishedRun:
    real = LLAMA3_405B
    tokens_per_batch = 16 * 2**20
    return PublishedRun(
        name=name,
        model="llama3-405b",
        gpu="h100-sxm-80gb",
        num_gpus=num_gpus,
        tp=8,
        pp=16,
        cp=cp,
        seq_len=seq_len,
        global_batch=tokens_per_batch // seq_len,
        micro_batch=1,
        recompute="selective",
        sharding="zero2",
        grad_dtype="fp32",
        grad_reduce_dtype="fp32",
        overlap=True,
        published_tokens_per_s_per_gpu=tflops * 1e12 / palm_flops_per_token(real, seq_len),
        published_as=f"{tflops:.0f} TFLOP/s",
        source=LLAMA3,
        held_out=True,
        virtual_stages=8,
        virtual_stages_source="derived from the paper's §3.3.2 text as recalled (provenance)",
        pipeline_split="embedding-and-loss",
        provenance=LLAMA3_READ,
        capacity_short=LLAMA3_MEMORY,
    )


HELD_OUT: tuple[PublishedRun, ...] = (
    _narayanan("Megatron GPT 1.7B, 32 A100, DP32", "gpt-1.7b", 32, 1, 1, 512, 137, 1),
    _narayanan("Megatron GPT 3.6B, 64 A100, TP2 DP32", "gpt-3.6b", 64, 2, 1, 512, 138, 1),
    _narayanan("Megatron GPT 7.5B, 128 A100, TP4 DP32", "gpt-7.5b", 128, 4, 1, 512, 142, 1),
    _narayanan("Megatron GPT 18.4B, 256 A100, TP8 DP32", "gpt-18.4b", 256, 8, 1, 1024, 135, 1),
    _narayanan("Megatron GPT 175B, 384 A100, TP8 PP12 DP4", "gpt-175b-narayanan", 384, 8, 12, 1536, 153, 2),
    _narayanan("Megatron GPT 175B, 768 A100, TP8 PP12 DP8", "gpt-175b-narayanan", 768, 8, 12, 1536, 149, 2),
    _narayanan("Megatron GPT 175B, 1536 A100, TP8 PP12 DP16", "gpt-175b-narayanan", 1536, 8, 12, 1536, 141, 2),
    _llama3("Llama 3 405B, 8192 H100, TP8 PP16 DP64, 8K", 8192, 1, 8192, 430),
    _llama3("Llama 3 405B, 16384 H100, TP8 PP16 DP128, 8K", 16384, 1, 8192, 400),
    _llama3("Llama 3 405B, 16384 H100, TP8 CP16 PP16 DP8, 128K", 16384, 16, 131072, 380),
    PublishedRun(
        name="NeMo Nemotron-4 340B, 128 H100, TP8 PP8 VP12",
        model="nemotron4-340b",
        gpu="h100-sxm-80gb",
        num_gpus=128,
        tp=8,
        pp=8,
        cp=1,
        seq_len=4096,
        global_batch=32,
        micro_batch=1,
        recompute="selective",
        sharding="zero1",
        grad_dtype="bf16",
        grad_reduce_dtype="bf16",
        optimizer_dtype="bf16",
        overlap=True,
        tp_overlap=True,
        published_tokens_per_s_per_gpu=32 * 4096 / 4.77 / 128,
        published_as="step 4.77 s",
        source=NGC_NEMOTRON,
        held_out=True,
        virtual_stages=12,
        virtual_stages_source="read: VP 12 on the NGC page",
        provenance=NGC_READ,
    ),
)


# Rows whose pricing changed after they were first evaluated, with the ratio (predicted / published)
# they had then, kept beside the new one. Issue 32 item 7 (2026-12-02) prices each row with the
# schedule it ran, the planner's own: the interleaved 1F1B simulation in Megatron-Core's order
# (`planner.simulate.pipeline_time_s`, groups of pp) and each chunk's own point-to-point transfers
# (`cost_models.analytic.chunk_entry`); before, `(m + (pp - 1) / v) * stage_time` of the plain
# stage time (main at bb58aff, 2026-12-02, the ratios below).
FIRST_EVALUATED: dict[str, float] = {
    "Llama 3 405B, 8192 H100, TP8 PP16 DP64, 8K": 1.03,
    "Llama 3 405B, 16384 H100, TP8 PP16 DP128, 8K": 1.04,
    "Llama 3 405B, 16384 H100, TP8 CP16 PP16 DP8, 128K": 1.21,
    "NeMo Nemotron-4 340B, 128 H100, TP8 PP8 VP12": 1.03,
}
