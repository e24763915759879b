"""Hand-made cost profiles and batches for planner tests (independent of cost_models/)."""

from __future__ import annotations

import numpy as np

from hydraplan.planner.schemas import CostProfile, SchemeCost


def synthetic_profile(max_gpus: int = 64, gpus_per_node: int = 8, grad_sync_s: float | None = None) -> CostProfile:
    """A Llama-8B-like profile: attention and linear work split over tp*cp, capacity grows with it.

    Numbers are shaped like the analytic model's (a ~ 1e-10 s/token^2, b ~ 5e-5 s/token on one GPU)
    but made up; they only need to be self-consistent.
    """
    schemes = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            for cp in (1, 2, 4):
                gpus = tp * pp * cp
                if gpus > max_gpus or tp * cp > 2 * gpus_per_node:
                    continue
                shards = tp * cp
                comm = 1.0 + 0.08 * (tp - 1) + 0.05 * (cp - 1)
                capacity = int(8192 * shards * pp**0.5 / (1 + 0.5 * (pp - 1)) * (0.6 if tp == 1 else 1.0))
                schemes.append(
                    SchemeCost(
                        tp=tp,
                        pp=pp,
                        cp=cp,
                        a=1.2e-10 / shards / pp,
                        b=5e-5 * comm / shards / pp,
                        c=1.5e-3 / pp + 2e-4 * (tp > 1),
                        capacity_tokens=max(1024, capacity),
                        grad_bytes_per_gpu=16e9 / (tp * pp),
                    )
                )
    return CostProfile(
        source="user",
        model="synthetic-8b",
        gpu="synthetic",
        num_layers=32,
        schemes=schemes,
        grad_sync_s=grad_sync_s,
        grad_sync_bandwidth_bytes_per_s=50e9,
    )


def wikipedia_like_batch(num_tokens: int, seed: int = 0, cap: int = 32768) -> list[int]:
    """Lognormal lengths with Wikipedia's median (~350) and a heavy tail, capped."""
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < num_tokens:
        lengths.append(int(min(cap, max(16, rng.lognormal(np.log(347), 1.25)))))
    return lengths
