"""Pre-tokenised documents on disk (`hydraplan.tokens/1`), memory-mapped, and the batches of a run.

A token directory holds three files (all little-endian, written by `write_token_directory`, the
converter `hydraplan data convert`, or any other program):

- `meta.json`: `{"format": "hydraplan.tokens/1", "dtype": "uint16"|"uint32", "vocab_size": V,
  "num_documents": D, "num_tokens": T, "tokenizer": "...", "eos_id": E|null}`;
- `tokens.bin`: the T token ids of every document, one after another, as `dtype`;
- `offsets.bin`: D + 1 int64 offsets into `tokens.bin`: document d is tokens
  `[offsets[d], offsets[d + 1])`; `offsets[0] == 0`, `offsets[D] == T`.

**Documents and sequences.** A document of n tokens is one training sequence of length n - 1:
its first n - 1 tokens are the inputs, the next-token shift the labels (as `step_data` draws a
synthetic sequence of length l as l + 1 tokens). So every document holds at least 2 tokens.

**Batches.** A run consumes documents in order: step k's global batch is the next
`len(plan_k.input_lengths)` documents after those of the steps before it, starting at document
`start` (`--data-start`, or the checkpoint's next document after `--load`). A plan fits its
step when its `input_lengths` are exactly the lengths of those documents; `hydraplan data lengths`
prints them for `hydraplan plan --lengths`. `check_batches` refuses, before any compute, a plan
whose lengths differ (naming the step and the first differing sequence), a run past the last
document, and a token the model's vocabulary does not hold.

numpy only: the CLI validates a directory without torch; the runtime wraps the arrays in tensors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hydraplan.runtime.assignment import PlanRefusedError

__all__ = [
    "DTYPES",
    "FORMAT",
    "DataFormatError",
    "DataMismatchError",
    "TokenDirectory",
    "batch_starts",
    "check_batches",
    "write_token_directory",
]

FORMAT = "hydraplan.tokens/1"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
META, TOKENS, OFFSETS = "meta.json", "tokens.bin", "offsets.bin"
MIN_DOCUMENT_TOKENS = 2  # one input token and its label


class DataFormatError(PlanRefusedError):
    """The token directory is missing, malformed or inconsistent; the message is one line."""


class DataMismatchError(PlanRefusedError):
    """The data does not fit the run's plans (lengths, documents left, vocabulary)."""


@dataclass(frozen=True)
class TokenDirectory:
    """An opened, validated token directory; `tokens` and `offsets` are read-only memory maps."""

    path: str
    dtype: str
    vocab_size: int
    tokenizer: str
    eos_id: int | None
    tokens: np.ndarray
    offsets: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @classmethod
    def open(cls, path: str | os.PathLike) -> TokenDirectory:
        """Open `path`, checking the meta, the file sizes and the offsets (not every token:
        `check_batches` scans the documents a run uses, `verify_tokens` all of them)."""
        root = Path(path)
        if not root.is_dir():
            raise DataFormatError(f"{path}: not a directory (a {FORMAT} token directory is expected)")
        meta = _read_meta(root)
        itemsize = np.dtype(DTYPES[meta["dtype"]]).itemsize
        _check_size(root / TOKENS, meta["num_tokens"] * itemsize, f"{meta['num_tokens']} tokens of {meta['dtype']}")
        _check_size(root / OFFSETS, (meta["num_documents"] + 1) * 8, f"{meta['num_documents'] + 1} int64 offsets")
        offsets = _memmap(root / OFFSETS, np.int64, meta["num_documents"] + 1)
        tokens = _memmap(root / TOKENS, DTYPES[meta["dtype"]], meta["num_tokens"])
        _check_offsets(root, offsets, meta["num_tokens"])
        return cls(str(root), meta["dtype"], meta["vocab_size"], meta["tokenizer"], meta["eos_id"], tokens, offsets)

    def document(self, index: int) -> np.ndarray:
        """The tokens of document `index` (a read-only view of the memory map)."""
        if not 0 <= index < self.num_documents:
            raise IndexError(f"document {index}: the data holds {self.num_documents}")
        return self.tokens[int(self.offsets[index]) : int(self.offsets[index + 1])]

    def sequence_lengths(self, start: int, count: int) -> list[int]:
        """The training-sequence lengths (tokens - 1) of documents `[start, start + count)`."""
        stop = min(start + count, self.num_documents)
        return [int(n) - 1 for n in np.diff(self.offsets[start : stop + 1])] if start < stop else []

    def verify_tokens(self, chunk_tokens: int = 1 << 24) -> None:
        """Scan every token (in chunks) against the meta's vocabulary size."""
        for begin in range(0, self.num_tokens, chunk_tokens):
            chunk = self.tokens[begin : begin + chunk_tokens]
            largest = int(chunk.max()) if len(chunk) else 0
            if largest >= self.vocab_size:
                where = begin + int(np.argmax(chunk >= self.vocab_size))
                document = int(np.searchsorted(self.offsets, where, side="right")) - 1
                raise DataFormatError(
                    f"{self.path}: token {int(self.tokens[where])} of document {document} is not below the "
                    f"vocab_size {self.vocab_size} of {META}"
                )


