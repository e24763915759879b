"""The runtime profiler (torch, CPU): length mixes, saved-activation bytes, out-of-memory samples."""

from __future__ import annotations

import platform
from dataclasses import replace

import pytest

from tests.runtime_support import require_torch

torch = require_torch()

from hydraplan.runtime import profiler  # noqa: E402
from hydraplan.runtime.cpu_allocator import MMAP_THRESHOLD_BYTES, pinned_threshold  # noqa: E402
from hydraplan.runtime.model import ModelConfig  # noqa: E402
from hydraplan.runtime.profiler import (  # noqa: E402
    PEAK_STEPS,
    CudaPeakMeter,
    MeasureOptions,
    ProcessPeakMeter,
    SavedActivationMeter,
    StageRunner,
    length_mixes,
    measure_stage,
    profile_batches,
)
from hydraplan.runtime.profiler_ranks import _slowest  # noqa: E402

pytestmark = pytest.mark.runtime
SMALL = dict(num_layers=2, hidden_size=32, ffn_hidden_size=48, num_heads=4, num_kv_heads=2, vocab_size=64)


def test_every_mix_holds_exactly_its_token_count() -> None:
    mixes = ["long", "short", "mixed", "halves", "random"]
    batches = length_mixes([100, 37], mixes, seed=3)
    assert [mix for mix, _ in batches] == mixes * 2
    assert [sum(lengths) for _, lengths in batches] == [37] * 5 + [100] * 5  # smaller first
    assert dict(batches[5:])["long"] == [100] and set(dict(batches[5:])["short"][:-1]) == {32}
    assert dict(batches[:5])["halves"] == [18, 19] and dict(batches[5:])["halves"] == [50, 50]
    assert batches == length_mixes([100, 37], mixes, seed=3)  # seeded
    with pytest.raises(ValueError, match="unknown length mixes"):
        MeasureOptions(mixes=("long", "bimodal"))


def test_saved_activation_bytes_count_each_storage_once_and_no_parameter() -> None:
    weight = torch.nn.Parameter(torch.ones(8, 8))
    module = torch.nn.Module()
    module.weight = weight
    x = torch.ones(4, 8, requires_grad=True)
    with SavedActivationMeter(module) as meter:
        y = x @ weight  # saves x (128 bytes) and the weight (a parameter: not counted)
        z = (y * y).sum()  # saves y twice (one storage: 128 bytes)
    z.backward()
    assert meter.bytes == 2 * 4 * 8 * 4


def test_the_profile_grid_ends_with_one_sequence_twice_the_largest_token_count() -> None:
    options = MeasureOptions(token_counts=(100, 37), mixes=("short", "long"))
    batches = profile_batches(options)
    assert batches[:-1] == length_mixes([100, 37], ["short", "long"]) and batches[-1] == ("long", [200])
    assert profile_batches(MeasureOptions())[-1] == ("long", [1536])  # the default grid stops at 768
    assert profile_batches(MeasureOptions(token_counts=(100,), mixes=("short",)))[-1][0] == "short"  # no long mix
    assert len(profile_batches(replace(options, long_factor=0))) == 4
    with pytest.raises(ValueError, match="long_factor -1"):
        MeasureOptions(long_factor=-1)


def test_a_micro_batch_out_of_memory_is_a_sample_and_larger_ones_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ModelConfig.from_catalog("tiny", **SMALL)
    calls = []

    def fake_memory(self, batch, hidden, grad):
        calls.append(batch.input_ids.shape[0])
        if batch.input_ids.shape[0] >= 64:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
        return 1.0, 2.0, 1.5

    monkeypatch.setattr(StageRunner, "memory", fake_memory)
    batches = [("long", [32]), ("long", [64]), ("short", [32, 32, 32])]
    samples = list(measure_stage(cfg, 1, 0, batches, MeasureOptions(repeats=1)))
    assert [s.oom for s in samples] == [False, True, True]
    assert calls == [32, 64]  # the 96-token batch is not run after 64 ran out of memory
    assert samples[0].time_s > 0 and samples[1].time_s is None


