"""`hydraplan data`: make and read the pre-tokenised documents of `hydraplan run --data`.

- `data convert INPUT... --out DIR`: a text or JSONL corpus to a `hydraplan.tokens/1` directory
  (`runtime/token_data.py` documents the format). A `.jsonl` file holds one JSON object a line,
  its text under `--text-key`; any other file is plain text, one document per blank-line-separated
  paragraph. Each document is its tokens plus the tokenizer's end-of-text id
  (`api/cli/tokenizers.py`); empty documents are skipped and counted.
- `data lengths DIR [--start N] (--count B | --tokens T)`: the sequence lengths of the next batch
  as a JSON list, for `hydraplan plan --lengths`: a plan made from them fits that run step.
- `data info DIR [--verify]`: the meta and the length statistics; `--verify` scans every token.

The format module is numpy only (no torch) and is imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from hydraplan.api.cli.args import non_negative_int, positive_int

EXIT_OK = 0


def run_convert(args: argparse.Namespace) -> int:
    """`hydraplan data convert`."""
    from hydraplan.api.cli.tokenizers import make_tokenizer
    from hydraplan.runtime.token_data import write_token_directory

    tokenizer = make_tokenizer(args.tokenizer)
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.force:
        raise ValueError(f"--out {args.out}: exists and is not an empty directory (--force overwrites)")
    for name in args.inputs:
        if not Path(name).is_file():
            raise ValueError(f"{name}: not a file")
    skipped = [0]

    def documents() -> Iterator[list[int]]:
        for name in args.inputs:
            for text in _texts(Path(name), args.text_key):
                ids = tokenizer.encode(text)
                if not ids:
                    skipped[0] += 1
                    continue
                yield [*ids, tokenizer.eos_id]

    # written next to --out and moved there when complete: a failed conversion leaves nothing behind
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        meta = write_token_directory(partial, documents(), tokenizer.vocab_size, tokenizer.name, tokenizer.eos_id)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print(
        f"wrote {meta['num_documents']:,} documents, {meta['num_tokens']:,} tokens ({meta['dtype']}, tokenizer "
        f"{tokenizer.name}, vocab {tokenizer.vocab_size:,}) to {out}; skipped {skipped[0]} empty"
    )
    return EXIT_OK


def _texts(path: Path, text_key: str) -> Iterator[str]:
    """The documents of one input file (see the module docstring)."""
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if path.suffix.lower() != ".jsonl":
        yield from (part.strip() for part in _paragraphs(content))
        return
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        except RecursionError as exc:  # arrays or objects nested deeper than Python's parser recurses
            raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
            raise ValueError(f"{path}:{number}: not an object with a string {text_key!r} (--text-key)")
        yield record[text_key]


def _paragraphs(content: str) -> Iterator[str]:
    paragraph: list[str] = []
    for line in content.splitlines():
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            yield "\n".join(paragraph)
            paragraph = []
    if paragraph:
        yield "\n".join(paragraph)


def run_lengths(args: argparse.Namespace) -> int:
    """`hydraplan data lengths`."""
    from hydraplan.runtime.token_data import TokenDirectory

    data = TokenDirectory.open(args.data)
    if args.start >= data.num_documents:
        raise ValueError(f"--start {args.start}: the data holds {data.num_documents} documents")
    if args.count is not None:
        lengths = data.sequence_lengths(args.start, args.count)
        if len(lengths) < args.count:
            raise ValueError(
                f"--count {args.count}: only {len(lengths)} documents from --start {args.start} "
                f"(the data holds {data.num_documents})"
            )
    else:
        lengths = _up_to_tokens(data, args.start, args.tokens)
    text = json.dumps(lengths)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    print(
        f"documents {args.start}..{args.start + len(lengths) - 1}: {len(lengths)} sequences, {sum(lengths):,} "
        f"tokens; the next batch starts at document {args.start + len(lengths)}",
        file=sys.stderr,
    )
    return EXIT_OK


def _up_to_tokens(data, start: int, budget_tokens: int) -> list[int]:
    """The next documents whose lengths sum to at most `budget_tokens` (at least one)."""
    lengths, total = [], 0
    for length in data.sequence_lengths(start, data.num_documents - start):
        if lengths and total + length > budget_tokens:
            break
        lengths.append(length)
        total += length
    return lengths


def run_info(args: argparse.Namespace) -> int:
    """`hydraplan data info`."""
    import numpy as np

    from hydraplan.runtime.token_data import TokenDirectory

    data = TokenDirectory.open(args.data)
    if args.verify:
        data.verify_tokens()
    lengths = np.diff(data.offsets) - 1
    print(
        f"{data.path}: {data.num_documents:,} documents, {data.num_tokens:,} tokens ({data.dtype}), tokenizer "
        f"{data.tokenizer or '?'}, vocab {data.vocab_size:,}, eos {data.eos_id}"
    )
    print(
        f"  sequence lengths: min {int(lengths.min())}, median {float(np.median(lengths)):g}, "
        f"max {int(lengths.max())}, mean {float(lengths.mean()):.1f}"
    )
    if args.verify:
        print(f"  every token is below the vocab_size {data.vocab_size}")
    return EXIT_OK


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommands of `hydraplan data`."""
    parser.description = (
        "Pre-tokenised documents for `hydraplan run --data DIR` (format hydraplan.tokens/1: meta.json, "
        "tokens.bin, offsets.bin; see the README)."
    )
    commands = parser.add_subparsers(title="data commands", metavar="DATA_COMMAND", required=True)
    convert = commands.add_parser("convert", help="tokenise a text/JSONL corpus into a token directory")
    convert.description = (
        "Tokenise text (.jsonl: one object a line; else paragraphs separated by blank lines) into a token directory."
    )
    convert.add_argument("inputs", nargs="+", metavar="INPUT", help="text or .jsonl files, in order")
    convert.add_argument("--out", required=True, metavar="DIR", help="the token directory to write")
    convert.add_argument(
        "--tokenizer",
        default="bytes",
        help="bytes (UTF-8 bytes + end-of-text, vocab 257) or tiktoken:NAME "
        "(needs the tiktoken package and its BPE file) (default: %(default)s)",
    )
    convert.add_argument("--text-key", default="text", help="the text field of a JSONL record (default: %(default)s)")
    convert.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    convert.set_defaults(handler=run_convert)
    lengths = commands.add_parser("lengths", help="the next batch's sequence lengths (for hydraplan plan --lengths)")
    lengths.description = "Print the sequence lengths (tokens - 1) of the next documents as a JSON list."
    lengths.add_argument("data", metavar="DIR", help="token directory")
    lengths.add_argument("--start", type=non_negative_int, default=0, help="first document (default: 0)")
    size = lengths.add_mutually_exclusive_group(required=True)
    size.add_argument("--count", type=positive_int, metavar="B", help="this many documents")
    size.add_argument("--tokens", type=positive_int, metavar="T", help="the next documents holding at most T tokens")
    lengths.add_argument("--out", metavar="FILE", help="write the JSON list here instead of stdout")
    lengths.set_defaults(handler=run_lengths)
    info = commands.add_parser("info", help="a token directory's meta and length statistics")
    info.description = "Validate a token directory and print its meta and length statistics."
    info.add_argument("data", metavar="DIR", help="token directory")
    info.add_argument("--verify", action="store_true", help="also scan every token against the vocab_size")
    info.set_defaults(handler=run_info)


ADD_ARGUMENTS = {"data": add_data_arguments}
