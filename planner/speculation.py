"""Strategy solves, scheme-set expansions and polishes ahead of the search, in worker processes,
without changing its plan.

The search (`planner.search`) solves one queued strategy at a time: the one with the best
estimate, then it updates the incumbent, expands scheme sets and looks at the queue again. Each
solve (greedy dispatch and packing, `search.solve_strategy`) is a pure function of the strategy,
the items, the cost profile and the previous strategy; each expansion (`Frontier.expansion`: a
set's strategies with their bounds and estimates) one of the set, the tables and the incumbent;
each polish of the best strategies found (LP re-dispatch and refinement, `search.polish_candidate`)
one of the candidate, up to the deadline that may cut it (then the search is marked cut, as it
would be). All can be computed anywhere, early: while the incumbent stands, the sets are expanded
in the order of their heap, which only shrinks during the search proper; the candidates to polish
are known when the search proper ends.

`SpeculativeSolver` keeps the workers of an executor busy with what the search is most likely to
ask for next (the head of its strategy queue, `prefetch`; the next sets of its heap under the
current incumbent, `prefetch_expansions`; all but the first candidate to polish,
`prefetch_polishes`); when the search asks for one (`solve`, `expansion`, `polish`), a
task a worker has started is awaited (it began earlier than one started here now would) for at
most half what the last such task took here, and one still waiting in the executor's queue is
cancelled and computed here at once. What the search solves and expands, in which order, and every
result are therefore exactly those of the search alone, for any number of workers and any timing
(the merge is deterministic by construction); a worker only saves the search the time of the
tasks it guessed right. Results nobody asks for are dropped.

The workers are forked from the planning process (`api.cli.plan`) and receive the items and the
profile once per search, as one pre-pickled blob each task carries (a memory copy, not a new
pickling per task); each worker rebuilds the cost model (and, for expansions, the bound tables)
once per search and keeps them.
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING

import numpy as np

from hydraplan.planner.candidate import Candidate
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile
from hydraplan.planner.strategies import Strategy

if TYPE_CHECKING:
    from hydraplan.planner.search import Clock, Expansion, Frontier, SearchSettings

# solves waiting or running in the workers at most, per worker: enough to keep one busy while
# the search looks at its queue, few enough that a queue reordered by a new incumbent wastes little
IN_FLIGHT_PER_WORKER = 2
# a started task is awaited for at most this many times what the last of its kind took here: one
# begun more than that earlier on an equally fast core is done by then, and a slow or busy worker
# costs the search at most this share more than working alone
WAIT_FACTOR = 0.5
# solves and expansions are sent ahead only once one of their kind took at least this long here:
# shipping a task and its result costs ~1 ms of the search's own CPU, more than an expansion at
# 64-256 GPUs takes (1-2 ms; 8B / 64 planned 0.91x as fast with a worker sending them all, on 2
# cores); at 1,024 GPUs each takes ~20 ms. Polishes (10-30 ms) always go.
MIN_TASK_S = 0.005

# the state of the search a worker last served: (key, lengths, cost model, previous strategy),
# and its frontier's tables and strategies enumerated before the first expansion: (key, frontier)
_worker_state: tuple[str, np.ndarray, ProfileCostModel, Strategy | None] | None = None
_worker_frontier: tuple[str, Frontier] | None = None

Solve = Callable[[Strategy, np.ndarray, ProfileCostModel, Strategy | None], Candidate | None]


def _state(key: str, blob: bytes) -> tuple[str, np.ndarray, ProfileCostModel, Strategy | None]:
    """The search `key`'s items, cost model and previous strategy in this worker; `blob` (their
    pickled profile, items and previous strategy) is unpickled once per search and worker."""
    global _worker_state
    if _worker_state is None or _worker_state[0] != key:
        profile, lengths, previous = pickle.loads(blob)
        _worker_state = (key, lengths, ProfileCostModel(profile), previous)
    return _worker_state


def solve_task(key: str, blob: bytes, strategy: Strategy) -> Candidate | None:
    """One strategy's solve in a worker."""
    from hydraplan.planner.search import solve_strategy  # the search imports this module

    _, lengths, cost, previous = _state(key, blob)
    return solve_strategy(strategy, lengths, cost, previous)


