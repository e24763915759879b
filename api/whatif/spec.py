"""A sweep's axes, from flags or a YAML/TOML/JSON spec file, checked and expanded into configurations.

Every axis is a list; the sweep is their cartesian product. A spec file holds the same keys as
`SweepSpec` and takes the values the flags take, through the same parser (`axis_values`): a string
is a comma list as on the command line (`16,32,64`; `64,,128` is refused), a count may be written
`32k` or `1M`, and any other scalar is a one-value axis. Flags given on the command line replace
the file's values. Everything a user can get wrong is refused here, before any work, with one line naming
the flag or the spec key and the value: an unknown name, an empty axis, a cluster that is not a
whole number of nodes, a sweep over the stated limit, a GPU type without a price.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from hydraplan.api.files import InputError, read_profile, read_text
from hydraplan.api.whatif.measures import ANY_GPU, price_of
from hydraplan.api.whatif.schemas import (
    ANALYTIC,
    HYDRAPLAN,
    Configuration,
    CostSourceRef,
    DatasetKind,
    DatasetRef,
    Frozen,
    is_hydraplan,
)
from hydraplan.planner.schemas import GpuSpec, ModelSpec, OversizePolicy, SolverBackend, SolverOptions, TimeLimit

DEFAULT_MAX_CONFIGURATIONS = 100
LENGTHS_PREFIX, BATCH_PREFIX, PROFILE_PREFIX = "lengths:", "batch:", "profile:"
NONE_WORDS = ("none", "null")
COUNT_SUFFIXES = {"k": 1024, "m": 1_000_000}  # 32k = 32768 tokens, 1M = 1,000,000

# spec key -> the flag that sets it (messages name the flag, or the key inside a spec file)
FLAGS = {
    "models": "--model",
    "gpus": "--gpu",
    "num_gpus": "--num-gpus",
    "gpus_per_node": "--gpus-per-node",
    "context_caps": "--context-cap",
    "datasets": "--dataset",
    "tokens_per_step": "--tokens-per-step",
    "cost_sources": "--cost-source",
    "planners": "--planner",
    "compare": "--compare",
    "seeds": "--seeds",
    "seed": "--seed",
    "time_limit_s": "--time-limit-s",
    "max_schemes": "--max-schemes",
    "max_strategies_solved": "--max-strategies-solved",
    "oversize": "--oversize",
    "price_per_gpu_hour": "--price-per-gpu-hour",
    "target_tokens_per_s": "--target-tokens-per-s",
    "budget_per_hour": "--budget-per-hour",
    "models_file": "--models-file",
    "gpus_file": "--gpus-file",
}
AXES = ("models", "gpus", "num_gpus", "gpus_per_node", "context_caps", "datasets", "tokens_per_step")
AXES += ("cost_sources", "planners")
COUNT_AXES = ("num_gpus", "gpus_per_node", "context_caps", "tokens_per_step")


# ---------------------------------------------------------------------------------------------
# Values as a flag or a spec file writes them: one parser for both
# ---------------------------------------------------------------------------------------------


def comma_list(text: str) -> list[str]:
    """The values of a comma list (`16,32,64`), stripped; none for a blank one. A value left empty
    (`64,,128`, `64,`) is refused: `'64,,128': an empty value between commas`."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        return []
    if not all(parts):
        raise ValueError(f"{text!r}: an empty value between commas")
    return parts


def parse_count(text: str, allow_none: bool = False) -> int | None:
    """A count as typed: `32768`, `32_768`, `32k` (x 1024), `1M` (x 1,000,000); `none` or `null`
    where `allow_none` (a context cap: never split)."""
    lowered = text.strip().lower().replace("_", "")
    if allow_none and lowered in NONE_WORDS:
        return None
    multiplier = COUNT_SUFFIXES.get(lowered[-1:], 1)
    digits = lowered[:-1] if multiplier != 1 else lowered
    if not re.fullmatch(r"[+-]?[0-9]+", digits):
        raise ValueError(f"{text!r}: not an integer" + (" (or none)" if allow_none else ""))
    return int(digits) * multiplier


def axis_values(key: str, value: Any) -> list[Any]:
    """An axis as a flag or a spec file gives it: a comma list string, a list, or one value; the
    strings of a count axis parsed by `parse_count` (`32k`, `1M`, `none`)."""
    if isinstance(value, str):
        values = comma_list(value)
    else:
        values = list(value) if isinstance(value, list | tuple) else [value]
    if key in COUNT_AXES:
        allow_none = key == "context_caps"
        return [parse_count(item, allow_none) if isinstance(item, str) else item for item in values]
    return values


