"""The one model implementation: a Llama-style decoder cut into pipeline stages.

RMSNorm (Zhang & Sennrich 2019), rotary position embeddings (Su et al. 2021), grouped-query
attention (Ainslie et al. 2023), a SwiGLU MLP (Shazeer 2020; a GELU MLP when the catalog entry
has `gated_mlp: false`), tied or untied embeddings: the architecture of Llama 2/3 (Touvron et al.
2023, arXiv 2307.09288; Llama Team 2024, arXiv 2407.21783), without biases.

`build_stage(cfg, pp=, stage=)` builds the layers `stage_layers(num_layers, pp, stage)` of that
split; the first stage embeds, the last normalises, projects to the vocabulary and returns the
SUM of the token losses (the caller divides by the token count of the whole step). Parameters
carry canonical names (`embed.weight`, `layers.7.attn.wq.weight`, `final_norm.weight`,
`lm_head.weight`) whatever the stage, and each is initialised from `(seed, canonical name)`
alone, so a stage of any split holds the same values as the same layers of the whole model.
With tied embeddings and pp > 1 the last stage holds its own copy of `embed.weight` for the LM
head (as Megatron-LM does); the runtime sums the two copies' gradients.

`build_stage(cfg, pp=, stage=, virtual_stages=v)` builds the v model chunks of rank `stage` under
interleaved 1F1B: chunk c holds the layers of virtual stage `c * pp + stage` of `pp * v`
(`chunk_layer_ranges`; Narayanan et al. 2021 §2.2.2), and `forward(batch, hidden, layers=chunk)`
runs one of them: it embeds when the chunk starts at layer 0 and returns the loss when it ends at
the last layer.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from hydraplan.runtime.attention import apply_rotary, packed_causal_attention, resolve_method, rotary_tables
from hydraplan.runtime.batch import IGNORE_INDEX, CpLayout, PackedBatch, chunk_bounds, cp_shard

__all__ = [
    "CpLayout",
    "DecoderStage",
    "ModelConfig",
    "PackedBatch",
    "build_stage",
    "chunk_bounds",
    "cp_shard",
    "init_parameters",
    "chunk_layer_ranges",
    "stage_layers",
]

INIT_STD = 0.02
# rope_theta of the catalog models' published config.json files (10,000 when not listed).
ROPE_THETA = {"llama3-8b": 500_000.0, "llama3-70b": 500_000.0}
NORM_EPS = {"llama3-8b": 1e-5, "llama3-70b": 1e-5, "llama2-7b": 1e-5, "llama2-13b": 1e-5}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder; `from_catalog` takes a catalog entry, overrides shrink it."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tied_embeddings: bool = False
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    gated_mlp: bool = True

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: a positive integer is required, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        if not self.rope_theta > 0 or not self.norm_eps > 0:
            raise ValueError("rope_theta and norm_eps must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_catalog(cls, name: str, models_file: str | None = None, **overrides) -> ModelConfig:
        """The catalog model `name` (`hydraplan models`), with `overrides` replacing fields."""
        from hydraplan.cost_models.catalog import get_model

        spec = get_model(name, models_file)
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; valid: {sorted(known)}")
        base = cls(
            name=spec.name,
            num_layers=spec.num_layers,
            hidden_size=spec.hidden_size,
            ffn_hidden_size=spec.ffn_hidden_size,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            vocab_size=spec.vocab_size,
            tied_embeddings=spec.tied_embeddings,
            rope_theta=ROPE_THETA.get(spec.name, 10_000.0),
            norm_eps=NORM_EPS.get(spec.name, 1e-5),
            gated_mlp=spec.gated_mlp,
        )
        return replace(base, **overrides)


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """Layers of PP stage `stage`: even contiguous splits, as the planner and the analytic cost
    model assume (`cost_models/analytic.py`: `pp` must divide `num_layers`)."""
    if pp < 1 or num_layers % pp:
        raise ValueError(f"pp={pp} does not divide num_layers={num_layers} (only even layer splits are planned)")
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is not a stage of pp={pp}")
    per_stage = num_layers // pp
    return range(stage * per_stage, (stage + 1) * per_stage)


def chunk_layer_ranges(num_layers: int, pp: int, stage: int, virtual_stages: int = 1) -> list[range]:
    """Layers of each model chunk of rank `stage`: chunk c is virtual stage `c * pp + stage` of
    `pp * v` even splits (v = 1: `[stage_layers(num_layers, pp, stage)]`)."""
    if virtual_stages < 1 or num_layers % (pp * virtual_stages):
        raise ValueError(
            f"pp={pp} x v={virtual_stages} chunks do not divide num_layers={num_layers} (only even splits are planned)"
        )
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is not a stage of pp={pp}")
    per_chunk = num_layers // (pp * virtual_stages)
    return [
        range((chunk * pp + stage) * per_chunk, (chunk * pp + stage + 1) * per_chunk) for chunk in range(virtual_stages)
    ]


class RMSNorm(nn.Module):
    """`x / rms(x) * weight`, computed in at least float32 (Zhang & Sennrich 2019)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = compute * torch.rsqrt(compute.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class Linear(nn.Module):
    """`x @ weight.T` without bias; weight `[out_features, in_features]` as in `nn.Linear`."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Embedding(nn.Module):
    """Token embedding table `[vocab_size, hidden_size]`."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)


class PackedAttentionCore(nn.Module):
    """Per-sequence causal attention over the packed stream (`runtime/attention.py`).

    A separate module so that context parallelism can swap in its own (`runtime/parallel/cp.py`).
    """

    def __init__(self, method: str = "auto") -> None:
        super().__init__()
        self.method = method

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        return packed_causal_attention(q, k, v, batch.lengths, self.method)


class Attention(nn.Module):
    """Grouped-query self-attention; head counts follow the (possibly TP-sharded) weights."""

    def __init__(self, cfg: ModelConfig, method: str) -> None:
        super().__init__()
        kv_width = cfg.num_kv_heads * cfg.head_dim
        self.head_dim = cfg.head_dim
        self.wq = Linear(cfg.hidden_size, cfg.hidden_size)
        self.wk = Linear(cfg.hidden_size, kv_width)
        self.wv = Linear(cfg.hidden_size, kv_width)
        self.wo = Linear(cfg.hidden_size, cfg.hidden_size)
        self.core = PackedAttentionCore(method)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], batch: PackedBatch) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.wq(x).view(tokens, -1, self.head_dim)
        k = self.wk(x).view(tokens, -1, self.head_dim)
        v = self.wv(x).view(tokens, -1, self.head_dim)
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        return self.wo(self.core(q, k, v, batch).reshape(tokens, -1))