def polish_task(
    key: str, blob: bytes, candidate: Candidate, settings: SearchSettings, deadline: float
) -> tuple[Candidate, bool]:
    """One candidate's polish in a worker (`search.polish_candidate`), under the search's
    deadline (`time.perf_counter` is the system's monotonic clock, shared by its processes);
    with whether that deadline cut it."""
    from hydraplan.planner.search import Clock, polish_candidate

    _, lengths, cost, _ = _state(key, blob)
    clock = Clock(remaining_s=lambda: deadline - time.perf_counter(), cancelled=lambda: False)
    return polish_candidate(candidate, lengths, cost, settings, clock), clock.cut


def expand_task(
    key: str, blob: bytes, frontier_blob: bytes, columns: tuple[int, ...], set_bound_s: float, incumbent_s: float
) -> Expansion:
    """One scheme set's expansion in a worker (`search.Frontier.expansion`), on a frontier built
    once per search and worker from `frontier_blob` (its schemes, GPUs and the strategies
    enumerated before the first expansion): the same tables, so the same numbers."""
    global _worker_frontier
    from hydraplan.planner.bounds import BoundTables
    from hydraplan.planner.search import Frontier

    _, lengths, cost, _ = _state(key, blob)
    if _worker_frontier is None or _worker_frontier[0] != key:
        schemes, num_gpus, seen = pickle.loads(frontier_blob)
        tables = BoundTables.build(lengths, [cost.coefficients(scheme) for scheme in schemes])
        frontier = Frontier(tables, cost, num_gpus)
        frontier.mark_seen(seen)
        _worker_frontier = (key, frontier)
    return _worker_frontier[1].expansion(columns, set_bound_s, incumbent_s)


