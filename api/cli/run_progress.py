"""Per-step progress of `hydraplan run` on standard error, fed by the launcher while the ranks run.

The launcher (`runtime.launch.run_ranks(on_progress=)`) reports the (step, phase) of the rank
furthest behind each time it moves on (the ranks' watchdog beats); a step starts when that rank
beats the step's first phase and ends when it beats the next step (or `done`). Each step is one
line, `hydraplan: run step 2/5 (plan 1x<2,1,1> + 1x<1,2,1>, predicted 0.412 s) ... done in 1.3 s`:
the plan's strategy and `step_time_s` when the plans are known ahead (`--plan`, `--plans`;
planned online, rank 0 plans each step and the launcher does not see it), and the step's wall
time as the launcher saw it (polled every 0.1 s; the first step includes building the model).
After the run, `summary_line` compares the plans' step time with the measured one rebuilt from
the ranks' reports (`runtime.step_timing`). Same rule as every progress line (`api.cli.progress`):
stderr only, by default only on a terminal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hydraplan.api.cli.progress import PROG


def step_head(number: int, num_steps: int, strategy: str | None, predicted_s: float | None) -> str:
    """`hydraplan: run step 2/5 (plan 1x<2,1,1>, predicted 0.412 s) ... ` (the line's start)."""
    if strategy is None:
        about = "planned online by rank 0"
    else:
        about = f"plan {strategy}" + (f", predicted {predicted_s:.3g} s" if predicted_s is not None else "")
    return f"{PROG}: run step {number}/{num_steps} ({about}) ... "


def summary_line(predicted_s: Sequence[float], measured_s: Sequence[float]) -> str:
    """The mean step time the plans predicted against the measured one (`runtime.step_timing`)."""
    predicted = sum(predicted_s) / len(predicted_s)
    measured = sum(measured_s) / len(measured_s)
    ratio = measured / predicted if predicted > 0 else float("inf")
    times = f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"
    return (
        f"{PROG}: run: {len(measured_s)} step(s), mean step time predicted {predicted:.3g} s, measured "
        f"{measured:.3g} s ({times} the prediction; measured: slowest pipeline's critical path + gradient sync)"
    )


class StepProgress:
    """`on_progress(step, phase)` for the launcher: writes one line per step through `write`."""

    def __init__(
        self,
        plans: Sequence | None,
        num_steps: int,
        first_step: int,
        write: Callable[[str], None],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`plans`: each step's plan in order (None: planned online); `first_step`: the first step's
        number (after `--load`, the steps already done)."""
        self.plans, self.num_steps, self.first_step = plans, num_steps, first_step
        self.write, self.clock = write, clock
        self.current: int | None = None  # the step the rank furthest behind is in
        self.started_s = 0.0

    def __call__(self, step: int, phase: str) -> None:
        if phase in ("start", "join", "setup") or step == self.current:
            return
        self._end_step()
        if phase == "done":
            return
        self.current, self.started_s = step, self.clock()
        index = step - self.first_step
        plan = self.plans[index] if self.plans is not None and 0 <= index < len(self.plans) else None
        self.write(
            step_head(
                index + 1,
                self.num_steps,
                None if plan is None else str(plan.strategy),
                None if plan is None else plan.step_time_s,
            )
        )

    def fail(self) -> None:
        """End a step's open line when the run stopped inside it (the error line follows)."""
        self._end_step("failed after")

    def _end_step(self, outcome: str = "done in") -> None:
        if self.current is not None:
            self.write(f"{outcome} {self.clock() - self.started_s:.1f} s\n")
            self.current = None


def stderr_writer() -> Callable[[str], None]:
    """Writes text to standard error at once (`rich`, no markup or wrapping)."""
    from hydraplan.api.cli.progress import stderr_console

    console = stderr_console()

    def write(text: str) -> None:
        console.print(text, end="")
        console.file.flush()

    return write
