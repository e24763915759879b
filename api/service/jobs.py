"""Background jobs: long plans and what-if sweeps, run by a bounded pool of worker threads.

A job's state (`JobView`, without its sweep items) lives in the store, so any worker or replica
answers GET for it; each finished sweep item is stored once under its own key, so a sweep's
record stays small and is never rewritten with every result. The worker that accepted the job
runs it and holds its lease (`api.service.leases`) while it is queued or running: a job whose
lease is lost (its worker died, or lost the store past `store_retry_s`; missing for `lease_ttl_s`
after it expired, see `leases.lease_lost`) is recorded `failed` with that reason by the next
reader. Every store read and write of the job's loop rides out an outage of `store_retry_s`.

DELETE sets a cancel flag under a separate key (so it never races with the runner's writes): a
running solve reads it through its `cancel` callback and returns its best incumbent, a sweep stops
after the item in progress; a job without a live worker is cancelled at once. A graceful shutdown
stops running solves, waits up to `shutdown_grace_s` for them to record `cancelled` with their
best plan, and records queued jobs `cancelled`. Jobs are counted in the `jobs` registry (507
when `max_jobs` are kept) and keep their results until `job_ttl_s`.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from hydraplan.api.service.leases import Heartbeat, lease_lost, with_retries
from hydraplan.api.service.metrics import Metrics
from hydraplan.api.service.planning import Planning
from hydraplan.api.service.problems import (
    Problem,
    ProblemError,
    describe_errors,
    field_errors,
    make_problem,
    not_found,
    problem_from_exception,
    saturated,
    storage_full,
    too_large,
    unprocessable,
)
from hydraplan.api.service.schemas import (
    JobProgress,
    JobStatus,
    JobView,
    PlanBody,
    PlanJobBody,
    SweepItem,
    SweepJobBody,
)
from hydraplan.api.service.settings import Settings
from hydraplan.api.service.store import Store, StoreUnavailable
from hydraplan.api.service.tenants import admit, current_tenant_var, forget
from hydraplan.api.whatif.engine import evaluate
from hydraplan.api.whatif.schemas import Configuration
from hydraplan.planner.schemas import CostProfile, Plan, PlanRequest

logger = logging.getLogger("hydraplan.jobs")
CANCEL_POLL_INTERVAL_S = 0.05
CANCEL_RETRY_INTERVAL_S = 1.0  # between reads of a cancel flag while the store is unavailable
JOBS_REGISTRY = "jobs"


def job_key(job_id: str) -> str:
    return f"job:{job_id}"


def cancel_key(job_id: str) -> str:
    return f"job-cancel:{job_id}"


def lease_key(job_id: str) -> str:
    return f"job-lease:{job_id}"


def item_key(job_id: str, index: int) -> str:
    return f"job-item:{job_id}:{index}"


def job_location(job_id: str) -> str:
    return f"/v1/jobs/{job_id}"


def utc_now() -> datetime:
    return datetime.now(UTC)


class CancelFlag:
    """`cancel()` callback over the store's cancel key, polled at most every 50 ms.

    It never raises: while the store is unavailable the flag keeps its last value (the solve goes
    on) and is read again after `CANCEL_RETRY_INTERVAL_S`, so an outage costs the solver at most
    one store timeout per interval instead of failing the job."""

    def __init__(self, store: Store, job_id: str, stopping: threading.Event) -> None:
        self._store = store
        self._stopping = stopping
        self._key = cancel_key(job_id)
        self._next_check = 0.0
        self._cancelled = False

    def __call__(self) -> bool:
        if self._cancelled or self._stopping.is_set():
            return True
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + CANCEL_POLL_INTERVAL_S
            try:
                self._cancelled = self._store.get(self._key) is not None
            except StoreUnavailable:
                self._next_check = time.monotonic() + CANCEL_RETRY_INTERVAL_S
                logger.warning("could not read %s (store unavailable); the job goes on", self._key)
        return self._cancelled

    def check_now(self) -> bool:
        self._next_check = 0.0
        return self()


def sweep_size(body: SweepJobBody) -> int:
    """Items of the sweep, from the axes' lengths (nothing expanded)."""
    vary = body.vary
    return len(vary.num_gpus or [0]) * len(vary.model or [0]) * len(vary.gpu or [0])


