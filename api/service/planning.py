"""The service's view of the planner: resolve a cost source, enforce limits, solve, record metrics.

Everything here is synchronous and CPU-bound or store-bound: the routes call it through the
bounded solver pool (`api.service.solving`) or FastAPI's thread pool, never on the event loop.
Analytic profiles are deterministic in (model, gpu, num_gpus, gpus_per_node), and uploaded
profiles are immutable (their id is their content hash), so both are kept parsed in an LRU bounded
by bytes (`profile_cache_bytes`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from hydraplan.api.service.metrics import Metrics
from hydraplan.api.service.problems import not_found, storage_full, too_large, unprocessable
from hydraplan.api.service.schemas import PipelineEstimate, PlanBody, StrategyPart
from hydraplan.api.service.settings import Settings
from hydraplan.api.service.store import Store
from hydraplan.api.service.tenants import ANONYMOUS, Tenant, admit, current_tenant_var, forget
from hydraplan.cost_models.analytic import AnalyticOptions, build_profile
from hydraplan.cost_models.catalog import load_gpus, load_models
from hydraplan.cost_models.profile_io import ProfileError, load_profile
from hydraplan.planner import limits
from hydraplan.planner.baselines import recipe_counts_for, wants_interleaved
from hydraplan.planner.budget import AUTO, AUTO_MAX_S
from hydraplan.planner.cache import WeightedLru
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import (
    LONGEST_POWER,
    CostProfile,
    GpuSpec,
    ModelSpec,
    Plan,
    PlanRequest,
    SolverOptions,
    TrainingRecipe,
    default_in_flight_micro_batches,
)
from hydraplan.planner.scheme import ParallelScheme
from hydraplan.planner.solve import evaluate_strategy, solve
from hydraplan.planner.strategies import named_chunk_counts

Cancel = Callable[[], bool]
# Wall time of every planner call of the current request, for its Server-Timing header. The route
# binds a fresh list; solver threads run in a copy of the request's context and append to it.
_solve_timings: ContextVar[list[float] | None] = ContextVar("hydraplan_solve_timings", default=None)


def longest_budget_s(options: SolverOptions) -> float:
    """The most seconds a solve of `options` may take: its time limit; `auto`'s ceiling, whatever
    the batch (`planner.budget`), since the limits are checked before the cost source resolves."""
    limit = options.time_limit_s
    return AUTO_MAX_S if limit == AUTO else float(limit)


def start_solve_timing() -> list[float]:
    """Collect the planner wall times of this request's solves (call before submitting them)."""
    timings: list[float] = []
    _solve_timings.set(timings)
    return timings


def server_timing_header(timings: list[float]) -> dict[str, str]:
    """`Server-Timing: solve;dur=<ms>`: time spent inside the planner, the rest is API overhead."""
    return {"Server-Timing": f"solve;dur={sum(timings) * 1e3:.3f}"}


def profile_bytes(profile: CostProfile) -> int:
    """Memory a parsed profile holds, roughly: ~1 KB per scheme entry plus its notes."""
    return 1024 * (1 + len(profile.schemes)) + len(profile.notes)


PROFILES_REGISTRY = "profiles"


def profile_key(profile_id: str) -> str:
    return f"profile:{profile_id}"


def profile_owner_key(profile_id: str) -> str:
    return f"profile-owner:{profile_id}"


def profile_id_of(profile: CostProfile, tenant: Tenant = ANONYMOUS) -> str:
    """Content hash of a profile's canonical JSON: the same profile always gets the same id. A
    tenant that is not an admin hashes its name in too, so two tenants never share an id."""
    salt = "" if tenant.admin else f"{tenant.name}\n"
    digest = hashlib.sha256((salt + profile.model_dump_json()).encode()).hexdigest()
    return "prof-" + digest[:24]