class SpeculativeSolver:
    """`solve`, `expansion` and `polish` as the search's own process would compute them, with
    what the search will likely ask for next computed ahead in `executor`'s `workers` processes."""

    def __init__(
        self,
        executor: Executor,
        workers: int,
        profile: CostProfile,
        lengths: np.ndarray,
        cost: ProfileCostModel,
        previous: Strategy | None,
        local: Solve,
        min_task_s: float | None = None,
    ) -> None:
        self._executor = executor
        self._slots = max(1, workers) * IN_FLIGHT_PER_WORKER
        self._key = uuid.uuid4().hex
        self._blob = pickle.dumps((profile, lengths, previous), protocol=pickle.HIGHEST_PROTOCOL)
        self._lengths, self._cost, self._previous, self._local = lengths, cost, previous, local
        self._frontier_blob: bytes | None = None
        self._futures: dict[object, Future] = {}
        self._local_s: dict[str, float] = {}  # what the last task of each kind took here
        self._min_task_s = MIN_TASK_S if min_task_s is None else min_task_s
        self.hits = 0  # tasks a worker had started when the search asked
        self.local = 0  # tasks computed here

    def bind_frontier(self, frontier: Frontier) -> None:
        """Expansions of `frontier`'s scheme sets may be computed ahead from now on: its strategies
        so far are those enumerated before any expansion."""
        schemes = [coef.scheme for coef in frontier.tables.coefs]
        seen = [entry.strategy for entry in frontier.strategies]
        self._frontier_blob = pickle.dumps((schemes, frontier.num_gpus, seen), protocol=pickle.HIGHEST_PROTOCOL)

    def _worth(self, kind: str) -> bool:
        """Whether tasks of this kind take long enough here to be worth sending ahead."""
        return self._local_s.get(kind, 0.0) >= self._min_task_s

    def prefetch(self, strategies: Iterable[Strategy]) -> None:
        """Start solves of these strategies (the most likely next first) while slots are free."""
        if self._worth("solve"):
            self._submit((strategy, (solve_task, self._key, self._blob, strategy)) for strategy in strategies)

    def prefetch_expansions(self, sets: Iterable[tuple[tuple[int, ...], float]], incumbent_s: float) -> None:
        """Start expansions of these scheme sets (columns, bound; the most likely next first)
        under this incumbent, while slots are free."""
        if self._frontier_blob is None or not self._worth("expand"):
            return
        self._submit(
            (
                ("expand", columns, bound_s, incumbent_s),
                (expand_task, self._key, self._blob, self._frontier_blob, columns, bound_s, incumbent_s),
            )
            for columns, bound_s in sets
        )

    def prefetch_polishes(
        self, chosen: Iterable[tuple[int, Candidate]], settings: SearchSettings, clock: Clock
    ) -> None:
        """Start polishes of these (index, candidate) among the strategies the search polishes,
        under its clock's deadline, while slots are free."""
        deadline = time.perf_counter() + clock.remaining_s()
        self._submit(
            (
                ("polish", index, str(candidate.strategy), candidate.objective_s),
                (polish_task, self._key, self._blob, candidate, settings, deadline),
            )
            for index, candidate in chosen
        )

    def _submit(self, tasks: Iterable[tuple[object, tuple]]) -> None:
        self._futures = {key: f for key, f in self._futures.items() if not f.cancelled()}
        in_flight = sum(1 for future in self._futures.values() if not future.done())
        for key, (function, *args) in tasks:
            if in_flight >= self._slots:
                break
            if key in self._futures:
                continue
            self._futures[key] = self._executor.submit(function, *args)
            in_flight += 1

    def _taken(self, key: object, kind: str) -> tuple[bool, object]:
        """(True, the worker's result) where its task is done, or has started and ends within
        WAIT_FACTOR times what one of this kind took here last; else (False, None), and a task
        still waiting is cancelled (the worker takes the next one instead). Either way the result
        is the same; only the time differs."""
        future = self._futures.pop(key, None)
        if future is None or future.cancel():  # none, or not started: cancelled
            return False, None
        try:
            result = future.result(timeout=WAIT_FACTOR * self._local_s.get(kind, 0.0))
        except Exception:  # noqa: BLE001 - late, or a worker lost (BrokenProcessPool & co): done here
            return False, None
        self.hits += 1
        return True, result

    def _timed_locally(self, kind: str, work: Callable[[], object]) -> object:
        started = time.perf_counter()
        result = work()
        self._local_s[kind] = time.perf_counter() - started
        self.local += 1
        return result

    def solve(self, strategy: Strategy) -> Candidate | None:
        """The strategy's solve: a worker's, or computed here."""
        taken, candidate = self._taken(strategy, "solve")
        if taken:
            return candidate
        return self._timed_locally("solve", lambda: self._local(strategy, self._lengths, self._cost, self._previous))

    def polish(self, index: int, candidate: Candidate, settings: SearchSettings, clock: Clock) -> Candidate:
        """The candidate's polish (`search.polish_candidate`): a worker's, or computed here. A
        worker's that its deadline cut marks the search as cut, as one cut here would."""
        from hydraplan.planner.search import polish_candidate

        taken, result = self._taken(("polish", index, str(candidate.strategy), candidate.objective_s), "polish")
        if taken:
            polished, cut = result
            if cut:
                clock.note_cut()
            return polished
        return self._timed_locally(
            "polish", lambda: polish_candidate(candidate, self._lengths, self._cost, settings, clock)
        )

    def expansion(self, frontier: Frontier, columns: tuple[int, ...], set_bound_s: float) -> Expansion:
        """The set's expansion under the frontier's incumbent: a worker's, or computed here."""
        incumbent_s = frontier.incumbent_s
        taken, expansion = self._taken(("expand", columns, set_bound_s, incumbent_s), "expand")
        if taken:
            return expansion
        return self._timed_locally("expand", lambda: frontier.expansion(columns, set_bound_s, incumbent_s))

    def close(self) -> None:
        """Cancel what has not started; what runs finishes in its worker and is dropped."""
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
