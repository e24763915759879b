"""Causal attention over a packed stream of sequences, with no attention across sequences.

Tensors are `q: [T, H, d]`, `k, v: [T, KV, d]` (grouped-query attention: `H` a multiple of `KV`).
Ways to compute it, all giving the same result (tests/test_runtime_model.py checks each against
attention on every sequence alone):

- `loop`: one `scaled_dot_product_attention(is_causal=True)` per sequence;
- `block_mask`: one SDPA call over the whole stream with a `[T, T]` block-diagonal causal mask;
- `flex`: `flex_attention` with a document mask (eager: it materialises the scores like `block_mask`);
- `varlen`: `torch.nn.attention.varlen.varlen_attn` (FlashAttention's varlen kernel, Dao 2023,
  arXiv 2307.08691), CUDA only.

`auto` picks per device: on CPU `loop`, the fastest on every length mix measured by
`benchmarks/packed_attention.py` (table in benchmarks/RESULTS.md: the per-sequence loop does
`sum l_i^2` work, the masked forms `T^2`, and eager flex adds its own overhead); on CUDA
`varlen`, which does `sum l_i^2` work in one kernel launch without the loop's per-sequence
launches. The CUDA choice is not measured here (no GPU in this project's CI).
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = ["ATTENTION_METHODS", "AttentionMethod", "packed_causal_attention", "resolve_method", "rotary_tables"]

AttentionMethod = Literal["auto", "loop", "block_mask", "flex", "varlen"]
ATTENTION_METHODS: tuple[str, ...] = ("auto", "loop", "block_mask", "flex", "varlen")


def resolve_method(method: str, device: torch.device) -> str:
    """The concrete method `auto` stands for on `device` (see the module docstring)."""
    if method not in ATTENTION_METHODS:
        raise ValueError(f"attention method {method!r}: one of {', '.join(ATTENTION_METHODS)}")
    if method == "auto":
        return "varlen" if device.type == "cuda" else "loop"
    if method == "varlen" and device.type != "cuda":
        raise ValueError("attention method 'varlen' needs a CUDA device (FlashAttention kernel)")
    return method


def rotary_tables(
    position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """`cos, sin` of shape `[T, 1, head_dim]` for rotary embeddings at `position_ids`.

    RoPE (Su et al. 2021, arXiv 2104.09864): pair i of a head rotates by `pos * theta^(-2i/d)`;
    the half-split pairing `(x_i, x_{i+d/2})` of the Llama reference code is used.
    """
    compute = torch.promote_types(dtype, torch.float32)
    exponents = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=compute) / head_dim
    inverse_freq = 1.0 / (theta**exponents)
    angles = position_ids.to(compute)[:, None] * inverse_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x: [T, heads, d]` by the tables of `rotary_tables`."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def packed_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: tuple[int, ...], method: str = "auto"
) -> torch.Tensor:
    """Causal attention of each sequence of the packed stream on its own: `[T, H, d]`."""
    if sum(lengths) != q.shape[0]:
        raise ValueError(f"lengths sum to {sum(lengths)} tokens, the stream has {q.shape[0]}")
    method = resolve_method(method, q.device)
    if method == "loop":
        return _loop(q, k, v, lengths)
    if method == "block_mask":
        return _block_mask(q, k, v, lengths)
    if method == "flex":
        return _flex(q, k, v, lengths)
    return _varlen(q, k, v, lengths)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA on `[L, heads, d]` tensors (heads first inside), grouped-query aware."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), enable_gqa=q.shape[1] != k.shape[1], **kwargs
    )
    return out.transpose(0, 1)


def _loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    outputs = []
    start = 0
    for length in lengths:
        end = start + length
        outputs.append(_sdpa(q[start:end], k[start:end], v[start:end], is_causal=True))
        start = end
    return torch.cat(outputs, dim=0)


def _document_ids(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    counts = torch.tensor(lengths, device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)


def block_diagonal_causal_mask(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """`[T, T]` bool: query i may attend key j when both are in one sequence and j <= i."""
    documents = _document_ids(lengths, device)
    total = documents.numel()
    causal = torch.ones(total, total, dtype=torch.bool, device=device).tril()
    return causal & (documents[:, None] == documents[None, :])


def _block_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    return _sdpa(q, k, v, attn_mask=block_diagonal_causal_mask(lengths, q.device))


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    documents = _document_ids(lengths, q.device)

    def same_document_causal(batch, head, query_index, key_index):
        return (documents[query_index] == documents[key_index]) & (key_index <= query_index)

    total = q.shape[0]
    block_mask = create_block_mask(same_document_causal, None, None, total, total, device=q.device)
    with warnings.catch_warnings():
        # Eager (unfused) flex attention is what is measured and tested here; its warning says so.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out = flex_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            block_mask=block_mask,
            enable_gqa=q.shape[1] != k.shape[1],
        )
    return out[0].transpose(0, 1)


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: tuple[int, ...]) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=q.device)
    cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, device=q.device), 0)
    longest = max(lengths)
    # window (-1, 0): every earlier key, no later one (causal), per the varlen_attn docstring.
    return varlen_attn(
        q, k, v, cu_seqlens, cu_seqlens, longest, longest, window_size=(-1, 0), enable_gqa=q.shape[1] != k.shape[1]
    )