def sweep_items(body: SweepJobBody, max_items: int, max_sequences: int) -> list[PlanBody]:
    """Every combination of the swept values, each a complete plan body; 422 / 413 before any is
    built when there are more than `max_items` or more than `max_sequences` over all of them."""
    vary = body.vary
    base = body.base
    size = sweep_size(body)
    if size > max_items:
        raise unprocessable(f"the sweep has {size} items, over this server's limit of {max_items}", ("body", "vary"))
    if size * len(base.lengths) > max_sequences:
        raise too_large(
            f"the sweep plans {size} x {len(base.lengths)} = {size * len(base.lengths)} sequences, over this "
            f"server's limit of {max_sequences} per sweep"
        )
    if (vary.model is not None or vary.gpu is not None) and base.model is None:
        raise unprocessable(
            "vary.model and vary.gpu need a base with model+gpu, not profile or profile_id",
            ("body", "vary"),
        )
    axes = itertools.product(vary.num_gpus or [base.num_gpus], vary.model or [base.model], vary.gpu or [base.gpu])
    items = []
    for num_gpus, model, gpu in axes:
        update = {"num_gpus": num_gpus, "model": model, "gpu": gpu}
        try:
            items.append(PlanBody.model_validate({**base.model_dump(exclude_none=True), **update}))
        except ValidationError as exc:
            errors = field_errors(exc.errors(include_url=False))
            detail = f"sweep item num_gpus={num_gpus}: {describe_errors(errors)}"
            raise unprocessable(detail, ("body", "vary")) from None
    return items


