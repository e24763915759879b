"""Achieved-rate figures per GPU type: the shape-dependent efficiencies of the analytic model.

`cost_models/data/efficiency.json` holds, per catalog GPU, the share of peak its large GEMMs
reach and the half-point dimension of their fall on narrow shapes, the same for attention over the
local sequence length and heads, and the shares of HBM, NVLink and network bandwidth that
memory-bound kernels and NCCL collectives reach; each entry names its sources. `HardwareParams`
turns them into rates (`hardware.HardwareParams.from_specs`). A GPU without an entry (a user's
catalog file) keeps the flat `AnalyticOptions` efficiencies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

__all__ = ["GpuEfficiency", "gpu_efficiency"]


@dataclass(frozen=True)
class GpuEfficiency:
    """Shares of peak (0-1] and half-point shapes of one GPU type; `source` cites them."""

    gemm_efficiency: float
    gemm_half_dim: float
    attention_efficiency: float
    attention_half_length_tokens: float
    attention_half_heads: float
    hbm_efficiency: float
    nvlink_bus_efficiency: float
    network_bus_efficiency: float
    source: str

    def __post_init__(self) -> None:
        for name in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("nvlink_bus_efficiency", "network_bus_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("gemm_half_dim", "attention_half_length_tokens", "attention_half_heads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@lru_cache(maxsize=1)
def _table() -> dict[str, GpuEfficiency]:
    text = resources.files("hydraplan.cost_models").joinpath("data", "efficiency.json").read_text()
    entries = {entry["gpu"]: entry for entry in json.loads(text)["efficiencies"]}
    table: dict[str, GpuEfficiency] = {}
    for name, entry in entries.items():
        values = entries[entry["same_as"]] if "same_as" in entry else entry
        table[name] = GpuEfficiency(**{key: value for key, value in values.items() if key != "gpu"})
    return table


def gpu_efficiency(gpu_name: str) -> GpuEfficiency | None:
    """The bundled figures of a catalog GPU, or None when the table has no entry for it."""
    return _table().get(gpu_name)
