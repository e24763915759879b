"""Measure one pipeline stage's forward+backward time and memory on packed micro-batches.

What `hydraplan profile --device cpu|cuda` measures (the fitting is `cost_models.fit`, numpy only):

- **Micro-batches**: a grid of token counts times length mixes (`length_mixes`): one long
  sequence, many short ones, a mixture, and seeded random lengths; each packed into one stream.
  Then one longer sequence, `long_factor` (2) times the largest token count (`profile_batches`):
  one long sequence's time and memory grow faster than the grid's shapes show, so a fit that
  stops at the grid under-predicts it beyond (benchmarks/results/memory_peak.md, set 5).
- **Time**: warm-up runs, then the median of `repeats` timed runs of forward+backward; on CPU
  with `torch.utils.benchmark.Timer` at a fixed intra-op thread count, on CUDA between CUDA
  events. The forward time is taken inside the same runs.
- **Memory**: two figures per micro-batch. `activation_bytes`: on CPU the bytes of the tensors
  autograd saves for the backward pass (`torch.autograd.graph.saved_tensors_hooks`; repeated views
  of one storage counted once and parameters not at all), what the analytic model's activation
  count is calibrated on; on CUDA the allocator's peak growth. `peak_bytes`: the real peak the step
  adds above the memory held just before it, with the gradients already allocated (as in a
  training step that accumulates them), the figure the capacity is fitted to (`peak_meter`): on
  CUDA `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus what was allocated
  before; on CPU the process's resident high-water mark (Linux `VmHWM`, reset through
  `/proc/self/clear_refs`) minus its resident size before, after handing freed heap memory back
  (`malloc_trim`), so saved tensors, temporaries, the allocator's slack and library workspaces
  all count. A CPU runner pins the C library's mmap threshold first, as the worker runtime does
  (`runtime.cpu_allocator`): without it the peak depends on what earlier steps left on the heap.
  `PEAK_STEPS` steps are measured: their largest is `peak_bytes` (what must fit) and their median
  `peak_median_bytes` (the trend the fit follows; the excess of the largest over it is the
  step-to-step noise the fit's margin is taken from, `cost_models.fit.fit_memory`).
- **Out of memory**: a micro-batch that runs out of memory is recorded (`oom: true`) and tells
  the fit the capacity it reveals; it is not an error.
- **Schemes**: `<1,pp,1>` stages run here in one process; schemes with TP or CP run on
  `tp*cp` local ranks (`runtime.launch.run_ranks`, gloo on CPU) with the model's parallel
  layers, every rank timing its own share and the slowest rank's time kept.

Samples are yielded one by one, so the caller can stop (budget, Ctrl-C) and keep what it has.
"""

from __future__ import annotations

import contextlib
import functools
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from hydraplan.planner.measurements import StageSample
from hydraplan.runtime.cpu_allocator import malloc_trim, pin_mmap_threshold
from hydraplan.runtime.model import ModelConfig, PackedBatch, build_stage

__all__ = [
    "DEFAULT_TOKEN_COUNTS",
    "FIT_MIXES",
    "PEAK_STEPS",
    "CudaPeakMeter",
    "MeasureOptions",
    "ProcessPeakMeter",
    "SavedActivationMeter",
    "peak_meter",
    "device_description",
    "length_mixes",
    "profile_batches",
    "measure_stage",
    "static_bytes_of",
]

# `halves` (two sequences of T/2) is the one shape of the grid where sum(l^2) and max(l)^2 differ
# (by 2x), so that the real-peak fit can tell them apart (benchmarks/results/memory_peak.md, set 3)
FIT_MIXES = ("long", "short", "mixed", "halves")
ALL_MIXES = (*FIT_MIXES, "random")
DEFAULT_TOKEN_COUNTS = (128, 256, 512, 768)
SHORT_LENGTH = 32
# Adam keeps two moments per parameter next to the weight and its gradient.
STATE_COPIES_PER_PARAM = 4
# Forward+backward steps whose real peak is measured per micro-batch (their largest and median are
# kept): on CPU one step's process peak varied by 5-25% with what the heap happened to hold
# (benchmarks/results/memory_peak.md, set 5; 2 steps until set 4); 0-2.4% on a shape's first
# steps since the heap is pinned (`runtime.cpu_allocator`, benchmarks/results/cpu_allocator.md).
PEAK_STEPS = 4