def _read_meta(root: Path) -> dict:
    meta_path = root / META
    if not meta_path.is_file():
        raise DataFormatError(f"{root}: no {META} (not a {FORMAT} token directory)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise DataFormatError(f"{meta_path}: not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataFormatError(f"{meta_path}: format must be {FORMAT!r}, got {_get(meta, 'format')!r}")
    if meta.get("dtype") not in DTYPES:
        raise DataFormatError(f"{meta_path}: dtype must be one of {sorted(DTYPES)}, got {meta.get('dtype')!r}")
    for key in ("vocab_size", "num_documents", "num_tokens"):
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "num_tokens" else 1):
            raise DataFormatError(f"{meta_path}: {key} must be a positive integer, got {value!r}")
    most = int(np.iinfo(DTYPES[meta["dtype"]]).max) + 1
    if meta["vocab_size"] > most:
        raise DataFormatError(f"{meta_path}: vocab_size {meta['vocab_size']} does not fit {meta['dtype']} ({most})")
    eos_id = meta.get("eos_id")
    if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int)):
        raise DataFormatError(f"{meta_path}: eos_id must be an integer or null, got {eos_id!r}")
    tokenizer = meta.get("tokenizer", "")
    if not isinstance(tokenizer, str):
        raise DataFormatError(f"{meta_path}: tokenizer must be a string, got {tokenizer!r}")
    return dict(meta, eos_id=eos_id, tokenizer=tokenizer)


def _get(meta, key: str):
    return meta.get(key) if isinstance(meta, dict) else None


def _check_size(path: Path, expected_bytes: int, what: str) -> None:
    if not path.is_file():
        raise DataFormatError(f"{path}: missing (the {FORMAT} directory needs {TOKENS} and {OFFSETS})")
    size = path.stat().st_size
    if size != expected_bytes:
        raise DataFormatError(f"{path}: {size} bytes, but {META} says {what} ({expected_bytes} bytes)")


def _memmap(path: Path, dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(count,))


def _check_offsets(root: Path, offsets: np.ndarray, num_tokens: int) -> None:
    if int(offsets[0]) != 0 or int(offsets[-1]) != num_tokens:
        raise DataFormatError(
            f"{root / OFFSETS}: must start at 0 and end at num_tokens {num_tokens}, "
            f"got {int(offsets[0])} .. {int(offsets[-1])}"
        )
    sizes = np.diff(offsets)
    short = np.flatnonzero(sizes < MIN_DOCUMENT_TOKENS)
    if len(short):
        raise DataFormatError(
            f"{root / OFFSETS}: document {int(short[0])} has {int(sizes[short[0]])} tokens "
            f"(at least {MIN_DOCUMENT_TOKENS}: one input and its next-token label)"
        )


