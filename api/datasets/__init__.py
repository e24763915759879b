"""Sequence-length sources for the CLI and the service: length files and seeded sample batches.

`sample_batch(dataset, num_tokens, seed)` draws documents from one of `DATASETS` until their
tokens reach `num_tokens`, then splits documents longer than the context cap into cap-sized
chunks plus a remainder, as training data pipelines do. Every draw uses one seeded
`numpy.random.Generator`, so the same arguments always give the same batch.

The bundled files are in `data/` (`wikipedia_sample.txt`, its provenance in `NOTICE.md`). The CLI,
the what-if engine and the service draw batches here; this package imports nothing else of `api`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

WIKIPEDIA_SAMPLE = "wikipedia_sample.txt"
WIKIPEDIA_SAMPLE_SIZE = 100_000
WIKIPEDIA_SAMPLE_SEED = 0

_INTEGER = re.compile(r"[+-]?\d+")


class LengthsError(ValueError):
    """A lengths file is unreadable as a list of positive integers; the message says where."""


# ---------------------------------------------------------------------------------------------
# Length files
# ---------------------------------------------------------------------------------------------


def load_lengths_file(path_or_dash: str | Path) -> list[int]:
    """Read sequence lengths: one integer per line (blank lines ignored) or a JSON list.

    `-` reads standard input. Raises `LengthsError` naming the line (text) or index (JSON) and
    the bad value, and `OSError` when the file cannot be read.
    """
    from hydraplan.cost_models.profile_io import read_capped, read_input_text  # bounded, as every CLI input

    if str(path_or_dash) == "-":
        name, text = "<stdin>", read_capped(sys.stdin, "standard input", LengthsError)
    else:
        name, text = str(path_or_dash), read_input_text(Path(path_or_dash), LengthsError)
    if text.lstrip().startswith("["):
        lengths = _parse_json_lengths(name, text)
    else:
        lengths = _parse_text_lengths(name, text)
    if not lengths:
        raise LengthsError(f"{name}: no lengths")
    return lengths


def _parse_text_lengths(name: str, text: str) -> list[int]:
    lengths: list[int] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        token = line.strip()
        if not token:
            continue
        where = f"{name} line {line_number}"
        if not _INTEGER.fullmatch(token):
            raise LengthsError(f"{where}: {token!r} is not an integer")
        lengths.append(_positive(where, int(token)))
    return lengths


def _parse_json_lengths(name: str, text: str) -> list[int]:
    try:
        values = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise LengthsError(f"{name}: not a valid JSON list ({exc})") from None
    if not isinstance(values, list):
        raise LengthsError(f"{name}: expected a JSON list of integers")
    lengths: list[int] = []
    for index, value in enumerate(values):
        where = f"{name} index {index}"
        # bool is an int subclass; a JSON true is not a length.
        if isinstance(value, bool) or not isinstance(value, int):
            raise LengthsError(f"{where}: {json.dumps(value)} is not an integer")
        lengths.append(_positive(where, value))
    return lengths


def _positive(where: str, length: int) -> int:
    if length < 1:
        raise LengthsError(f"{where}: length {length} must be >= 1")
    return length


# ---------------------------------------------------------------------------------------------
# Datasets: each draws `count` document lengths from a seeded generator
# ---------------------------------------------------------------------------------------------

LengthSampler = Callable[[np.random.Generator, int], np.ndarray]


def _lognormal(mean_tokens: float, sigma: float) -> LengthSampler:
    """Lognormal lengths with the given mean before clipping: mu = ln(mean) - sigma^2 / 2."""
    mu = math.log(mean_tokens) - sigma * sigma / 2

    def draw(rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.lognormal(mu, sigma, size=count)

    return draw


def _draw_megatron_mock(rng: np.random.Generator, count: int) -> np.ndarray:
    """Megatron-LM's mock variable-length data: lognormal, mean 1024, sigma 1.5, in [128, 8192]."""
    return np.clip(_lognormal(1024, 1.5)(rng, count), 128, 8192)


# Supervised fine-tuning mix: 99.89% of documents around 1K tokens and 0.11% around 37K, the
# long tail the Hydraulis paper (Li, Fu et al. 2024, arXiv 2412.07894) describes for SFT data.
SFT_LONG_SHARE = 0.0011
_sft_short = _lognormal(1024, 0.5)
_sft_long = _lognormal(37 * 1024, 0.1)


def _draw_sft_mix(rng: np.random.Generator, count: int) -> np.ndarray:
    is_long = rng.random(count) < SFT_LONG_SHARE
    return np.where(is_long, _sft_long(rng, count), _sft_short(rng, count))


def _draw_longalign(rng: np.random.Generator, count: int) -> np.ndarray:
    """Long-context alignment data: uniform between 8K and 64K tokens."""
    return rng.integers(8 * 1024, 64 * 1024, size=count, endpoint=True)