def _all_baselines() -> list[str]:
    """The plain baselines (the interleaved megatron-vpp and wlb-vpp need their recipe's interleaved
    schemes in the profile: a sweep names them to compare them)."""
    from hydraplan.planner.baselines import BASELINES, INTERLEAVED_BASELINES

    return [name for name in BASELINES if name not in INTERLEAVED_BASELINES]


class SweepSpec(Frozen):
    """A what-if study: the axes swept, the steps per configuration, the solver and the questions."""

    models: list[str] = Field(["llama3-8b"], description="Catalog models (with --models-file entries).")
    gpus: list[str] = Field(["h100-sxm-80gb"], description="Catalog GPU types.")
    num_gpus: list[int] = Field([64], description="Cluster sizes.")
    gpus_per_node: list[int] = Field([8], description="GPUs per node.")
    context_caps: list[int | None] = Field([32768], description="Documents are split at this length; null: never.")
    datasets: list[str] = Field(["wikipedia"], description="Bundled names, lengths:FILE (sampled) or batch:FILE.")
    tokens_per_step: list[int] = Field([1_000_000], description="Tokens drawn per step.")
    cost_sources: list[str] = Field([ANALYTIC], description="analytic, or profile:FILE (measured or calibrated).")
    planners: list[str] = Field([HYDRAPLAN], description="hydraplan, hydraplan:<backend>, or a baseline's name.")
    compare: list[str] = Field(default_factory=_all_baselines, description="Baselines for the speedup columns.")
    seeds: int = Field(3, ge=1, le=1000, description="Steps (seeds) per configuration.")
    seed: int = Field(0, ge=0, le=2**31 - 1000, description="Seed of the first step.")
    time_limit_s: TimeLimit = Field(
        0.5, description="Planner budget per step, in seconds or 'auto' (a share of the step, as SolverOptions)."
    )
    max_schemes: int = Field(3, ge=1, le=8)
    max_strategies_solved: int = Field(SolverOptions().max_strategies_solved, ge=1, le=100_000)
    oversize: OversizePolicy = OversizePolicy.ERROR
    price_per_gpu_hour: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=dict, description="Price per GPU-hour per GPU type (`*`: every type without its own)."
    )
    target_tokens_per_s: float | None = Field(None, gt=0)
    budget_per_hour: float | None = Field(None, gt=0)
    models_file: str | None = None
    gpus_file: str | None = None

    @field_validator(*AXES, "compare", mode="before")
    @classmethod
    def _as_the_flags_write_it(cls, value: Any, info: ValidationInfo) -> Any:
        return axis_values(info.field_name, value)

    @field_validator("price_per_gpu_hour", mode="before")
    @classmethod
    def _one_price_for_every_type(cls, value: Any) -> Any:
        return {ANY_GPU: value} if isinstance(value, int | float) and not isinstance(value, bool) else value

    @property
    def size(self) -> int:
        """Configurations of the sweep (profile cost sources do not multiply models and GPUs)."""
        analytic = sum(1 for source in self.cost_sources if source == ANALYTIC)
        clusters = analytic * len(self.models) * len(self.gpus) + (len(self.cost_sources) - analytic)
        rest = len(self.num_gpus) * len(self.gpus_per_node) * len(self.context_caps) * len(self.datasets)
        return clusters * rest * len(self.tokens_per_step) * len(self.planners)


# ---------------------------------------------------------------------------------------------
# Reading: a spec file, flags on top
# ---------------------------------------------------------------------------------------------


def read_spec_file(path: str) -> dict[str, Any]:
    """The mapping of a `.yaml`/`.yml`, `.toml` or `.json` spec file (JSON for other names)."""
    text = read_text(path)
    suffix = Path(path).suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise InputError(f"{path}: YAML spec files need PyYAML: pip install 'hydraplan[whatif]'") from None

            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - every parser's own error class, reported as one line
        raise InputError(f"{path}: not a valid spec file: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a valid spec file: the top level must be a mapping of spec keys")
    return data


Where = Callable[[str], str]