def write_token_directory(
    path: str | os.PathLike,
    documents: Iterable[Sequence[int]],
    vocab_size: int,
    tokenizer: str,
    eos_id: int | None = None,
) -> dict:
    """Write `documents` (token id sequences, each of at least 2 tokens) as a token directory;
    returns its meta. The meta is written last, so a directory without it is an unfinished one."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / META).unlink(missing_ok=True)
    dtype = "uint16" if vocab_size <= 1 << 16 else "uint32"
    offsets = [0]
    with open(root / TOKENS, "wb") as handle:
        for index, document in enumerate(documents):
            array = np.asarray(document, dtype=np.int64)
            if len(array) < MIN_DOCUMENT_TOKENS:
                raise ValueError(f"document {index}: {len(array)} tokens (at least {MIN_DOCUMENT_TOKENS})")
            if array.min() < 0 or array.max() >= vocab_size:
                raise ValueError(f"document {index}: a token outside [0, {vocab_size})")
            handle.write(array.astype(np.dtype(DTYPES[dtype]).newbyteorder("<")).tobytes())
            offsets.append(offsets[-1] + len(array))
    if len(offsets) == 1:
        raise ValueError("no document to write (every input was empty)")
    np.asarray(offsets, dtype="<i8").tofile(root / OFFSETS)
    meta = {
        "format": FORMAT,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "num_documents": len(offsets) - 1,
        "num_tokens": offsets[-1],
        "tokenizer": tokenizer,
        "eos_id": eos_id,
    }
    (root / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta


def batch_starts(batch_sizes: Sequence[int], start: int) -> list[int]:
    """The first document of every step: step k begins after the documents of steps 0..k-1."""
    starts, cursor = [], start
    for size in batch_sizes:
        starts.append(cursor)
        cursor += size
    return starts


def check_batches(
    data: TokenDirectory,
    step_lengths: Sequence[Sequence[int]],
    start: int,
    vocab_size: int,
    first_step: int = 0,
) -> int:
    """Refuse (`DataMismatchError`, one line) unless every step's plan lengths are exactly its
    documents' and their tokens are below the model's `vocab_size`; returns the next document
    after the run. `first_step` only numbers the steps in the messages."""
    starts = batch_starts([len(lengths) for lengths in step_lengths], start)
    for index, (lengths, begin) in enumerate(zip(step_lengths, starts)):
        step = first_step + index
        stop = begin + len(lengths)
        if stop > data.num_documents:
            raise DataMismatchError(
                f"step {step} needs documents {begin}..{stop - 1} but {data.path} holds {data.num_documents} "
                f"(documents 0..{data.num_documents - 1})"
            )
        actual = data.sequence_lengths(begin, len(lengths))
        if list(lengths) != actual:
            sequence = next(i for i, (a, b) in enumerate(zip(lengths, actual)) if a != b)
            raise DataMismatchError(
                f"step {step}: the plan's input_lengths differ from the data's batch (documents {begin}..{stop - 1} "
                f"of {data.path}): sequence {sequence} has length {lengths[sequence]} in the plan, "
                f"{actual[sequence]} in document {begin + sequence} (`hydraplan data lengths --start {begin} "
                f"--count {len(lengths)}` prints the batch's lengths)"
            )
        _check_vocabulary(data, begin, stop, vocab_size, step)
    return starts[-1] + len(step_lengths[-1]) if starts else start


def _check_vocabulary(data: TokenDirectory, begin: int, stop: int, vocab_size: int, step: int) -> None:
    tokens = data.tokens[int(data.offsets[begin]) : int(data.offsets[stop])]
    largest = int(tokens.max()) if len(tokens) else 0
    if largest < min(vocab_size, data.vocab_size):
        return
    limit = min(vocab_size, data.vocab_size)
    where = int(np.argmax(tokens >= limit))
    document = int(np.searchsorted(data.offsets, int(data.offsets[begin]) + where, side="right")) - 1
    if tokens[where] >= data.vocab_size:
        raise DataFormatError(
            f"{data.path}: token {int(tokens[where])} of document {document} is not below the vocab_size "
            f"{data.vocab_size} of {META}"
        )
    raise DataMismatchError(
        f"step {step}: document {document} holds token {int(tokens[where])}, beyond the model's vocabulary "
        f"of {vocab_size} (the data's tokenizer {data.tokenizer or '?'} has {data.vocab_size})"
    )