@dataclass(frozen=True)
class MeasureOptions:
    """How a stage is measured."""

    device: str = "cpu"
    num_threads: int = 1
    repeats: int = 3
    warmup: int = 1
    dtype: torch.dtype = torch.float32
    seed: int = 0
    token_counts: tuple[int, ...] = DEFAULT_TOKEN_COUNTS
    mixes: tuple[str, ...] = FIT_MIXES
    attention: str = "auto"
    # one more micro-batch: a single sequence of long_factor x the largest token count (0: none)
    long_factor: int = 2
    # "thread": CPU time of the measuring thread (all of a 1-thread stage's work runs on it, and
    # it does not count time the thread waits for a core another process holds); "wall": elapsed.
    cpu_clock: str = "thread"

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device {self.device!r}: cpu or cuda")
        if self.repeats < 1 or self.warmup < 0 or self.num_threads < 1:
            raise ValueError("repeats and num_threads must be >= 1, warmup >= 0")
        if self.long_factor < 0:
            raise ValueError(f"long_factor {self.long_factor}: must be >= 0")
        unknown = sorted(set(self.mixes) - set(ALL_MIXES))
        if unknown:
            raise ValueError(f"unknown length mixes {unknown}; valid: {', '.join(ALL_MIXES)}")


def length_mixes(token_counts: Sequence[int], mixes: Sequence[str], seed: int = 0) -> list[tuple[str, list[int]]]:
    """The micro-batches to measure: for every token count T, one batch per mix.

    - `long`: one sequence of T tokens;
    - `short`: sequences of 32 tokens (T/32 of them, at least one);
    - `mixed`: one sequence of T/2, two of T/8 and the rest in 32-token sequences;
    - `halves`: two sequences of T/2 (the second takes an odd token);
    - `random`: lengths drawn log-uniformly in [16, T] until T is reached (seeded).

    Ordered by token count first, so a batch cut short by a budget still holds every mix of the
    smaller sizes.
    """
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for tokens in sorted(token_counts):
        for mix in mixes:
            batches.append((mix, _lengths_of(mix, tokens, generator)))
    return batches


def profile_batches(options: MeasureOptions) -> list[tuple[str, list[int]]]:
    """What `hydraplan profile` measures: the grid (`length_mixes`), then one sequence of
    `long_factor` times the largest token count where the mixes include `long` (last, so a budget
    cuts it first)."""
    batches = length_mixes(options.token_counts, options.mixes, options.seed)
    if options.long_factor and "long" in options.mixes and options.token_counts:
        batches.append(("long", [options.long_factor * max(options.token_counts)]))
    return batches


