"""Published training runs the analytic model is checked against (issue 13), as data.

Each row is one configuration exactly as its source ran it: model, GPUs, layout, sequence
length, batch, recipe, and the published throughput (tokens/s per GPU, or an MFU converted with
the source's own FLOP formula). `benchmarks/published.py` predicts each row and writes the table;
`tests/test_published.py` keeps every prediction inside its row's band.

Sources (dates are those of the publication or of the file version read):

- Megatron-LM README, "Training Speed and Scalability" MFU table (A100 80 GB, Selene, data
  parallel size 1), https://github.com/NVIDIA/Megatron-LM (README as of 2023); the layouts and
  batches are Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models" (arXiv 2205.05198, Table 3), MFU defined there as model FLOPs
  `72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h))` per iteration over peak time.
- torchtitan docs/performance.md (64 A100 80 GB, FSDP2, bf16, torch.compile off), version of
  2024-07 (commit 0413364), https://github.com/pytorch/torchtitan/blob/0413364/docs/performance.md;
  WPS there is tokens/s per GPU (train.py divides by the non-data-parallel size, 1 here).
"""

from __future__ import annotations

from dataclasses import dataclass

from hydraplan.planner.schemas import ModelSpec

__all__ = ["GPT_MODELS", "LLAMA2_70B", "PublishedRun", "RUNS", "megatron_model_flops_per_token"]

A100_PEAK_FLOPS = 312e12
MEGATRON_README = (
    "https://github.com/NVIDIA/Megatron-LM#training-speed-and-scalability "
    "(README, 2023; Korthikanti et al. 2022 Table 3)"
)
TORCHTITAN_A100 = "https://github.com/pytorch/torchtitan/blob/0413364/docs/performance.md (2024-07)"


def megatron_gpt(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    source: str = "Korthikanti et al. 2022 (arXiv 2205.05198), Table 3",
) -> ModelSpec:
    """A Megatron GPT of the scaling studies: 4h MLP (GeLU), MHA, vocabulary 51,200, tied
    input and output embeddings (Megatron's default)."""
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_heads=heads,
        num_kv_heads=heads,
        vocab_size=51200,
        gated_mlp=False,
        tied_embeddings=True,
        source=source,
    )


GPT_MODELS = {
    "gpt-22b": megatron_gpt("gpt-22b", 48, 6144, 64),
    "gpt-175b": megatron_gpt("gpt-175b", 96, 12288, 96),
    "gpt-530b": megatron_gpt("gpt-530b", 105, 20480, 128),
    "gpt-1t": megatron_gpt("gpt-1t", 128, 25600, 160),
}

LLAMA2_70B = ModelSpec(
    name="llama2-70b",
    num_layers=80,
    hidden_size=8192,
    ffn_hidden_size=28672,
    num_heads=64,
    num_kv_heads=8,
    vocab_size=32000,
    gated_mlp=True,
    tied_embeddings=False,
    source="meta-llama/Llama-2-70b-hf config.json (Touvron et al. 2023, arXiv 2307.09288)",
)