def build_spec(
    file_values: Mapping[str, Any], flag_values: Mapping[str, Any], file_label: str | None
) -> tuple[SweepSpec, Where]:
    """The spec of the file's values with the given flags on top, and the function naming where a
    key was set (`--model`, or `study.yaml: models`); a bad value names its flag or key."""
    where = functools.partial(_where, flag_values=flag_values, file_label=file_label)
    merged = {**file_values, **{key: value for key, value in flag_values.items() if value is not None}}
    try:
        spec = SweepSpec.model_validate(merged)
    except ValidationError as exc:
        detail = exc.errors()[0]
        location = [str(part) for part in detail["loc"]]
        message = str(detail["msg"]).removeprefix("Value error, ")
        key = location[0] if location else ""
        label = where(key) if key in FLAGS else (f"{file_label}: {key}" if file_label else key)
        index = "".join(f"[{part}]" for part in location[1:])
        separator = " " if message.startswith("'") else ": "  # `--num-gpus '64,,128': ...`
        raise InputError(f"{label}{index}{separator}{message}") from None
    for axis in (*AXES, "compare"):
        values = getattr(spec, axis)
        if not values and axis != "compare":
            raise InputError(f"{where(axis)}: empty axis; give at least one value")
        if len(set(map(str, values))) != len(values):
            raise InputError(f"{where(axis)}: {values} repeats a value")
    return spec, where


def _where(key: str, flag_values: Mapping[str, Any], file_label: str | None) -> str:
    if flag_values.get(key) is not None or not file_label:
        return FLAGS.get(key, key)
    return f"{file_label}: {key}"


# ---------------------------------------------------------------------------------------------
# Checking and expanding
# ---------------------------------------------------------------------------------------------


class Resolver:
    """Names of a spec resolved once: catalog entries, datasets, profiles; an unknown one refused."""

    def __init__(self, spec: SweepSpec, where: Where) -> None:
        from hydraplan.api.files import read_gpus, read_models

        self.spec = spec
        self.where = where  # key -> "--flag" or "file: key"
        self.models: dict[str, ModelSpec] = read_models(spec.models_file)
        self.gpus: dict[str, GpuSpec] = read_gpus(spec.gpus_file)
        self.datasets = {name: self._dataset(name) for name in spec.datasets}
        self.cost_sources = {name: self._cost_source(name) for name in spec.cost_sources}
        self._check_names()

    def _check_names(self) -> None:
        from hydraplan.planner.baselines import BASELINES

        _known("models", self.spec.models, self.models, self.where)
        _known("gpus", self.spec.gpus, self.gpus, self.where)
        _known("compare", self.spec.compare, BASELINES, self.where)
        planners = [HYDRAPLAN, *(f"{HYDRAPLAN}:{backend.value}" for backend in SolverBackend), *BASELINES]
        _known("planners", self.spec.planners, planners, self.where)
        for axis in ("tokens_per_step", "num_gpus", "gpus_per_node"):
            for value in getattr(self.spec, axis):
                if value < 1:
                    raise InputError(f"{self.where(axis)} {value}: must be >= 1")
        for cap in self.spec.context_caps:
            if cap is not None and cap < 1:
                raise InputError(f"{self.where('context_caps')}: {cap} must be >= 1 (or none)")
        self._check_clusters()

    def _check_clusters(self) -> None:
        from hydraplan.planner import limits

        for num_gpus, per_node in itertools.product(self.spec.num_gpus, self.spec.gpus_per_node):
            if num_gpus > per_node and num_gpus % per_node:
                raise InputError(
                    f"{self.where('num_gpus')} {num_gpus}: not a whole number of nodes of "
                    f"{self.where('gpus_per_node')} {per_node}"
                )
            if num_gpus > limits.MAX_NUM_GPUS:
                raise InputError(f"{self.where('num_gpus')} {num_gpus}: over the limit of {limits.MAX_NUM_GPUS}")

    def _dataset(self, name: str) -> DatasetRef:
        from hydraplan.api.datasets import DATASETS, load_lengths_file
        from hydraplan.api.files import naming_file

        for prefix, kind in ((LENGTHS_PREFIX, DatasetKind.LENGTHS), (BATCH_PREFIX, DatasetKind.BATCH)):
            if name.startswith(prefix):
                path = name.removeprefix(prefix)
                with naming_file(path):
                    lengths = tuple(load_lengths_file(path))
                label = name if kind == DatasetKind.LENGTHS else batch_label(lengths)
                return DatasetRef(label=label, kind=kind, lengths=lengths)
        if name not in DATASETS:
            valid = ", ".join([*DATASETS, "lengths:FILE", "batch:FILE"])
            raise InputError(f"{self.where('datasets')} {name!r}: unknown dataset; valid: {valid}")
        return DatasetRef(label=name, kind=DatasetKind.BUNDLED, name=name)

    def _cost_source(self, name: str) -> CostSourceRef:
        if name == ANALYTIC:
            return CostSourceRef(label=ANALYTIC)
        if not name.startswith(PROFILE_PREFIX):
            raise InputError(
                f"{self.where('cost_sources')} {name!r}: unknown cost source; valid: analytic, profile:FILE"
            )
        return CostSourceRef(label=name, profile=read_profile(name.removeprefix(PROFILE_PREFIX)))

    def clusters(self) -> list[tuple[CostSourceRef, ModelSpec | None, GpuSpec | None]]:
        """(cost source, model, GPU) of each cluster: every model x GPU for the analytic source, the
        profile's own model and GPU (catalog entries when it names them) for a profile."""
        result: list[tuple[CostSourceRef, ModelSpec | None, GpuSpec | None]] = []
        for name in self.spec.cost_sources:
            source = self.cost_sources[name]
            if source.profile is None:
                for model, gpu in itertools.product(self.spec.models, self.spec.gpus):
                    result.append((source, self.models[model], self.gpus[gpu]))
            else:
                profile = source.profile
                result.append((source, self.models.get(profile.model or ""), self.gpus.get(profile.gpu or "")))
        return result