class MLP(nn.Module):
    """SwiGLU `w_down(silu(w_gate x) * w_up x)`, or `w_down(gelu(w_up x))` when not gated."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_gate = Linear(cfg.hidden_size, cfg.ffn_hidden_size) if cfg.gated_mlp else None
        self.w_up = Linear(cfg.hidden_size, cfg.ffn_hidden_size)
        self.w_down = Linear(cfg.ffn_hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w_gate is None:
            return self.w_down(F.gelu(self.w_up(x)))
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention, then MLP."""

    def __init__(self, cfg: ModelConfig, method: str) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = Attention(cfg, method)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], batch: PackedBatch) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotary, batch)
        return x + self.mlp(self.mlp_norm(x))


class SumCrossEntropy(nn.Module):
    """Project to the vocabulary and sum the token cross-entropies (logits in at least float32).

    A module of its own so that tensor parallelism can swap in the vocabulary-parallel form.
    """

    def forward(self, x: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, head_weight)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


class DecoderStage(nn.Module):
    """One pipeline stage; see `build_stage` for the forward contract."""

    def __init__(self, cfg: ModelConfig, layers: Sequence[int], is_first: bool, is_last: bool, method: str) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_ids = layers
        self.is_first, self.is_last = is_first, is_last
        holds_embedding = is_first or (is_last and cfg.tied_embeddings)
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size) if holds_embedding else None
        self.layers = nn.ModuleDict({str(index): DecoderLayer(cfg, method) for index in layers})
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps) if is_last else None
        untied_head = is_last and not cfg.tied_embeddings
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size) if untied_head else None
        self.loss = SumCrossEntropy() if is_last else None

    def forward(
        self, batch: PackedBatch, hidden: torch.Tensor | None = None, layers: range | None = None
    ) -> torch.Tensor:
        """First stage: embeds `batch.input_ids`; later ones take `hidden [T, hidden_size]`.
        Returns the summed loss on the last stage, the hidden states `[T, hidden_size]` otherwise.
        `layers`: run only these of the stage's layers (one model chunk): the chunk embeds when it
        starts at layer 0 and ends with the loss when it ends at the model's last layer."""
        embeds, ends = self.is_first, self.is_last
        if layers is not None:
            embeds = embeds and layers.start == 0
            ends = ends and layers.stop == self.cfg.num_layers
        tokens = batch.input_ids.shape[0]
        if embeds:
            x = self.embed(batch.input_ids)
        else:
            expected = (tokens, self.cfg.hidden_size)
            if hidden is None or tuple(hidden.shape) != expected:
                got = None if hidden is None else tuple(hidden.shape)
                raise ValueError(f"stage after the first needs hidden of shape {expected}, got {got}")
            x = hidden
        rotary = rotary_tables(batch.position_ids, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        chosen = self.layers.values() if layers is None else [self.layers[str(index)] for index in layers]
        for layer in chosen:
            x = layer(x, rotary, batch)
        if not ends:
            return x
        head_weight = self.embed.weight if self.cfg.tied_embeddings else self.lm_head.weight
        return self.loss(self.final_norm(x), head_weight, batch.labels)


def _seed_of(seed: int, canonical_name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{canonical_name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def init_value(cfg: ModelConfig, canonical_name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The initial value of a full parameter, float64 on the CPU, from `(seed, canonical_name)` only.

    Norm weights are ones; every other weight is normal with std 0.02, the residual-output
    projections (`wo`, `w_down`) scaled by `1/sqrt(2 * num_layers)` (GPT-2, Radford et al. 2019).
    """
    if canonical_name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.float64)
    std = INIT_STD
    if canonical_name.endswith(("attn.wo.weight", "mlp.w_down.weight")):
        std /= math.sqrt(2 * cfg.num_layers)
    generator = torch.Generator().manual_seed(_seed_of(seed, canonical_name))
    return torch.randn(shape, generator=generator, dtype=torch.float64) * std


@torch.no_grad()
def init_parameters(module: DecoderStage, seed: int) -> None:
    """Fill every parameter of an unsharded stage from `(seed, canonical name)`."""
    for name, parameter in module.named_parameters():
        parameter.copy_(init_value(module.cfg, name, tuple(parameter.shape), seed))


def stage_work(stage: nn.Module) -> tuple[float, float]:
    """(forward FLOPs per token, per squared sequence length) of the modules this rank holds, as
    built (TP shards included; a stage's model chunks all count): 2 per weight of its 2-D weights
    but the embedding table's (a lookup, no multiply; counted as the head where it is tied), and,
    per attention layer, `2 x` its query width for causal attention's scores and weighted sum
    (Narayanan et al. 2021, §5.1: `4 l^2 h`, halved by the causal mask). What a rank's compute is
    weighed by when the session compares the ranks of a pipeline across PP stages."""
    per_token = 2.0 * sum(
        parameter.numel()
        for name, parameter in stage.named_parameters()
        if parameter.dim() == 2 and not name.startswith("embed.")
    )
    if getattr(stage, "is_last", False) and getattr(stage, "embed", None) is not None and stage.cfg.tied_embeddings:
        per_token += 2.0 * stage.embed.weight.numel()
    per_square = sum(2.0 * module.wq.weight.shape[0] for module in stage.modules() if isinstance(module, Attention))
    return per_token, per_square


def build_stage(
    cfg: ModelConfig,
    *,
    pp: int = 1,
    stage: int = 0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    attention: str = "auto",
    virtual_stages: int = 1,
) -> DecoderStage:
    """Stage `stage` of `pp` of the model `cfg`, initialised from `seed`, on `device` in `dtype`.

    `forward(batch, hidden=None)`: the first stage embeds `batch.input_ids`, later stages take
    `hidden [T, hidden_size]` from the previous one; the last stage returns the sum of the token
    losses (a scalar), every other stage the hidden states. `attention` picks the packed
    attention method (`runtime/attention.py`; `auto` is the measured choice for the device).
    """
    if virtual_stages == 1:
        layers: Sequence[int] = stage_layers(cfg.num_layers, pp, stage)
    else:  # every chunk of the rank: `forward(..., layers=chunk)` runs one
        layers = [index for chunk in chunk_layer_ranges(cfg.num_layers, pp, stage, virtual_stages) for index in chunk]
    device = torch.device(device)
    method = resolve_method(attention, device)
    module = DecoderStage(cfg, layers, is_first=stage == 0, is_last=stage == pp - 1, method=method).to(dtype=dtype)
    init_parameters(module, seed)
    return module.to(device=device)