def megatron_model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Korthikanti et al. 2022 §6 model FLOPs per token (no recompute), for their MFU."""
    h, layers, vocab = model.hidden_size, model.num_layers, model.vocab_size
    return 72 * layers * h**2 * (1 + seq_len / (6 * h) + vocab / (12 * layers * h))


@dataclass(frozen=True)
class PublishedRun:
    """One published configuration and its published throughput (tokens/s per GPU)."""

    name: str
    model: str  # a catalog model or a key of GPT_MODELS / "llama2-70b"
    gpu: str
    num_gpus: int
    tp: int
    pp: int
    cp: int
    seq_len: int
    global_batch: int  # sequences per step
    micro_batch: int  # sequences per micro-batch
    recompute: str
    sharding: str
    grad_dtype: str
    grad_reduce_dtype: str
    overlap: bool  # data-parallel sync (and FSDP gathers) overlapped with compute
    published_tokens_per_s_per_gpu: float
    published_as: str  # what the source printed
    source: str
    band: float = 0.30  # |predicted / published - 1| allowed by the test
    # False: one of the rows the A100 efficiency entry was fitted on (in-sample); True: a row no
    # parameter was fitted on (benchmarks/published_heldout.py).
    held_out: bool = False
    # Interleaved 1F1B model chunks per GPU (Narayanan et al. 2021 §2.2.2): bubble (pp-1)/v, and
    # more micro-batches in flight (cost_models/pipeline_layout.py).
    virtual_stages: int = 1
    # Where the chunk count comes from (read, derived); empty: not published (v 1 is assumed for a
    # pipeline, and the row says so)
    virtual_stages_source: str = ""
    # "even", or "embedding-and-loss": Megatron-Core's split where the embedding and the loss take
    # one layer's slot each (cost_models/pipeline_layout.py).
    pipeline_split: str = "even"
    optimizer_dtype: str = "fp32"  # Adam's moments
    tp_overlap: bool = False  # TP collectives overlapped with the GEMMs (Megatron --tp-comm-overlap)
    # Which figures were read in a source here and which were recalled or derived.
    provenance: str = "see RESULTS.md, published"
    # Why the model's capacity is below the micro-batch this run held, when it is (the test then
    # checks that it still is, so a fix is noticed); empty: the capacity must hold it.
    capacity_short: str = ""

    @property
    def dp(self) -> int:
        return self.num_gpus // (self.tp * self.pp * self.cp)

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)


def _megatron(name: str, model: str, num_gpus: int, pp: int, batch: int, micro: int, mfu: float) -> PublishedRun:
    spec = GPT_MODELS[model]
    tokens = mfu * A100_PEAK_FLOPS / megatron_model_flops_per_token(spec, 2048)
    return PublishedRun(
        name=name,
        model=model,
        gpu="a100-80gb",
        num_gpus=num_gpus,
        tp=8,
        pp=pp,
        cp=1,
        seq_len=2048,
        global_batch=batch,
        micro_batch=micro,
        recompute="selective",
        sharding="zero1",
        grad_dtype="fp32",
        grad_reduce_dtype="fp32",
        overlap=False,
        published_tokens_per_s_per_gpu=tokens,
        published_as=f"MFU {mfu:.1%}",
        source=MEGATRON_README,
    )


def _titan(name: str, model: str, seq_len: int, local_batch: int, recompute: str, wps: float) -> PublishedRun:
    return PublishedRun(
        name=name,
        model=model,
        gpu="a100-80gb",
        num_gpus=64,
        tp=1,
        pp=1,
        cp=1,
        seq_len=seq_len,
        global_batch=64 * local_batch,
        micro_batch=local_batch,
        recompute=recompute,
        sharding="zero3",
        grad_dtype="fp32",
        grad_reduce_dtype="fp32",
        overlap=True,
        published_tokens_per_s_per_gpu=wps,
        published_as=f"WPS {wps:,.0f}",
        source=TORCHTITAN_A100,
    )


RUNS: tuple[PublishedRun, ...] = (
    _megatron("Megatron GPT 22B, 8 A100, TP8 SP", "gpt-22b", 8, 1, 4, 4, 0.415),
    _megatron("Megatron GPT 175B, 64 A100, TP8 PP8 SP", "gpt-175b", 64, 8, 64, 1, 0.514),
    _megatron("Megatron GPT 530B, 280 A100, TP8 PP35 SP", "gpt-530b", 280, 35, 280, 1, 0.560),
    _megatron("Megatron GPT 1T, 512 A100, TP8 PP64 SP", "gpt-1t", 512, 64, 512, 1, 0.563),
    _titan("torchtitan Llama 3 8B, 64 A100, FSDP, selective op AC", "llama3-8b", 8192, 1, "selective-op", 2973),
    _titan("torchtitan Llama 3 70B, 64 A100, FSDP, full AC", "llama3-70b", 8192, 1, "full", 331),
    _titan("torchtitan Llama 2 13B, 64 A100, FSDP, no AC", "llama2-13b", 4096, 2, "none", 2162),
    _titan("torchtitan Llama 2 13B, 64 A100, FSDP, selective op AC", "llama2-13b", 4096, 2, "selective-op", 1904),
    _titan("torchtitan Llama 2 70B, 64 A100, FSDP, selective op AC", "llama2-70b", 4096, 1, "selective-op", 355),
    _titan("torchtitan Llama 2 70B, 64 A100, FSDP, full AC", "llama2-70b", 4096, 2, "full", 353),
)
