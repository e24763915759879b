"""Packed causal attention on CPU: which way is fastest for variable-length micro-batches (issue 11, item 1).

    python benchmarks/packed_attention.py               # 4 length mixes of 4K tokens, 7 repeats
    python benchmarks/packed_attention.py --quick       # a smoke run of a few seconds
    python benchmarks/packed_attention.py --no-compile  # without the torch.compile'd flex attention

Every method computes the same thing, per-sequence causal attention with no attention across
sequences (`runtime/attention.py`): `loop` (one SDPA per sequence), `block_mask` (one SDPA with a
[T, T] block-diagonal causal mask), `flex` (eager flex_attention with a document mask) and, unless
`--no-compile`, `flex_compiled` (`torch.compile(flex_attention)`, compile time excluded by a warm-up
call per shape). Shapes are the `tiny` model's attention (4 query heads, 2 KV heads, head dim 64),
float32, forward plus backward.

Timing: one intra-op thread (`torch.set_num_threads(1)`) and the thread's CPU time
(`time.thread_time`), so the other jobs sharing this machine's cores do not enter the numbers;
methods interleaved repeat by repeat; medians over `--repeats`. Each method is first checked
against `loop` in float64 (max abs difference, column `max err`). The full table goes to
benchmarks/results/packed_attention.md, the forward + backward times (a column per method) to the
`packed_attention` section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.report import RESULTS_PATH, command_line, markdown_table, pivot_table, write_result  # noqa: E402
from hydraplan.runtime.attention import packed_causal_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
MIXES = {
    "one long (1 x 4096)": [4096],
    "long + short (2048 + 16 x 128)": [2048] + [128] * 16,
    "mixture (1024, 2 x 512, 8 x 128, 16 x 64)": [1024, 512, 512] + [128] * 8 + [64] * 16,
    "many short (64 x 64)": [64] * 64,
}
QUICK_MIXES = {"long + short (256 + 4 x 32)": [256] + [32] * 4, "many short (16 x 16)": [16] * 16}


_COMPILED: dict[str, object] = {}


def compiled_flex(q, k, v, lengths):
    """flex_attention under torch.compile (one compiled function, recompiled per shape)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(flex_attention, dynamic=False)
    counts = torch.tensor(lengths)
    documents = torch.repeat_interleave(torch.arange(len(lengths)), counts)

    def same_document_causal(batch, head, query_index, key_index):
        return (documents[query_index] == documents[key_index]) & (key_index <= query_index)

    total = q.shape[0]
    mask = create_block_mask(same_document_causal, None, None, total, total, device="cpu")
    out = _COMPILED["fn"](
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=mask, enable_gqa=True
    )
    return out[0].transpose(0, 1)


def run_method(method: str, q, k, v, lengths):
    if method == "flex_compiled":
        return compiled_flex(q, k, v, tuple(lengths))
    return packed_causal_attention(q, k, v, tuple(lengths), method)


def inputs(total: int, dtype: torch.dtype, grad: bool = True, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(total, HEADS, HEAD_DIM), (total, KV_HEADS, HEAD_DIM), (total, KV_HEADS, HEAD_DIM)]
    return [torch.randn(shape, generator=generator, dtype=dtype).requires_grad_(grad) for shape in shapes]


def forward_s(method: str, lengths: list[int]) -> float:
    q, k, v = inputs(sum(lengths), torch.float32, grad=False)
    with torch.no_grad():
        start = time.thread_time()
        run_method(method, q, k, v, lengths)
        return time.thread_time() - start


def forward_backward_s(method: str, lengths: list[int]) -> float:
    q, k, v = inputs(sum(lengths), torch.float32)
    start = time.thread_time()
    out = run_method(method, q, k, v, lengths)
    out.sum().backward()
    return time.thread_time() - start


def max_error(method: str, lengths: list[int]) -> float:
    """Largest difference from `loop` in float64 (forward), on the mix itself."""
    q, k, v = inputs(sum(lengths), torch.float64, grad=False)
    with torch.no_grad():
        expected = packed_causal_attention(q, k, v, tuple(lengths), "loop")
        if method == "flex_compiled":  # the compiled kernel is float32 only on CPU in this check
            got = run_method(method, q.float(), k.float(), v.float(), lengths).double()
        else:
            got = run_method(method, q, k, v, lengths)
    return float((got - expected).abs().max())