def _lengths_of(mix: str, tokens: int, generator: torch.Generator) -> list[int]:
    if mix == "long":
        return [tokens]
    if mix == "short":
        return _fill([], tokens)
    if mix == "mixed":
        return _fill([max(tokens // 2, 1), max(tokens // 8, 1), max(tokens // 8, 1)], tokens)
    if mix == "halves":
        return [tokens // 2, tokens - tokens // 2] if tokens > 1 else [tokens]
    lengths: list[int] = []
    while sum(lengths) < tokens:
        draw = float(torch.rand((), generator=generator))
        length = int(round(math.exp(math.log(16) + draw * (math.log(max(tokens, 17)) - math.log(16)))))
        lengths.append(min(length, tokens - sum(lengths)))
    return lengths


def _fill(lengths: list[int], tokens: int) -> list[int]:
    """`lengths` topped up with 32-token sequences (and one remainder) to exactly `tokens`."""
    lengths = [length for length in lengths if length > 0]
    while sum(lengths) > tokens:
        lengths.pop()
    rest = tokens - sum(lengths)
    lengths += [SHORT_LENGTH] * (rest // SHORT_LENGTH)
    if rest % SHORT_LENGTH:
        lengths.append(rest % SHORT_LENGTH)
    return lengths


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------


class SavedActivationMeter:
    """Counts the bytes of the distinct storages autograd saves for backward (parameters excluded).

    Use as a context manager around the forward pass; `bytes` is then the activation memory the
    micro-batch holds until its backward pass.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self._parameters = {parameter.untyped_storage().data_ptr() for parameter in module.parameters()}
        self._seen: set[int] = set()
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self._parameters and pointer not in self._seen:
            self._seen.add(pointer)
            self.bytes += storage.nbytes()
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def __enter__(self) -> SavedActivationMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hooks.__exit__(*exc_info)


class ProcessPeakMeter:
    """The process's peak resident memory over a block of work, above its resident size before it.

    Linux only (`available()`). On entry: freed heap memory is handed back to the kernel (glibc
    `malloc_trim(0)`, so heap pages the block reuses count as growth rather than hiding in the
    baseline), the kernel's high-water mark is reset to the current resident size (writing `5` to
    `/proc/self/clear_refs`) and that size is the baseline. On exit, `bytes` is `VmHWM` minus the
    baseline. Resolution: one page (the kernel reports kB); it counts everything the process
    touches (tensors, temporaries, allocator slack, oneDNN workspaces), which is what must fit.
    Chosen over sampling RSS from a thread (misses short peaks) and over the torch profiler's
    memory events (tensor bytes only, no allocator or workspace, and a slow trace).
    """

    STATUS = "/proc/self/status"
    CLEAR_REFS = "/proc/self/clear_refs"

    def __init__(self, status: str = STATUS, clear_refs: str = CLEAR_REFS, trim: Callable[[], object] | None = None):
        self.status, self.clear_refs = status, clear_refs
        self.trim = trim if trim is not None else malloc_trim
        self.baseline = 0
        self.bytes = 0.0

    @classmethod
    @functools.cache
    def available(cls) -> bool:
        """The kernel exposes `VmHWM` and lets this process reset it (asked once per process: the
        worker asks at every step)."""
        import os

        return os.access(cls.CLEAR_REFS, os.W_OK) and cls()._read("VmHWM") is not None

    def _read(self, field: str) -> int | None:
        try:
            with open(self.status, encoding="ascii") as status:
                for line in status:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def __enter__(self) -> ProcessPeakMeter:
        self.trim()
        with open(self.clear_refs, "w", encoding="ascii") as clear:
            clear.write("5")
        self.baseline = self._read("VmRSS") or 0
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.bytes = float(max((self._read("VmHWM") or 0) - self.baseline, 0))


class CudaPeakMeter:
    """The CUDA allocator's peak over a block of work above what was allocated before it."""

    def __init__(self, device: torch.device, cuda=None) -> None:
        """`cuda`: the `torch.cuda` module (a stand-in in tests)."""
        self.device, self.cuda = device, cuda if cuda is not None else torch.cuda
        self.before = 0
        self.bytes = 0.0

    def __enter__(self) -> CudaPeakMeter:
        self.cuda.synchronize(self.device)
        self.cuda.reset_peak_memory_stats(self.device)
        self.before = self.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cuda.synchronize(self.device)
        self.bytes = float(max(self.cuda.max_memory_allocated(self.device) - self.before, 0))


def peak_meter(device: torch.device) -> CudaPeakMeter | ProcessPeakMeter | None:
    """The real-peak meter of `device`, or None where there is none (CPU off Linux)."""
    if device.type == "cuda":
        return CudaPeakMeter(device)
    return ProcessPeakMeter() if ProcessPeakMeter.available() else None


def static_bytes_of(module: torch.nn.Module) -> float:
    """Weights, gradients and Adam's two moments of the module's parameters, bytes."""
    return float(sum(p.numel() * p.element_size() for p in module.parameters()) * STATE_COPIES_PER_PARAM)


def is_out_of_memory(error: BaseException) -> bool:
    """A CUDA out-of-memory, or the CPU allocator failing to allocate."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


# ---------------------------------------------------------------------------------------------
# One stage in this process
# ---------------------------------------------------------------------------------------------


class StageRunner:
    """Forward+backward of one stage on one micro-batch, its timing and its memory."""

    def __init__(
        self,
        cfg: ModelConfig,
        pp: int,
        stage: int,
        options: MeasureOptions,
        module: torch.nn.Module | None = None,
        shard: Callable[[PackedBatch], PackedBatch] | None = None,
    ) -> None:
        """`module`: an already built (e.g. TP-sharded) stage; `shard`: this rank's part of a batch."""
        self.cfg, self.pp, self.stage, self.options = cfg, pp, stage, options
        self.shard = shard
        self.device = torch.device(options.device)
        if self.device.type == "cpu":
            pin_mmap_threshold()  # the heap the worker runtime trains with (`runtime.cpu_allocator`)
        self.module = module or build_stage(
            cfg,
            pp=pp,
            stage=stage,
            seed=options.seed,
            device=self.device,
            dtype=options.dtype,
            attention=options.attention,
        )
        self.is_first, self.is_last = stage == 0, stage == pp - 1
        self.warmed = False  # one unmeasured step has run (`memory`)

    def inputs(self, batch: PackedBatch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The hidden input of a later stage and the output gradient of an earlier one (random)."""
        generator = torch.Generator().manual_seed(self.options.seed + 1)
        shape = (batch.input_ids.shape[0], self.cfg.hidden_size)
        hidden = grad = None
        if not self.is_first:
            hidden = torch.randn(shape, generator=generator, dtype=self.options.dtype).to(self.device)
            hidden.requires_grad_(True)
        if not self.is_last:
            grad = torch.randn(shape, generator=generator, dtype=self.options.dtype).to(self.device) * 1e-3
        return hidden, grad

    def step(self, batch: PackedBatch, hidden, grad, forward_times: list[float]) -> None:
        """One forward+backward; appends the forward's seconds to `forward_times`."""
        clock = (
            time.thread_time if self.device.type == "cpu" and self.options.cpu_clock == "thread" else time.perf_counter
        )
        started = clock()
        output = self.module(batch, hidden)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        forward_times.append(clock() - started)
        if self.is_last:
            output.backward()
        else:
            output.backward(grad)
        self.module.zero_grad(set_to_none=True)
        if hidden is not None:
            hidden.grad = None

    def memory(self, batch: PackedBatch, hidden, grad) -> tuple[float, float | None, float | None]:
        """`(activation_bytes, peak_bytes, peak_median_bytes)` over `PEAK_STEPS` steps, gradients
        allocated before each as in a step that accumulates them. `activation_bytes`: the first
        step's saved-activation bytes (CPU) or allocator peak growth (CUDA); `peak_bytes` and
        `peak_median_bytes`: the largest and the median real peak a step added (`peak_meter`), None
        where the device has none.

        The runner's first micro-batch is preceded by one unmeasured step: the first step of a
        process makes one-time allocations (kernel caches, thread pools, allocator arenas) that
        stay for every later step, so they belong to what the process holds before a step, not to
        that micro-batch's growth (measured here: the first shape's peak 1.6-4x its neighbours'
        without it, benchmarks/results/memory_peak.md)."""
        peaks, activation = [], 0.0
        if not self.warmed:
            self._allocate_grads()
            self.step(batch, hidden, grad, [])
            self.warmed = True
        for index in range(PEAK_STEPS):
            self._allocate_grads()
            meter = peak_meter(self.device)
            with meter if meter is not None else contextlib.nullcontext():
                if index == 0 and self.device.type == "cpu":
                    activation = self._saved_step(batch, hidden, grad)
                else:
                    self.step(batch, hidden, grad, [])
            if meter is not None:
                peaks.append(meter.bytes)
            if self.device.type == "cuda" and index == 0:
                activation = peaks[0]
        if not peaks:
            return activation, None, None
        return activation, max(peaks), float(statistics.median(peaks))

    def _allocate_grads(self) -> None:
        """Gradients allocated (zeros) where none are, as in a step that accumulates them."""
        for parameter in self.module.parameters():
            if parameter.requires_grad and parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)

    def _saved_step(self, batch: PackedBatch, hidden, grad) -> float:
        """One forward+backward counting the bytes autograd saves."""
        with SavedActivationMeter(self.module) as saved:
            output = self.module(batch, hidden)
        output.backward() if self.is_last else output.backward(grad)
        self.module.zero_grad(set_to_none=True)
        if hidden is not None:
            hidden.grad = None
        return float(saved.bytes)

    def time(self, batch: PackedBatch, hidden, grad) -> tuple[float, float]:
        """Median forward+backward and forward seconds over the repeats, after the warm-up (the
        memory-measuring steps count as the first warm-up step)."""
        forward_times: list[float] = []
        for _ in range(self.options.warmup - 1):
            self.step(batch, hidden, grad, forward_times)
        forward_times.clear()
        if self.device.type == "cuda":
            totals = [self._cuda_time(batch, hidden, grad, forward_times) for _ in range(self.options.repeats)]
        else:
            totals = [self._cpu_time(batch, hidden, grad, forward_times) for _ in range(self.options.repeats)]
        return statistics.median(totals), statistics.median(forward_times)

    def _cpu_time(self, batch, hidden, grad, forward_times: list[float]) -> float:
        from torch.utils import benchmark

        timer = benchmark.Timer(
            stmt="step(batch, hidden, grad, forward_times)",
            globals={"step": self.step, "batch": batch, "hidden": hidden, "grad": grad, "forward_times": forward_times},
            num_threads=self.options.num_threads,
            timer=time.thread_time if self.options.cpu_clock == "thread" else time.perf_counter,
        )
        return float(timer.timeit(1).median)

    def _cuda_time(self, batch, hidden, grad, forward_times: list[float]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.step(batch, hidden, grad, forward_times)
        end.record()
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) / 1e3

    def measure(self, mix: str, lengths: Sequence[int], scheme: tuple[int, int, int]) -> StageSample:
        """One `StageSample`; an out-of-memory gives `oom: true` instead of an error."""
        tp, pp, cp = scheme
        base = dict(tp=tp, pp=pp, cp=cp, stage=self.stage, lengths=list(lengths), mix=mix)
        try:
            batch = PackedBatch.from_lengths(list(lengths), self.cfg.vocab_size, self.options.seed, self.device)
            if self.shard is not None:
                batch = self.shard(batch)
            hidden, grad = self.inputs(batch)
            memory, peak, peak_median = self.memory(batch, hidden, grad)
            total_s, forward_s = self.time(batch, hidden, grad)
        except (RuntimeError, MemoryError) as error:
            if not (isinstance(error, MemoryError) or is_out_of_memory(error)):
                raise
            self.module.zero_grad(set_to_none=True)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return StageSample(**base, oom=True, static_bytes=static_bytes_of(self.module))
        return StageSample(
            **base,
            time_s=total_s,
            fwd_s=min(forward_s, total_s),
            activation_bytes=memory,
            peak_bytes=peak,
            peak_median_bytes=peak_median,
            static_bytes=static_bytes_of(self.module),
            repeats=self.options.repeats,
        )


def measure_stage(
    cfg: ModelConfig,
    pp: int,
    stage: int,
    batches: Sequence[tuple[str, Sequence[int]]],
    options: MeasureOptions,
    should_stop: Callable[[], bool] = lambda: False,
) -> Iterator[StageSample]:
    """Samples of stage `stage` of `<1,pp,1>`, one per micro-batch, until `should_stop()`.

    A micro-batch larger than one that ran out of memory is skipped (recorded as out of memory
    without running it).
    """
    torch.set_num_threads(options.num_threads)
    runner = StageRunner(cfg, pp, stage, options)
    smallest_oom = math.inf
    for mix, lengths in batches:
        if should_stop():
            return
        scheme = (1, pp, 1)
        if sum(lengths) >= smallest_oom:
            yield StageSample(tp=1, pp=pp, cp=1, stage=stage, lengths=list(lengths), mix=mix, oom=True)
            continue
        sample = runner.measure(mix, lengths, scheme)
        if sample.oom:
            smallest_oom = min(smallest_oom, sample.num_tokens)
        yield sample


# ---------------------------------------------------------------------------------------------
# Where the numbers come from
# ---------------------------------------------------------------------------------------------


def device_description(device: str) -> str:
    """The CPU model and core count, or the CUDA device name and memory."""
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        return f"{properties.name}, {properties.total_memory / 2**30:.0f} GiB"
    model_name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    model_name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import os

    return f"{model_name}, {os.cpu_count()} cores"


def torch_version() -> str:
    return torch.__version__


def cuda_device_count() -> int:
    """CUDA devices torch can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_memory_bytes(device: str) -> float:
    """Total memory of the device: the GPU's, or the machine's RAM (`/proc/meminfo`)."""
    if device == "cuda":
        return float(torch.cuda.get_device_properties(0).total_memory)
    try:
        with open("/proc/meminfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 16 * 2.0**30