class JobRunner:
    """Accepts jobs, runs them in `job_workers` threads and keeps their state in the store."""

    def __init__(self, settings: Settings, store: Store, planning: Planning, metrics: Metrics) -> None:
        self._settings = settings
        self._store = store
        self._planning = planning
        self._metrics = metrics
        self._executor: ThreadPoolExecutor | None = None  # made on first use, again after shutdown
        self._lock = threading.Condition()
        self._queued: dict[str, JobView] = {}
        self._num_running = 0
        self._latest: dict[str, JobView] = {}  # the last saved view of each running job
        self._stopping = threading.Event()  # set at shutdown: running solves stop early
        self._leases = Heartbeat(store, settings.lease_ttl_s, "hydraplan-job-leases")

    def submit(self, body: PlanJobBody | SweepJobBody) -> JobView:
        """Validate, record as queued and schedule; 503 when too many jobs are pending here,
        507 when the store keeps `max_jobs` already."""
        items = self._validate(body)
        view = JobView(
            job_id="job-" + secrets.token_hex(12),
            kind=body.kind,
            status=JobStatus.QUEUED,
            created_at=utc_now(),
            progress=JobProgress(done=0, total=len(items)),
            owner=current_tenant_var.get().name,
        )
        with self._lock:
            pending = len(self._queued) + self._num_running
            if pending >= self._settings.max_pending_jobs:
                self._metrics.rejections.labels(pool="jobs").inc()
                raise saturated(
                    f"{pending} jobs are queued or running on this worker; retry in {self._settings.retry_after_s} s",
                    self._settings.retry_after_s,
                )
            settings = self._settings
            refused = admit(
                self._store,
                current_tenant_var.get(),
                JOBS_REGISTRY,
                view.job_id,
                settings.job_ttl_s,
                settings.max_jobs,
                settings.max_jobs_per_tenant,
            )
            if refused == "tenant":
                raise storage_full(
                    f"tenant {view.owner!r} keeps at most {settings.max_jobs_per_tenant} jobs (finished ones for "
                    f"{settings.job_ttl_s:g} s); delete finished ones (DELETE /v1/jobs/{{id}}) or retry later"
                )
            if refused == "server":
                raise storage_full(
                    f"this server keeps at most {settings.max_jobs} jobs (finished ones for "
                    f"{settings.job_ttl_s:g} s); retry later"
                )
            self._queued[view.job_id] = view
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._settings.job_workers, thread_name_prefix="hydraplan-job")
            executor, stopping = self._executor, self._stopping
        try:
            self._leases.grant(lease_key(view.job_id))
            self._save(view)
        except StoreUnavailable:  # never accepted: nothing queued, nothing to renew (503)
            with self._lock:
                self._queued.pop(view.job_id, None)
            self._leases.drop(lease_key(view.job_id))
            raise
        executor.submit(contextvars.copy_context().run, self._run, view, items, stopping)
        return view

    def get(self, job_id: str) -> JobView:
        """The job with its finished sweep items; a job whose worker is gone becomes `failed`.
        404 for a job of another tenant (unless the caller is an admin), as for an unknown one."""
        view = self._read(job_id)
        if not current_tenant_var.get().may_see(view.owner):
            raise not_found(f"job {job_id!r} is unknown or expired")
        if not view.status.finished and lease_lost(self._store, lease_key(job_id), self._settings.lease_ttl_s):
            view = self._read(job_id)  # it may have finished between the two reads
            if not view.status.finished:
                view = self._abandon(view, JobStatus.FAILED, "its worker stopped (no heartbeat)")
        if not view.cancel_requested and self._store.get(cancel_key(job_id)) is not None:
            view = view.model_copy(update={"cancel_requested": True})
        if view.kind == "sweep":
            view = view.model_copy(update={"items": self._items(job_id, view.progress.done)})
        return view

    def cancel_or_delete(self, job_id: str) -> JobView | None:
        """DELETE: a finished job is removed with its results (None; its place in the cap is
        free at once); an unfinished one is cancelled as by `cancel` (its view)."""
        view = self.get(job_id)
        if not view.status.finished:
            return self._cancel(view)
        total = view.progress.total if view.kind == "sweep" else 0
        for key in (job_key(job_id), cancel_key(job_id), *(item_key(job_id, index) for index in range(total))):
            self._store.delete(key)
        forget(self._store, view.owner, JOBS_REGISTRY, job_id)
        return None

    def _cancel(self, view: JobView) -> JobView:
        """Flag the job for cancellation (a job without a live worker ends now)."""
        job_id = view.job_id
        self._store.set(cancel_key(job_id), "1", self._settings.job_ttl_s)
        if self._store.get(lease_key(job_id)) is None:
            return self.get(job_id)  # now cancelled by `_abandon` (or finished meanwhile)
        return view.model_copy(update={"cancel_requested": True})

    def shutdown(self) -> None:
        """Stop running solves early, wait (at most `shutdown_grace_s`) for them to record
        `cancelled` with their best plan, and record queued jobs `cancelled`."""
        with self._lock:
            self._stopping.set()
            self._stopping = threading.Event()
            executor, self._executor = self._executor, None
            dropped, self._queued = list(self._queued.values()), {}
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        for view in dropped:
            try:
                self._finish(view, JobStatus.CANCELLED)
            except StoreUnavailable:  # its lease expires: readers record it failed
                logger.exception("could not record job %s as cancelled", view.job_id)
        with self._lock:
            self._lock.wait_for(lambda: self._num_running == 0, timeout=self._settings.shutdown_grace_s)
            if self._num_running:
                logger.warning("%d jobs still running at shutdown; their leases expire", self._num_running)
        self._leases.stop()

    # -- running --------------------------------------------------------------------------------

    def _validate(self, body: PlanJobBody | SweepJobBody) -> list[PlanBody]:
        settings = self._settings
        if isinstance(body, PlanJobBody):
            items = [body.request]
        else:
            items = sweep_items(body, settings.max_sweep_items, settings.max_sweep_sequences)
        for item in items:
            self._planning.check_limits(len(item.lengths), item.num_gpus, item.options, synchronous=False)
            self._planning.check_baselines(item.baselines)
            if item.model is not None:
                self._planning.model(item.model)
                self._planning.gpu(item.gpu)
        return items

    def _run(self, view: JobView, items: list[PlanBody], stopping: threading.Event) -> None:
        with self._lock:
            if self._queued.pop(view.job_id, None) is None:
                return  # dropped at shutdown, already recorded as cancelled
            self._num_running += 1
            self._latest[view.job_id] = view
        cancel = CancelFlag(self._store, view.job_id, stopping)
        try:
            if cancel.check_now():
                view = self._finish(view, JobStatus.CANCELLED)
                return
            view = self._save(view.model_copy(update={"status": JobStatus.RUNNING, "started_at": utc_now()}))
            if view.kind == "plan":
                view = self._run_plan(view, items[0], cancel)
            else:
                view = self._run_sweep(view, items, cancel)
        except Exception as exc:  # a bug or a store failure: record it, keep the worker alive
            logger.exception("job %s failed", view.job_id)
            view = self._latest.get(view.job_id, view)  # with the progress and items it stored
            try:
                view = self._finish(view, JobStatus.FAILED, error=self._problem(view.job_id, exc))
            except StoreUnavailable:  # its lease expires: readers record it failed
                logger.exception("could not record job %s as failed", view.job_id)
        finally:
            self._leases.release(lease_key(view.job_id))
            with self._lock:
                self._latest.pop(view.job_id, None)
                self._num_running -= 1
                self._lock.notify_all()
            self._metrics.jobs.labels(kind=view.kind, status=str(view.status)).inc()

    def _run_plan(self, view: JobView, body: PlanBody, cancel: CancelFlag) -> JobView:
        planning = self._planning
        try:
            request = body.plan_request()
            profile = self._profile(body)
            plan = planning.solve(request, profile, body.baselines, body.previous_plan, cancel, origin="job")
        except (ProblemError, ValueError, ValidationError) as exc:
            return self._finish(view, JobStatus.FAILED, error=self._problem(view.job_id, exc))
        status = JobStatus.CANCELLED if cancel.check_now() else JobStatus.SUCCEEDED
        oversize = self._oversize(plan.model_dump_json())
        if oversize is not None:
            return self._finish(view, JobStatus.FAILED, error=self._error(view.job_id, oversize))
        return self._finish(view, status, result=plan, progress=JobProgress(done=1, total=1))

    def _run_sweep(self, view: JobView, items: list[PlanBody], cancel: CancelFlag) -> JobView:
        for index, body in enumerate(items):
            if cancel.check_now():
                return self._finish(view, JobStatus.CANCELLED)
            item = self._sweep_item(view.job_id, index, body, cancel)
            self._write(item_key(view.job_id, index), item.model_dump_json())
            view = self._save(view.model_copy(update={"progress": JobProgress(done=index + 1, total=len(items))}))
        status = JobStatus.CANCELLED if cancel.check_now() else JobStatus.SUCCEEDED
        return self._finish(view, status)

    def _sweep_item(self, job_id: str, index: int, body: PlanBody, cancel: CancelFlag) -> SweepItem:
        """One item through the what-if engine (the CLI's `hydraplan whatif` runs the same code)."""
        fields: dict[str, Any] = {
            "index": index,
            "num_gpus": body.num_gpus,
            "model": _name(body.model),
            "gpu": _name(body.gpu),
        }
        try:
            configuration = sweep_configuration(body, self._planning)
        except (ProblemError, ValueError, ValidationError) as exc:
            return SweepItem(**fields, status=JobStatus.FAILED, error=self._problem(job_id, exc))

        def solve_step(request: PlanRequest, profile: CostProfile, baselines: Sequence[str]) -> Plan:
            return self._planning.solve(request, profile, baselines, cancel=cancel, origin="job")

        outcome = evaluate(
            index,
            configuration,
            solve_step=solve_step,
            profile_for=lambda _: self._profile(body),
            refusals=(ProblemError, ValueError, ValidationError),
        )
        if outcome.error is not None:
            error = self._problem(job_id, outcome.error)
            return SweepItem(**fields, status=JobStatus.FAILED, error=error, row=outcome.row)
        item = SweepItem(**fields, status=JobStatus.SUCCEEDED, plan=outcome.plans[0], row=outcome.row)
        oversize = self._oversize(item.model_dump_json())
        if oversize is not None:
            return SweepItem(**fields, status=JobStatus.FAILED, error=self._error(job_id, oversize))
        return item

    def _profile(self, body: PlanBody) -> CostProfile:
        """The body's cost profile; an uploaded one is read from the store, retried like a write."""
        return with_retries(
            lambda: self._planning.profile_for(body, body.num_gpus, body.gpus_per_node),
            self._settings.store_retry_s,
            "reading the cost profile",
        )

    def _oversize(self, text: str) -> str | None:
        """Why a result cannot be stored (over `max_job_bytes`), or None."""
        if len(text) <= self._settings.max_job_bytes:
            return None
        return f"the result is {len(text)} bytes of JSON, over this server's limit of {self._settings.max_job_bytes}"

    # -- the store --------------------------------------------------------------------------------

    def _read(self, job_id: str) -> JobView:
        text = self._store.get(job_key(job_id))
        if text is None:
            raise not_found(f"job {job_id!r} is unknown or expired")
        return JobView.model_validate_json(text)

    def _items(self, job_id: str, count: int) -> list[SweepItem]:
        texts = [self._store.get(item_key(job_id, index)) for index in range(count)]
        return [SweepItem.model_validate_json(text) for text in texts if text is not None]

    def _abandon(self, view: JobView, status: JobStatus, reason: str) -> JobView:
        """Record a job that no worker runs any more (`cancelled` if that was asked for)."""
        if self._store.get(cancel_key(view.job_id)) is not None:
            status, reason = JobStatus.CANCELLED, f"cancelled; {reason}"
        error = self._error(view.job_id, f"job {view.job_id} ended {status}: {reason}", 503, "worker-lost")
        return self._finish(view, status, error=error if status == JobStatus.FAILED else None)

    def _finish(self, view: JobView, status: JobStatus, **update: Any) -> JobView:
        return self._save(view.model_copy(update={"status": status, "finished_at": utc_now(), **update}))

    def _save(self, view: JobView) -> JobView:
        self._write(job_key(view.job_id), view.model_dump_json())
        with self._lock:
            if view.job_id in self._latest:
                self._latest[view.job_id] = view
        return view

    def _write(self, key: str, text: str) -> None:
        """Store `text` for the job's TTL, retrying a store outage for up to `store_retry_s`."""
        ttl_s = self._settings.job_ttl_s
        with_retries(lambda: self._store.set(key, text, ttl_s), self._settings.store_retry_s, f"writing {key}")

    @staticmethod
    def _problem(job_id: str, exc: Exception) -> Problem:
        return problem_from_exception(exc, job_location(job_id))

    @staticmethod
    def _error(job_id: str, detail: str, status: int = 413, slug: str | None = None) -> Problem:
        return make_problem(status, detail, job_location(job_id), slug=slug)


