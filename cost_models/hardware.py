"""The analytic model's hardware parameters: what calibration fits to measurements.

`HardwareParams.from_specs(gpu, options)` gives the values the analytic model has always used
(vendor peak times an assumed efficiency, the catalog's link bandwidths, a per-layer overhead,
nothing else), so `analytic.build_profile` with the defaults reproduces the uncalibrated profiles
exactly. `cost_models.calibrate` fits the same set to a device's measurements instead. The
shape-dependent terms are Roofline-style saturation curves, each with one half-point parameter
(Williams et al. 2009, "Roofline: an insightful visual performance model"):

- GEMM: achieved rate `gemm_flops_per_s * d / (d + gemm_half_dim)` for a weight matrix whose
  smaller per-device dimension is `d` (narrow TP shards run further from peak);
- attention: achieved rate `attention_flops_per_s / (1 + l0 / l_local + h0 / heads_local)` with
  `l_local` the query tokens of a sequence on one device (`l / cp`) and `heads_local` the query
  heads per device (`heads / tp`); short sequences and few heads run further from peak;
- a fixed time per layer and per micro-batch (kernel launches, Python, synchronisation);
- memory-bound kernels (norms, rotary, SwiGLU, residual adds) at `memory_bound_bytes_per_s`
  (infinite by default: the analytic model has always left them out);
- per-token work that TP does not split (`unsplit_s_per_token_per_layer`: norms, residual adds and
  framework overhead on every TP rank when there is no sequence parallelism; 0 by default);
- collectives: `latency + bytes / bandwidth` inside a node and between nodes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

from hydraplan.cost_models.efficiency import gpu_efficiency
from hydraplan.planner.schemas import GpuSpec

if TYPE_CHECKING:
    from hydraplan.cost_models.analytic import AnalyticOptions

__all__ = ["HardwareParams"]

BF16_BYTES = 2


@dataclass(frozen=True)
class HardwareParams:
    """Achieved rates, fixed overheads and link figures of one device kind (seconds, bytes, FLOPs)."""

    gemm_flops_per_s: float
    attention_flops_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    per_layer_overhead_s: float
    gemm_half_dim: float = 0.0
    attention_half_length_tokens: float = 0.0
    attention_half_heads: float = 0.0
    per_micro_batch_overhead_s: float = 0.0
    memory_bound_bytes_per_s: float = math.inf
    unsplit_s_per_token_per_layer: float = 0.0
    intra_node_latency_s: float = 0.0
    inter_node_latency_s: float = 0.0
    # Bytes of one activation element as the device runs (2: bf16 on GPUs; 4: fp32 on CPU).
    activation_element_bytes: float = BF16_BYTES
    # Measured / modelled stored activations (1: Korthikanti et al. 2022 exactly).
    activation_memory_scale: float = 1.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if math.isnan(value) or value < 0:
                raise ValueError(f"{item.name} must be >= 0, got {value}")
        for name in ("gemm_flops_per_s", "attention_flops_per_s", "memory_bound_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.activation_element_bytes <= 0 or self.activation_memory_scale <= 0:
            raise ValueError("activation_element_bytes and activation_memory_scale must be > 0")

    @classmethod
    def from_specs(cls, gpu: GpuSpec, options: AnalyticOptions) -> HardwareParams:
        """The uncalibrated values. With `options.efficiency == "catalog"` and an entry for the GPU
        in `cost_models/data/efficiency.json`: its sourced shares of peak, half-point shapes and
        bus efficiencies, memory-bound kernels at a share of HBM bandwidth. Otherwise ("flat", or
        a GPU without an entry): peak x the options' efficiencies, catalog link bandwidths, no
        shape terms, no memory-bound time, no latency (the model before issue 13)."""
        figures = gpu_efficiency(gpu.name) if options.efficiency == "catalog" else None
        if figures is not None:
            return cls(
                gemm_flops_per_s=gpu.peak_bf16_flops * figures.gemm_efficiency,
                attention_flops_per_s=gpu.peak_bf16_flops * figures.attention_efficiency,
                intra_node_bandwidth_bytes_per_s=gpu.intra_node_bandwidth_bytes_per_s * figures.nvlink_bus_efficiency,
                inter_node_bandwidth_bytes_per_s=gpu.inter_node_bandwidth_bytes_per_s * figures.network_bus_efficiency,
                per_layer_overhead_s=options.per_layer_overhead_s,
                gemm_half_dim=figures.gemm_half_dim,
                attention_half_length_tokens=figures.attention_half_length_tokens,
                attention_half_heads=figures.attention_half_heads,
                memory_bound_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s * figures.hbm_efficiency,
            )
        return cls(
            gemm_flops_per_s=gpu.peak_bf16_flops * options.matmul_efficiency,
            attention_flops_per_s=gpu.peak_bf16_flops * options.attention_efficiency,
            intra_node_bandwidth_bytes_per_s=gpu.intra_node_bandwidth_bytes_per_s,
            inter_node_bandwidth_bytes_per_s=gpu.inter_node_bandwidth_bytes_per_s,
            per_layer_overhead_s=options.per_layer_overhead_s,
        )

    def link_bandwidth(self, in_node: bool) -> float:
        return self.intra_node_bandwidth_bytes_per_s if in_node else self.inter_node_bandwidth_bytes_per_s

    def link_latency(self, in_node: bool) -> float:
        return self.intra_node_latency_s if in_node else self.inter_node_latency_s

    def as_dict(self) -> dict[str, float]:
        """Plain finite numbers for a profile's provenance; an infinite rate (that part of the time
        is absent or not modelled) is left out."""
        return {name: float(value) for name, value in asdict(self).items() if math.isfinite(value)}

    @classmethod
    def from_dict(cls, values: dict[str, float]) -> HardwareParams:
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown hardware parameters: {', '.join(unknown)}")
        return cls(**values)

    def with_values(self, **values: float) -> HardwareParams:
        return replace(self, **values)
