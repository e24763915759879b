"""The types a what-if sweep passes between processes: what to evaluate and the row it gives.

A `Configuration` is complete on its own (model and GPU specs resolved, a profile inline, an exact
batch inline), so a worker process or a Ray task needs nothing but it. A `WhatifRow` holds only
values derived deterministically from the plans (no solve times), so the same configuration gives
the same row in any executor.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hydraplan.planner.schemas import CostProfile, GpuSpec, ModelSpec, SolverOptions

ANALYTIC = "analytic"
HYDRAPLAN = "hydraplan"


def is_hydraplan(planner: str) -> bool:
    """`hydraplan` or `hydraplan:<solver backend>`; any other planner is a baseline's name."""
    return planner == HYDRAPLAN or planner.startswith(HYDRAPLAN + ":")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DatasetKind(StrEnum):
    """Where a configuration's step batches come from."""

    BUNDLED = "bundled"  # a named sampler of api.datasets (Wikipedia sample or a synthetic family)
    LENGTHS = "lengths"  # documents drawn from a lengths file's values, like a bundled dataset
    BATCH = "batch"  # one exact batch (a lengths file, or a REST request's lengths) every step


class DatasetRef(Frozen):
    """A dataset of a sweep: its label in rows and plots, and what to draw batches from."""

    label: str = Field(description="Name in rows: a bundled name, lengths:FILE, or batch:<sha256 prefix>.")
    kind: DatasetKind
    name: str | None = Field(None, description="The bundled dataset's name.")
    lengths: tuple[int, ...] | None = Field(None, description="The file's documents, or the exact batch.")


class CostSourceRef(Frozen):
    """The cost model of a configuration: the analytic one, or a profile (measured or calibrated)."""

    label: str = Field(description="`analytic`, or `profile:FILE`.")
    profile: CostProfile | None = None


class Configuration(Frozen):
    """One point of a sweep: a cluster, a dataset, a planner and the seeds of its steps."""

    model: ModelSpec | None = Field(description="None when the cost source is a profile for an unknown model.")
    gpu: GpuSpec | None
    num_gpus: int
    gpus_per_node: int
    dataset: DatasetRef
    context_cap: int | None = Field(description="Documents longer than this are split into chunks; None keeps them.")
    tokens_per_step: int | None = Field(description="Tokens drawn per step; None for an exact batch.")
    cost_source: CostSourceRef
    planner: str = Field(description="`hydraplan[:backend]`, or the name of a baseline planning alone.")
    compare: tuple[str, ...] = Field(description="Baselines whose speedup the row reports.")
    seeds: tuple[int, ...] = Field(min_length=1, description="One step per seed (sampling and solver seed).")
    options: SolverOptions = Field(description="Solver options of every step; its seed is replaced per step.")
    previous_strategy: str | None = None

    def key(self) -> str:
        """A stable id of everything that decides the row (a resumed sweep matches rows by it)."""
        fields = self.model_dump(mode="json")
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:20]

    @property
    def model_name(self) -> str | None:
        if self.model is not None:
            return self.model.name
        return self.cost_source.profile.model if self.cost_source.profile is not None else None

    @property
    def gpu_name(self) -> str | None:
        if self.gpu is not None:
            return self.gpu.name
        return self.cost_source.profile.gpu if self.cost_source.profile is not None else None


class RowStatus(StrEnum):
    OK = "ok"
    FAILED = "failed"  # the configuration cannot be planned; `reason` says why


class WhatifRow(Frozen):
    """One configuration's result: step time, throughput, cost, strategy mix, gap and speedups."""

    index: int = Field(description="Position of the configuration in the sweep.")
    key: str = Field(description="`Configuration.key()`.")
    model: str | None
    gpu: str | None
    num_gpus: int
    gpus_per_node: int
    dataset: str
    context_cap: int | None
    tokens_per_step: int | None
    cost_source: str
    planner: str
    num_steps: int
    status: RowStatus
    reason: str | None = Field(None, description="Why the configuration could not be planned.")
    mean_tokens: float | None = Field(None, description="Mean tokens per step actually planned.")
    step_time_s: float | None = Field(None, description="Mean step time over the steps.")
    step_times_s: list[float] = Field(default_factory=list, description="Each step's time, in seed order.")
    tokens_per_s: float | None = Field(None, description="Planned tokens over step time, all steps together.")
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = Field(None, description="Model FLOPs (no recompute) per second over the GPUs' BF16 peak.")
    gap: float | None = Field(None, description="Largest optimality gap over the steps.")
    plan_status: str | None = Field(None, description="Worst plan status over the steps.")
    strategy: str | None = Field(None, description="The most frequent strategy over the steps.")
    strategy_mix: dict[str, float] = Field(
        default_factory=dict, description="Share of GPU-steps per scheme, e.g. {'<4,1,1>': 0.75, '<8,1,2>': 0.25}."
    )
    speedups: dict[str, float] = Field(
        default_factory=dict, description="Geometric mean over the steps of baseline step time / this step time."
    )
    baseline_errors: dict[str, str] = Field(default_factory=dict, description="Why a compared baseline could not plan.")
    max_context_any_scheme_tokens: int | None = Field(
        None, description="Memory study: the longest sequence some scheme of the cluster holds."
    )
    max_context_every_scheme_tokens: int | None = Field(
        None, description="Memory study: the longest sequence every runnable scheme of the cluster holds."
    )
    scheme_capacity_tokens: dict[str, int] = Field(
        default_factory=dict, description="Memory study: the capacity of each runnable scheme on the cluster."
    )
    price_per_gpu_hour: float | None = Field(None, description="Filled from --price-per-gpu-hour after the sweep.")
    cost_per_hour: float | None = None
    cost_per_1m_tokens: float | None = None


class SweepMeta(Frozen):
    """What a results folder holds, written first: a resumed sweep must be the same sweep."""

    schema_version: Literal["hydraplan.whatif/1"] = "hydraplan.whatif/1"
    keys: list[str] = Field(description="Configuration keys in sweep order.")