class Planning:
    """Catalog lookups, cost-profile resolution and the planner calls of one app."""

    def __init__(self, settings: Settings, store: Store, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.models: dict[str, ModelSpec] = load_models()
        self.gpus: dict[str, GpuSpec] = load_gpus()
        budget = settings.profile_cache_bytes // 2
        self._analytic: WeightedLru[tuple[str | int, ...], CostProfile] = WeightedLru(budget, profile_bytes)
        self._uploaded: WeightedLru[str, CostProfile] = WeightedLru(budget, profile_bytes)

    # -- cost sources ---------------------------------------------------------------------------

    def model(self, ref: str | ModelSpec, field: str = "model") -> ModelSpec:
        return ref if isinstance(ref, ModelSpec) else _lookup(self.models, ref, field)

    def gpu(self, ref: str | GpuSpec, field: str = "gpu") -> GpuSpec:
        return ref if isinstance(ref, GpuSpec) else _lookup(self.gpus, ref, field)

    def analytic_profile(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        num_gpus: int,
        gpus_per_node: int,
        recipe: TrainingRecipe | None = None,
        virtual_stages: Sequence[int] = (),
    ) -> CostProfile:
        """The analytic profile for the recipe (cached), pricing the interleaved schemes of
        `virtual_stages` too; 422 when the model fits no scheme of the cluster."""
        recipe = recipe or TrainingRecipe()
        chunks = tuple(sorted(set(virtual_stages) - {1}))
        key = (model.model_dump_json(), gpu.model_dump_json(), num_gpus, gpus_per_node, recipe.model_dump_json())
        key = (*key, *chunks) if chunks else key

        def make() -> CostProfile:
            try:
                options = AnalyticOptions.from_recipe(recipe)
                return build_profile(model, gpu, num_gpus, gpus_per_node, options, virtual_stages=chunks)
            except ValueError as exc:
                raise unprocessable(" ".join(str(exc).split()), ("body", "model")) from None

        return self._analytic.get_or_make(key, make)

    def uploaded_profile(self, profile_id: str, field: str = "profile_id") -> CostProfile:
        """A profile uploaded with POST /v1/profiles; 404 naming the id when unknown (or deleted:
        the parsed copy this worker may keep is used only while the store still has the profile)."""
        unknown = not_found(f"{field} {profile_id!r} is unknown (upload it with POST /v1/profiles)")

        def make() -> CostProfile:
            text = self.store.get(profile_key(profile_id))
            if text is None:
                raise unknown
            return CostProfile.model_validate_json(text)

        if not self._visible(profile_id):
            raise unknown
        return self._uploaded.get_or_make(profile_id, make)

    def delete_profile(self, profile_id: str) -> None:
        """Remove an uploaded profile (its place in the cap is free at once); 404 when unknown
        or another tenant's."""
        owner = self.store.get(profile_owner_key(profile_id))
        if not self._visible(profile_id) or not self.store.delete(profile_key(profile_id)):
            raise not_found(f"profile_id {profile_id!r} is unknown or expired")
        self.store.delete(profile_owner_key(profile_id))
        forget(self.store, owner, PROFILES_REGISTRY, profile_id)

    def _visible(self, profile_id: str) -> bool:
        """Whether the store has the profile and the request's tenant may use it."""
        tenant = current_tenant_var.get()
        if tenant.admin:
            return self.store.exists(profile_key(profile_id))
        return self.store.get(profile_owner_key(profile_id)) == tenant.name and self.store.exists(
            profile_key(profile_id)
        )

    def save_profile(self, profile: CostProfile) -> str:
        """Store an uploaded profile under its content hash; returns the id."""
        try:
            profile = load_profile(profile.model_dump(mode="json"))
        except ProfileError as exc:
            raise unprocessable(" ".join(str(exc).split()), ("body",)) from None
        text = profile.model_dump_json()
        settings = self.settings
        if len(text) > settings.max_profile_bytes:
            raise too_large(
                f"the profile is {len(text)} bytes of JSON, over this server's limit of {settings.max_profile_bytes}"
            )
        tenant = current_tenant_var.get()
        profile_id = profile_id_of(profile, tenant)
        refused = admit(
            self.store,
            tenant,
            PROFILES_REGISTRY,
            profile_id,
            settings.profile_ttl_s,
            settings.max_profiles,
            settings.max_profiles_per_tenant,
        )
        if refused is not None:
            holder = (
                f"tenant {tenant.name!r} keeps at most {settings.max_profiles_per_tenant}"
                if refused == "tenant"
                else f"this server keeps at most {settings.max_profiles}"
            )
            raise storage_full(
                f"{holder} uploaded profiles (each for {settings.profile_ttl_s:g} s); delete one "
                "(DELETE /v1/profiles/{id}), send the profile inline instead, or retry later"
            )
        self.store.set(profile_owner_key(profile_id), tenant.name, settings.profile_ttl_s)
        self.store.set(profile_key(profile_id), text, settings.profile_ttl_s)
        return profile_id

    def profile_for(self, body: Any, num_gpus: int, gpus_per_node: int) -> CostProfile:
        """The cost profile a body names: model+gpu (analytic), inline profile, or profile_id."""
        if body.model is not None:
            model, gpu = self.model(body.model), self.gpu(body.gpu)
            recipe = getattr(body, "recipe", None)
            counts = [*_named_chunk_counts(body), *(getattr(body, "virtual_stages", None) or ())]
            named = [*(getattr(body, "baselines", None) or ()), getattr(body, "baseline", None)]
            if wants_interleaved(named):  # megatron-vpp, wlb-vpp: their recipe's interleaved schemes
                counts += recipe_counts_for(model.name, model.num_layers, num_gpus)
            return self.analytic_profile(model, gpu, num_gpus, gpus_per_node, recipe, counts)
        if body.profile is not None:
            return body.profile
        return self.uploaded_profile(body.profile_id)

    # -- limits ---------------------------------------------------------------------------------

    def check_limits(
        self, num_sequences: int, num_gpus: int, options: SolverOptions, *, synchronous: bool = True
    ) -> None:
        """413 for too many sequences; 422 for a cluster or time budget over the server's limits."""
        settings = self.settings
        if num_sequences > settings.max_sequences:
            raise too_large(
                f"lengths: {num_sequences} sequences exceed this server's limit of {settings.max_sequences} per request"
            )
        if num_gpus > settings.max_num_gpus:
            raise unprocessable(
                f"num_gpus {num_gpus} exceeds this server's limit of {settings.max_num_gpus}",
                ("body", "num_gpus"),
            )
        if synchronous and longest_budget_s(options) > settings.max_sync_time_limit_s:
            given = options.time_limit_s
            value = f"{given} (up to {AUTO_MAX_S:g} s)" if given == AUTO else f"{given:g}"
            raise unprocessable(
                f"options.time_limit_s {value} exceeds this server's limit of "
                f"{settings.max_sync_time_limit_s:g} s for synchronous plans; use POST /v1/jobs",
                ("body", "options", "time_limit_s"),
            )

    def check_schedule_size(self, plans: Sequence[Plan]) -> None:
        """The server's limits on plans sent to be checked or drawn: the sequences and cluster
        `/v1/plans` accepts (413 / 422, as `check_limits`), and 422 when simulating them would
        take more than `max_check_operations` 1F1B operations: the checker's and the timeline's
        reference simulation is pure Python (a few microseconds per operation), so this bounds
        one request's CPU time to about a second."""
        settings = self.settings
        for plan in plans:
            if plan.num_sequences > settings.max_sequences:
                raise too_large(
                    f"plan.input_lengths: {plan.num_sequences} sequences exceed this server's limit of "
                    f"{settings.max_sequences} per request"
                )
            if plan.num_gpus > settings.max_num_gpus:
                raise unprocessable(
                    f"plan.num_gpus {plan.num_gpus} exceeds this server's limit of {settings.max_num_gpus}",
                    ("body", "plan", "num_gpus"),
                )
        operations = sum(schedule_operations(plan) for plan in plans)
        limit = self.settings.max_check_operations
        if operations > limit:
            raise unprocessable(
                f"plan: {operations} 1F1B operations (2 x stages x micro-batches over its pipelines"
                f"{' and the compared plans' if len(plans) > 1 else ''}) exceed this server's limit of {limit}",
                ("body", "plan"),
            )

    def check_baselines(self, names: Sequence[str]) -> None:
        from hydraplan.planner.baselines import BASELINES

        valid = ", ".join(sorted(BASELINES))
        for index, name in enumerate(names):
            if name not in BASELINES:
                raise unprocessable(
                    f"baselines[{index}] {name!r} is unknown; valid: {valid}",
                    ("body", "baselines", index),
                )

    # -- planner calls --------------------------------------------------------------------------

    def plan(self, body: PlanBody, cancel: Cancel | None = None, origin: str = "plans") -> Plan:
        """Solve one POST /v1/plans body (limits already checked by the caller)."""
        request = body.plan_request()
        profile = self.profile_for(body, body.num_gpus, body.gpus_per_node)
        return self.solve(request, profile, body.baselines, body.previous_plan, cancel, origin)

    def solve(
        self,
        request: PlanRequest,
        profile: CostProfile,
        baselines: Sequence[str] = (),
        previous_plan: Plan | None = None,
        cancel: Cancel | None = None,
        origin: str = "plans",
    ) -> Plan:
        """`planner.solve.solve` with the service's bookkeeping around it."""
        self.check_baselines(baselines)
        started = time.perf_counter()
        plan = solve(request, profile, baselines=tuple(baselines), cancel=cancel, previous_plan=previous_plan)
        elapsed_s = time.perf_counter() - started
        self.metrics.observe_plan(plan.status, plan.gap, elapsed_s, origin)
        timings = _solve_timings.get()
        if timings is not None:
            timings.append(elapsed_s)
        return plan

    def estimate(
        self,
        request: PlanRequest,
        profile: CostProfile,
        strategy: Sequence[StrategyPart] | None,
        baseline: str | None,
    ) -> Plan:
        """A fixed strategy's plan, or a baseline's, without searching."""
        if baseline is not None:
            from hydraplan.planner.baselines import run_baseline

            self.check_baselines([baseline])
            return run_baseline(baseline, request, profile)
        assert strategy is not None
        parts = [(_scheme(part, index), part.num_pipelines) for index, part in enumerate(strategy)]
        return evaluate_strategy(request, profile, parts)


def schedule_operations(plan: Plan) -> int:
    """1F1B operations of a plan's pipelines (the work of simulating its schedule)."""
    return sum(
        limits.schedule_operations(pipeline.scheme.pp * pipeline.scheme.v, len(pipeline.micro_batches))
        for pipeline in plan.pipelines
    )


def pipeline_estimates(plan: Plan) -> list[PipelineEstimate]:
    """Per-pipeline time and memory of a plan, memory from its profile's memory model."""
    cost = ProfileCostModel(plan.cost_profile)
    by_key = {entry.scheme: entry for entry in plan.cost_profile.schemes}
    estimates = []
    for pipeline in plan.pipelines:
        scheme = pipeline.scheme
        entry = by_key.get(scheme.scheme)
        largest = max((batch.num_tokens for batch in pipeline.micro_batches), default=0)
        peak = None
        if entry is not None and entry.static_bytes is not None:
            peak = _peak_memory_bytes(entry, pipeline.micro_batches)
        estimates.append(
            PipelineEstimate(
                index=pipeline.index,
                scheme=scheme,
                num_sequences=pipeline.num_sequences,
                num_tokens=pipeline.num_tokens,
                num_micro_batches=len(pipeline.micro_batches),
                time_s=pipeline.time_s,
                capacity_tokens=cost.capacity_tokens(scheme.scheme),
                max_micro_batch_tokens=largest,
                peak_memory_bytes=peak,
            )
        )
    return estimates


def _peak_memory_bytes(entry: Any, micro_batches: Sequence[Any]) -> float:
    """static + in_flight * max over micro-batches of (m1 * tokens + m2 * sum l^2 + m3 * max(l)^2 +
    m4 * max(l)^2.5) (upper bound); an interleaved entry's bytes are one chunk's and its in-flight
    count is of chunk micro-batches."""
    in_flight = entry.in_flight_micro_batches or default_in_flight_micro_batches(entry.pp, entry.v)
    in_flight = min(in_flight, max(1, len(micro_batches) * entry.v))
    per_token = entry.activation_bytes_per_token or 0.0
    per_sq_token = entry.activation_bytes_per_token_sq
    per_longest_sq = getattr(entry, "activation_bytes_per_longest_sq", 0.0)
    per_longest_pow = getattr(entry, "activation_bytes_per_longest_pow", 0.0)
    largest = max(
        (
            per_token * batch.num_tokens
            + per_sq_token * sum(length * length for length in batch.lengths)
            + per_longest_sq * max(batch.lengths, default=0) ** 2
            + per_longest_pow * max(batch.lengths, default=0) ** LONGEST_POWER
            for batch in micro_batches
        ),
        default=0.0,
    )
    return float(entry.static_bytes + in_flight * largest)


def _named_chunk_counts(body: Any) -> list[int]:
    """The chunk counts v > 1 a body's strategy pool, previous strategy or fixed strategy names: its
    analytic profile prices those interleaved schemes."""
    options = getattr(body, "options", None)
    texts = [*(getattr(options, "strategy_pool", None) or ()), getattr(body, "previous_strategy", None)]
    counts = set(named_chunk_counts(texts))
    parts = getattr(body, "strategy", None)
    if isinstance(parts, list):
        counts.update(part.v for part in parts if isinstance(part, StrategyPart) and part.v > 1)
    return sorted(counts)


def _scheme(part: StrategyPart, index: int) -> ParallelScheme:
    try:
        return ParallelScheme(part.tp, part.pp, part.cp, part.v)
    except ValueError as exc:
        raise unprocessable(str(exc), ("body", "strategy", index)) from None


def _lookup(specs: dict[str, Any], name: str, field: str) -> Any:
    try:
        return specs[name]
    except KeyError:
        raise not_found(f"{field} {name!r} is unknown; valid: {', '.join(sorted(specs))}") from None