def test_a_runners_first_micro_batch_is_preceded_by_one_unmeasured_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step of a runner makes one-time allocations that stay (measured: the first shape's
    real peak 1.6-4x its neighbours'); one unmeasured step takes them out of its micro-batch."""
    cfg = ModelConfig.from_catalog("tiny", **SMALL)
    tokens, original = [], StageRunner.step

    def counting(self, batch, hidden, grad, forward_times):
        tokens.append(batch.input_ids.shape[0])
        return original(self, batch, hidden, grad, forward_times)

    monkeypatch.setattr(StageRunner, "step", counting)
    list(measure_stage(cfg, 1, 0, [("long", [16]), ("long", [24])], MeasureOptions(repeats=1, warmup=0)))
    assert tokens.count(16) == tokens.count(24) + 1 and tokens[0] == 16


class FakeMeter:
    """A peak meter that reports the next of the given step peaks."""

    def __init__(self, peaks: list[float], entered: list[int]) -> None:
        self.peaks, self.entered, self.bytes = peaks, entered, 0.0

    def __enter__(self) -> FakeMeter:
        self.entered.append(1)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.bytes = self.peaks.pop(0)


def test_every_micro_batch_measures_k_steps_and_keeps_their_largest_and_median(monkeypatch) -> None:
    """PEAK_STEPS metered steps per micro-batch: the largest step peak is what must fit, the median
    the trend the fit follows (benchmarks/results/memory_peak.md, set 5)."""
    assert PEAK_STEPS == 4
    cfg = ModelConfig.from_catalog("tiny", **SMALL)
    peaks = [10.0, 30.0, 12.0, 11.0, 20.0, 20.0, 21.0, 26.0]
    entered: list[int] = []
    monkeypatch.setattr(profiler, "peak_meter", lambda device: FakeMeter(peaks, entered))
    first, second = measure_stage(cfg, 1, 0, [("long", [16]), ("long", [24])], MeasureOptions(repeats=1))
    assert len(entered) == 2 * PEAK_STEPS and not peaks  # k metered steps each, no more
    assert (first.peak_bytes, first.peak_median_bytes) == (30.0, 11.5)
    assert (second.peak_bytes, second.peak_median_bytes) == (26.0, 20.5)
    assert first.activation_bytes > 0  # the first metered step also counts the saved tensors


def test_a_real_stage_sample_has_time_forward_and_memory() -> None:
    cfg = ModelConfig.from_catalog("tiny", **SMALL)
    options = MeasureOptions(repeats=2)
    first, last = (list(measure_stage(cfg, 2, stage, [("mixed", [24, 8])], options))[0] for stage in (0, 1))
    for sample in (first, last):
        assert 0 < sample.fwd_s < sample.time_s and sample.activation_bytes > 0 and sample.repeats == 2
    assert (first.stage, last.stage, first.pp) == (0, 1, 2)
    # measured on the heap the CPU ranks train with (`runtime.cpu_allocator`)
    assert pinned_threshold() == MMAP_THRESHOLD_BYTES or platform.libc_ver()[0] != "glibc"
    if ProcessPeakMeter.available():
        # the real peak holds at least the saved tensors where they are megabytes: 78 KB of them
        # for 32 tokens can land in heap pages already resident (0.47x of them measured once in
        # CI, 1.5-570x here), 24 MB for 1,536 tokens measured 3.2-3.6x
        (large,) = measure_stage(cfg, 2, 0, [("mixed", [1024, 512])], MeasureOptions(repeats=1))
        assert large.peak_bytes >= large.activation_bytes > 10_000_000


def test_the_process_peak_is_the_high_water_mark_above_the_resident_size_before(tmp_path) -> None:
    status, clear_refs, trims = tmp_path / "status", tmp_path / "clear_refs", []
    status.write_text("Name:\tpython\nVmHWM:\t  9000 kB\nVmRSS:\t  1000 kB\n")
    meter = ProcessPeakMeter(str(status), str(clear_refs), trim=lambda: trims.append(1))
    with meter:
        assert clear_refs.read_text() == "5" and trims == [1]  # heap trimmed, high-water mark reset
        status.write_text("VmHWM:\t  3500 kB\nVmRSS:\t  1200 kB\n")
    assert meter.baseline == 1000 * 1024 and meter.bytes == 2500 * 1024


@pytest.mark.skipif(not ProcessPeakMeter.available(), reason="needs Linux /proc/self/clear_refs")
def test_the_process_peak_sees_a_tensor_allocated_and_freed_inside() -> None:
    with ProcessPeakMeter() as meter:
        block = torch.ones(16 * 2**20, dtype=torch.uint8)  # 16 MiB, touched
        del block
    assert 15 * 2**20 <= meter.bytes < 64 * 2**20


def test_the_cuda_peak_is_the_allocator_peak_above_what_was_allocated() -> None:
    class FakeCuda:
        def __init__(self):
            self.allocated, self.peak, self.calls = 100, 100, []

        def synchronize(self, device):
            self.calls.append("sync")

        def reset_peak_memory_stats(self, device):
            self.calls.append("reset")
            self.peak = self.allocated

        def memory_allocated(self, device):
            return self.allocated

        def max_memory_allocated(self, device):
            return self.peak

    cuda = FakeCuda()
    cuda.peak = 10_000  # an earlier peak must not count
    with CudaPeakMeter(torch.device("cuda"), cuda) as meter:
        cuda.peak, cuda.allocated = 700, 300
    assert meter.bytes == 600 and cuda.calls == ["sync", "reset", "sync"]


def test_the_slowest_rank_is_kept() -> None:
    base = dict(tp=2, pp=1, cp=1, lengths=[10], mix="long", repeats=1)
    rows = [
        {**base, "time_s": 1.0, "fwd_s": 0.3, "activation_bytes": 5.0},
        {**base, "time_s": 2.0, "fwd_s": 0.5, "activation_bytes": 4.0},
    ]
    rows[0]["peak_bytes"], rows[1]["peak_bytes"] = 7.0, 9.0
    rows[0]["peak_median_bytes"], rows[1]["peak_median_bytes"] = 6.5, 6.0
    sample = _slowest(rows)
    assert (sample.time_s, sample.fwd_s, sample.activation_bytes, sample.peak_bytes) == (2.0, 0.5, 5.0, 9.0)
    assert sample.peak_median_bytes == 6.5  # the largest rank's median
    assert _slowest([rows[0], {**base, "oom": True}]).oom