def sweep_configuration(body: PlanBody, planning: Planning) -> Configuration:
    """The what-if configuration of one sweep item: the request's exact batch, one step at its seed."""
    from hydraplan.api.whatif.schemas import (
        ANALYTIC,
        HYDRAPLAN,
        CostSourceRef,
        DatasetKind,
        DatasetRef,
    )
    from hydraplan.api.whatif.spec import batch_label

    if body.model is not None:
        model, gpu, source = planning.model(body.model), planning.gpu(body.gpu), CostSourceRef(label=ANALYTIC)
    else:
        label = f"profile:{body.profile_id}" if body.profile_id is not None else "profile:inline"
        model, gpu, source = None, None, CostSourceRef(label=label, profile=body.profile)
    backend = body.options.solver.value
    previous = body.previous_strategy or (body.previous_plan.strategy if body.previous_plan is not None else None)
    return Configuration(
        model=model,
        gpu=gpu,
        num_gpus=body.num_gpus,
        gpus_per_node=body.gpus_per_node,
        dataset=DatasetRef(label=batch_label(body.lengths), kind=DatasetKind.BATCH, lengths=tuple(body.lengths)),
        context_cap=None,
        tokens_per_step=None,
        cost_source=source,
        planner=HYDRAPLAN if backend == "auto" else f"{HYDRAPLAN}:{backend}",
        compare=tuple(body.baselines),
        seeds=(body.options.seed,),
        options=body.options,
        previous_strategy=previous,
    )


def _name(ref: Any) -> str | None:
    if ref is None or isinstance(ref, str):
        return ref
    return getattr(ref, "name", None)
