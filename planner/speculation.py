"""Strategy solves ahead of the search, in worker processes, without changing its plan.

The search (`planner.search`) solves one queued strategy at a time: the one with the best
estimate, then it updates the incumbent, expands scheme sets and looks at the queue again. Each
solve (greedy dispatch and packing, `search.solve_strategy`) is a pure function of the strategy,
the items, the cost profile and the previous strategy, so it can be computed anywhere, early.

`SpeculativeSolver` keeps the workers of an executor busy with the strategies the search is most
likely to ask for next (the head of its queue, `prefetch`); when the search asks for one
(`solve`), a solve a worker has started is awaited (it began earlier than one started here now
would), and one still waiting in the executor's queue is cancelled and computed here at once.
What the search solves, in which order, and every result are therefore exactly those of the
search alone, for any number of workers and any timing (the merge is deterministic by
construction); a worker only saves the search the time of the solves it guessed right. Results
nobody asks for are dropped.

The workers are forked from the planning process (`api.cli.plan`) and receive the items and the
profile once per search, as one pre-pickled blob each task carries (a memory copy, not a new
pickling per task); each worker rebuilds the cost model once per search and keeps it.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future

import numpy as np

from hydraplan.planner.candidate import Candidate
from hydraplan.planner.cost import ProfileCostModel
from hydraplan.planner.schemas import CostProfile
from hydraplan.planner.strategies import Strategy

# solves waiting or running in the workers at most, per worker: enough to keep one busy while
# the search looks at its queue, few enough that a queue reordered by a new incumbent wastes little
IN_FLIGHT_PER_WORKER = 2

# the state of the search a worker last served: (key, lengths, cost model, previous strategy)
_worker_state: tuple[str, np.ndarray, ProfileCostModel, Strategy | None] | None = None

Solve = Callable[[Strategy, np.ndarray, ProfileCostModel, Strategy | None], Candidate | None]


def solve_task(key: str, blob: bytes, strategy: Strategy) -> Candidate | None:
    """One strategy's solve in a worker; `blob` (the pickled profile, items and previous
    strategy of the search `key`) is unpickled once per search and worker."""
    global _worker_state
    from hydraplan.planner.search import solve_strategy  # the search imports this module

    if _worker_state is None or _worker_state[0] != key:
        profile, lengths, previous = pickle.loads(blob)
        _worker_state = (key, lengths, ProfileCostModel(profile), previous)
    _, lengths, cost, previous = _worker_state
    return solve_strategy(strategy, lengths, cost, previous)


class SpeculativeSolver:
    """`solve(strategy)` as the search's own process would compute it, with the next strategies
    solved ahead in `executor`'s `workers` processes."""

    def __init__(
        self,
        executor: Executor,
        workers: int,
        profile: CostProfile,
        lengths: np.ndarray,
        cost: ProfileCostModel,
        previous: Strategy | None,
        local: Solve,
    ) -> None:
        self._executor = executor
        self._slots = max(1, workers) * IN_FLIGHT_PER_WORKER
        self._key = uuid.uuid4().hex
        self._blob = pickle.dumps((profile, lengths, previous), protocol=pickle.HIGHEST_PROTOCOL)
        self._lengths, self._cost, self._previous, self._local = lengths, cost, previous, local
        self._futures: dict[Strategy, Future] = {}
        self.hits = 0  # solves a worker had delivered when the search asked
        self.local = 0  # solves computed here

    def prefetch(self, strategies: Iterable[Strategy]) -> None:
        """Start solves of these strategies (the most likely next first) while slots are free."""
        self._futures = {s: f for s, f in self._futures.items() if not f.cancelled()}
        in_flight = sum(1 for future in self._futures.values() if not future.done())
        for strategy in strategies:
            if in_flight >= self._slots:
                break
            if strategy in self._futures:
                continue
            self._futures[strategy] = self._executor.submit(solve_task, self._key, self._blob, strategy)
            in_flight += 1

    def solve(self, strategy: Strategy) -> Candidate | None:
        """The worker's result where its solve has started (it finishes no later than one begun
        here now would, on a free core), else the solve computed here."""
        future = self._futures.pop(strategy, None)
        if future is not None and not future.cancel():  # running or done: cancel() refused
            try:
                candidate = future.result()
            except Exception:  # noqa: BLE001 - a worker lost (BrokenProcessPool & co): solved here
                pass
            else:
                self.hits += 1
                return candidate
        self.local += 1
        return self._local(strategy, self._lengths, self._cost, self._previous)

    def close(self) -> None:
        """Cancel what has not started; what runs finishes in its worker and is dropped."""
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