def _known(key: str, values: list[str], valid: Mapping[str, Any] | list[str], where: Where) -> None:
    for value in values:
        if value not in valid:
            raise InputError(f"{where(key)} {value!r}: unknown; valid: {', '.join(valid)}")


def batch_label(lengths: tuple[int, ...] | list[int]) -> str:
    """`batch:<sha256 prefix>` of an exact batch: the same lengths get the same label anywhere."""
    import hashlib

    return "batch:" + hashlib.sha256(json.dumps(list(lengths)).encode()).hexdigest()[:12]


def expand(spec: SweepSpec, where: Where, max_configurations: int, confirmed: bool) -> list[Configuration]:
    """Every configuration of the spec, in a fixed order; refused over `max_configurations`
    without `confirmed` (--yes), or when a swept GPU type has no price and one is needed."""
    size = spec.size
    if size > max_configurations and not confirmed:
        raise InputError(
            f"the sweep has {size} configurations ({size * spec.seeds} planned steps), over the limit of "
            f"{max_configurations} (--max-configurations); add --yes to run it"
        )
    resolver = Resolver(spec, where)
    clusters = resolver.clusters()
    _check_prices(spec, clusters, where)
    configurations = []
    seeds = tuple(range(spec.seed, spec.seed + spec.seeds))
    for (source, model, gpu), num_gpus, per_node, cap, dataset_name, tokens, planner in itertools.product(
        clusters,
        spec.num_gpus,
        spec.gpus_per_node,
        spec.context_caps,
        spec.datasets,
        spec.tokens_per_step,
        spec.planners,
    ):
        dataset = resolver.datasets[dataset_name]
        exact = dataset.kind == DatasetKind.BATCH
        if exact and tokens != spec.tokens_per_step[0]:
            continue  # an exact batch has its own token count: one configuration, not one per value
        backend = planner.partition(":")[2] or SolverBackend.AUTO.value
        options = SolverOptions(
            solver=SolverBackend(backend) if is_hydraplan(planner) else SolverBackend.AUTO,
            time_limit_s=spec.time_limit_s,
            max_schemes=spec.max_schemes,
            max_strategies_solved=spec.max_strategies_solved,
            seed=spec.seed,
            oversize=spec.oversize,
        )
        configurations.append(
            Configuration(
                model=model,
                gpu=gpu,
                num_gpus=num_gpus,
                gpus_per_node=per_node,
                dataset=dataset,
                context_cap=cap,
                tokens_per_step=None if exact else tokens,
                cost_source=source,
                planner=planner,
                compare=tuple(spec.compare) if is_hydraplan(planner) else (),
                seeds=seeds,
                options=options,
            )
        )
    return configurations


def _check_prices(spec: SweepSpec, clusters: list, where: Where) -> None:
    """Prices are needed for every GPU type once any price or a budget question is given."""
    if not spec.price_per_gpu_hour and spec.budget_per_hour is None:
        return
    for source, _model, gpu in clusters:
        name = gpu.name if gpu is not None else (source.profile.gpu if source.profile is not None else None)
        if name is None:
            raise InputError(f"{where('cost_sources')} {source.label}: the profile names no GPU type to price")
        if price_of(spec.price_per_gpu_hour, name) is None:
            given = ", ".join(spec.price_per_gpu_hour) or "none"
            raise InputError(
                f"{where('price_per_gpu_hour')}: no price for GPU type {name!r} (priced: {given}); "
                f"give NAME=PRICE for every swept GPU type"
            )