def _try(function, *args) -> tuple[object, str]:
    """`(result, "")`, or `(None, reason)` when the method does not run here (reported, not fatal)."""
    try:
        return function(*args), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:70]}"


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure(methods: list[str], mixes: dict[str, list[int]], repeats: int) -> tuple[list[list[str]], list[str]]:
    """Table rows (one per mix and method) and the distinct reasons a method failed."""
    rows, failures = [], []
    for mix, lengths in mixes.items():
        errors, kinds = {}, {}
        for method in methods:
            errors[method], reason = _try(max_error, method, lengths)
            kinds[method] = [
                kind
                for kind, timer in (("fwd", forward_s), ("fwd+bwd", forward_backward_s))
                if _try(timer, method, lengths)[1] == ""
            ]  # warm-up (and compilation)
            if reason and reason not in failures:
                failures.append(f"{method}: {reason}")
            _, reason = _try(forward_backward_s, method, lengths)
            if reason and f"{method}: {reason}" not in failures:
                failures.append(f"{method}: {reason}")
        samples = {(method, kind): [] for method in methods for kind in kinds[method]}
        for _ in range(repeats):
            for method, kind in samples:
                samples[(method, kind)].append((forward_s if kind == "fwd" else forward_backward_s)(method, lengths))
        medians = {key: _median(values) for key, values in samples.items()}
        trained = {method: medians[(method, "fwd+bwd")] for method in methods if (method, "fwd+bwd") in medians}
        fastest = min(trained, key=trained.get)
        for method in methods:
            forward = medians.get((method, "fwd"))
            both = medians.get((method, "fwd+bwd"))
            cells = [f"{forward * 1e3:.1f}" if forward is not None else "fails"]
            cells.append(f"{both * 1e3:.1f}" if both is not None else "fails")
            cells.append(f"{both / trained['loop']:.2f}" if both is not None else "n/a")
            cells.append(f"{errors[method]:.1e}" if errors[method] is not None else "n/a")
            rows.append([mix, sum(lengths), method, *cells, "fastest" if method == fastest else ""])
        print(f"  {mix}: " + ", ".join(f"{m} {k} {v * 1e3:.1f} ms" for (m, k), v in medians.items()), file=sys.stderr)
    return rows, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="small mixes, at most 3 repeats (a smoke run)")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile'd flex attention")
    parser.add_argument(
        "--results", type=Path, default=RESULTS_PATH, help="summary file; the full output goes to results/ beside it"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; write no results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    methods = ["loop", "block_mask", "flex"] + ([] if args.no_compile else ["flex_compiled"])
    mixes = QUICK_MIXES if args.quick else MIXES
    repeats = min(3, args.repeats) if args.quick else args.repeats
    rows, failures = measure(methods, mixes, repeats)
    headers = ["length mix", "tokens", "method", "fwd ms", "fwd+bwd ms", "fwd+bwd vs loop", "max err", ""]
    table = markdown_table(headers, rows)
    print(table)
    body = (
        f"torch {torch.__version__}, 1 intra-op thread, thread CPU time, median of {repeats} interleaved repeats; "
        f"attention of {HEADS} query / {KV_HEADS} KV heads of dim {HEAD_DIM} in float32, forward + backward; "
        "`max err`: largest difference from `loop` in float64 (float32 for `flex_compiled`).\n\n"
        f"{table}\n\n" + "".join(f"- fails: {reason}\n" for reason in failures) + "\n"
        "Choice (`runtime/attention.py`, `auto`): **CPU: `loop`**, per the table. **CUDA: `varlen`** "
        "(`torch.nn.attention.varlen.varlen_attn`, FlashAttention's varlen kernel: `sum l_i^2` work in one "
        "launch); not measured, no GPU was lent to this task.\n"
    )
    if not args.no_write:
        summary = pivot_table(headers, rows, ["length mix", "tokens"], across="method", value="fwd+bwd ms")
        write_result("packed_attention", command_line(), body, summary, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