def _draw_wikipedia(rng: np.random.Generator, count: int) -> np.ndarray:
    """Documents of the bundled Wikipedia sample, uniformly with replacement."""
    sample = wikipedia_sample()
    return sample[rng.integers(0, sample.size, size=count)]


DATASETS: dict[str, LengthSampler] = {
    "wikipedia": _draw_wikipedia,
    "lognormal": _draw_megatron_mock,
    "sft-mix": _draw_sft_mix,
    "longalign": _draw_longalign,
}

DATASET_DESCRIPTIONS: dict[str, str] = {
    "wikipedia": "real English Wikipedia document lengths (bundled 100K sample, FlexSP authors)",
    "lognormal": "Megatron-LM mock data: lognormal, mean 1024, sigma 1.5, clipped to [128, 8192]",
    "sft-mix": "SFT mix: 99.89% around 1K tokens, 0.11% around 37K",
    "longalign": "long-context alignment: uniform 8K-64K tokens",
}


@cache
def wikipedia_sample() -> np.ndarray:
    """The bundled sample of Wikipedia document lengths (read once, read-only)."""
    text = resources.files("hydraplan.api.datasets").joinpath("data", WIKIPEDIA_SAMPLE).read_text(encoding="utf-8")
    sample = np.array(text.split(), dtype=np.int64)
    sample.setflags(write=False)
    return sample


def sample_batch(dataset: str, num_tokens: int, seed: int, context_cap: int | None = 32768) -> list[int]:
    """A global batch of about `num_tokens` tokens drawn from `dataset` with `seed`.

    Documents are drawn until their sum reaches `num_tokens` (the last one may overshoot), then
    documents longer than `context_cap` become cap-sized chunks plus a remainder. The result's
    sum is exactly the drawn documents' sum.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; valid names: {', '.join(DATASETS)}")
    if num_tokens < 1:
        raise ValueError(f"num_tokens {num_tokens} must be >= 1")
    if context_cap is not None and context_cap < 1:
        raise ValueError(f"context_cap {context_cap} must be >= 1")
    documents = _draw_documents(DATASETS[dataset], num_tokens, np.random.default_rng(seed))
    if context_cap is None:
        return documents
    return split_at_cap(documents, context_cap)


def sample_from_lengths(
    documents: Sequence[int], num_tokens: int, seed: int, context_cap: int | None = None
) -> list[int]:
    """`sample_batch` over a user's document lengths (e.g. a lengths file): documents drawn
    uniformly with replacement until `num_tokens`, then split at `context_cap`."""
    if not documents:
        raise ValueError("no document lengths to sample from")
    if num_tokens < 1:
        raise ValueError(f"num_tokens {num_tokens} must be >= 1")
    pool = np.asarray(documents, dtype=np.int64)

    def draw(rng: np.random.Generator, count: int) -> np.ndarray:
        return pool[rng.integers(0, pool.size, size=count)]

    drawn = _draw_documents(draw, num_tokens, np.random.default_rng(seed))
    return drawn if context_cap is None else split_at_cap(drawn, context_cap)


def _draw_documents(draw: LengthSampler, num_tokens: int, rng: np.random.Generator) -> list[int]:
    """Draw in blocks (one generator call per block) until the running sum reaches num_tokens."""
    drawn: list[np.ndarray] = []
    total = 0
    block = 64
    while total < num_tokens:
        lengths = np.maximum(np.rint(draw(rng, block)), 1).astype(np.int64)
        running = total + np.cumsum(lengths)
        reached = int(np.searchsorted(running, num_tokens))  # first index with sum >= target
        if reached < block:
            drawn.append(lengths[: reached + 1])
            break
        drawn.append(lengths)
        total = int(running[-1])
        block *= 2
    return [int(length) for length in np.concatenate(drawn)]


def split_at_cap(lengths: list[int], context_cap: int) -> list[int]:
    """Split each length above `context_cap` into cap-sized chunks plus the remainder, in order."""
    result: list[int] = []
    for length in lengths:
        while length > context_cap:
            result.append(context_cap)
            length -= context_cap
        result.append(length)
    return result


# ---------------------------------------------------------------------------------------------
# How the bundled sample was drawn (see api/datasets/data/NOTICE.md)
# ---------------------------------------------------------------------------------------------


def draw_wikipedia_sample(
    source: str | Path,
    destination: str | Path,
    size: int = WIKIPEDIA_SAMPLE_SIZE,
    seed: int = WIKIPEDIA_SAMPLE_SEED,
) -> None:
    """Write `size` lines of `source` picked without replacement by `default_rng(seed)`.

    The picked lines keep their order in the source file. Regenerate the bundled sample with
    `python -c "from api.datasets import draw_wikipedia_sample as d;
    d('../shared/data/wikipedia_lengths.txt', 'api/datasets/data/wikipedia_sample.txt')"`.
    """
    lengths = load_lengths_file(source)
    picked = np.sort(np.random.default_rng(seed).choice(len(lengths), size=size, replace=False))
    Path(destination).write_text("".join(f"{lengths[index]}\n" for index in picked), encoding="utf-8")
