"""Pre-tokenised documents (`runtime/token_data.py`) and `hydraplan data` (no torch needed).

A tiny corpus is converted with the byte-level tokenizer and read back; broken directories are
refused with one line naming what is wrong; a run's plans are matched against the documents.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hydraplan.api.cli import main
from hydraplan.api.cli.tokenizers import ByteTokenizer, TokenizerError, make_tokenizer
from hydraplan.runtime.token_data import (
    DataFormatError,
    DataMismatchError,
    TokenDirectory,
    batch_starts,
    check_batches,
    write_token_directory,
)

CORPUS_TEXT = "The first document.\nIt has two lines.\n\n\nSecond: é!\n\n   \nthird\n"
CORPUS_JSONL = '{"text": "a JSON document", "id": 1}\n\n{"text": ""}\n{"text": "zz"}\n'
TEXTS = ["The first document.\nIt has two lines.", "Second: é!", "third", "a JSON document", "zz"]


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "corpus.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    (tmp_path / "corpus.jsonl").write_text(CORPUS_JSONL, encoding="utf-8")
    return tmp_path


def convert(corpus, capsys) -> TokenDirectory:
    out = corpus / "tokens"
    code = main(["data", "convert", str(corpus / "corpus.txt"), str(corpus / "corpus.jsonl"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "wrote 5 documents" in capsys.readouterr().out
    return TokenDirectory.open(out)


def test_convert_then_read_back_every_document(corpus, capsys):
    data = convert(corpus, capsys)
    assert (data.num_documents, data.dtype, data.vocab_size, data.eos_id) == (5, "uint16", 257, 256)
    for index, text in enumerate(TEXTS):
        tokens = data.document(index)
        assert tokens[-1] == 256
        assert bytes(tokens[:-1].astype(np.uint8)).decode("utf-8") == text
    # a document of n tokens is one sequence of length n - 1 (text bytes + end-of-text - 1)
    assert data.sequence_lengths(0, 5) == [len(text.encode()) for text in TEXTS]
    assert data.sequence_lengths(3, 10) == [15, 2]
    meta = json.loads((corpus / "tokens" / "meta.json").read_text())
    assert meta["num_tokens"] == sum(len(t.encode()) + 1 for t in TEXTS) == data.num_tokens
    with pytest.raises(IndexError):
        data.document(5)


def test_the_memory_map_reads_the_files_as_written(tmp_path):
    documents = [[1, 2, 3], [70_000, 5], [9, 9, 9, 9]]
    meta = write_token_directory(tmp_path / "d", documents, vocab_size=100_000, tokenizer="test", eos_id=None)
    assert meta["dtype"] == "uint32"  # 100,000 ids do not fit uint16
    data = TokenDirectory.open(tmp_path / "d")
    assert [data.document(i).tolist() for i in range(3)] == documents
    assert isinstance(data.tokens, np.memmap) and not data.tokens.flags.writeable
    assert np.fromfile(tmp_path / "d" / "offsets.bin", dtype="<i8").tolist() == [0, 3, 5, 9]


def test_lengths_prints_the_next_batch_for_hydraplan_plan(corpus, capsys):
    convert(corpus, capsys)
    out = str(corpus / "tokens")
    assert main(["data", "lengths", out, "--start", "1", "--count", "3"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [11, 5, 15]
    assert "the next batch starts at document 4" in captured.err
    # at most 21 tokens from document 1: 11 + 5 fit, + 15 does not
    assert main(["data", "lengths", out, "--start", "1", "--tokens", "21", "--out", str(corpus / "l.json")]) == 0
    assert json.loads((corpus / "l.json").read_text()) == [11, 5]
    assert "documents 1..2: 2 sequences, 16 tokens" in capsys.readouterr().err
    assert main(["data", "lengths", out, "--start", "4", "--count", "2"]) == 2
    assert (
        capsys.readouterr().err == "hydraplan: error: --count 2: only 1 documents from --start 4 (the data holds 5)\n"
    )
    assert main(["data", "info", out, "--verify"]) == 0
    assert "5 documents" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "meta.json").unlink(), "no meta.json"),
        (lambda d: (d / "meta.json").write_text("{nope"), "meta.json: not JSON"),
        (lambda d: (d / "meta.json").write_text("[" * 100_000), "meta.json: not JSON (maximum recursion depth"),
        (lambda d: _edit_meta(d, format="other/1"), "format must be 'hydraplan.tokens/1', got 'other/1'"),
        (lambda d: _edit_meta(d, dtype="int8"), "dtype must be one of ['uint16', 'uint32'], got 'int8'"),
        (lambda d: _edit_meta(d, vocab_size=0), "vocab_size must be a positive integer, got 0"),
        (lambda d: _edit_meta(d, vocab_size=70_000), "vocab_size 70000 does not fit uint16 (65536)"),
        (
            lambda d: _edit_meta(d, num_tokens=10),
            "tokens.bin: 150 bytes, but meta.json says 10 tokens of uint16",
        ),
        (lambda d: (d / "offsets.bin").unlink(), "offsets.bin: missing"),
        (lambda d: _write_offsets(d, [0, 5, 3, 40, 55, 75]), "document 1 has -2 tokens"),
        (lambda d: _write_offsets(d, [0, 40, 41, 50, 55, 75]), "document 1 has 1 tokens (at least 2"),
        (lambda d: _write_offsets(d, [1, 40, 45, 50, 55, 75]), "must start at 0 and end at num_tokens 75, got 1 .. 75"),
    ],
)
def test_a_broken_directory_is_refused_with_one_line(corpus, capsys, damage, message):
    convert(corpus, capsys)
    damage(corpus / "tokens")
    with pytest.raises(DataFormatError, match=None) as caught:
        TokenDirectory.open(corpus / "tokens")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert main(["data", "info", str(corpus / "tokens")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hydraplan: error: ") and message in err and err.count("\n") == 1


def _edit_meta(directory, **changes) -> None:
    meta = json.loads((directory / "meta.json").read_text())
    (directory / "meta.json").write_text(json.dumps(dict(meta, **changes)))


def _write_offsets(directory, offsets) -> None:
    np.asarray(offsets, dtype="<i8").tofile(directory / "offsets.bin")


def test_a_token_beyond_the_meta_vocabulary_is_found(tmp_path):
    write_token_directory(tmp_path / "d", [[1, 2], [3, 4, 5]], vocab_size=10, tokenizer="t")
    tokens = np.fromfile(tmp_path / "d" / "tokens.bin", dtype="<u2")
    tokens[3] = 12
    tokens.tofile(tmp_path / "d" / "tokens.bin")
    data = TokenDirectory.open(tmp_path / "d")
    with pytest.raises(DataFormatError, match="token 12 of document 1 is not below the vocab_size 10"):
        data.verify_tokens()
    with pytest.raises(DataFormatError, match="token 12 of document 1"):
        check_batches(data, [[1], [2]], 0, vocab_size=100)


def test_convert_refuses_bad_input_with_one_line(corpus, capsys):
    (corpus / "bad.jsonl").write_text('{"text": "ok"}\n[1, 2]\n', encoding="utf-8")
    assert main(["data", "convert", str(corpus / "bad.jsonl"), "--out", str(corpus / "o")]) == 2
    assert "bad.jsonl:2: not an object with a string 'text' (--text-key)" in capsys.readouterr().err
    (corpus / "deep.jsonl").write_text('{"text": "ok"}\n' + "[" * 100_000 + "\n", encoding="utf-8")
    assert main(["data", "convert", str(corpus / "deep.jsonl"), "--out", str(corpus / "o")]) == 2
    assert "deep.jsonl:2: not JSON (maximum recursion depth exceeded" in capsys.readouterr().err
    (corpus / "bin.txt").write_bytes(b"\xff\xfe\x00")
    assert main(["data", "convert", str(corpus / "bin.txt"), "--out", str(corpus / "o")]) == 2
    assert "bin.txt: not UTF-8 text" in capsys.readouterr().err
    (corpus / "empty.txt").write_text("\n\n  \n", encoding="utf-8")
    assert main(["data", "convert", str(corpus / "empty.txt"), "--out", str(corpus / "o")]) == 2
    assert "no document to write" in capsys.readouterr().err
    assert main(["data", "convert", str(corpus / "corpus.txt"), "--out", str(corpus)]) == 2
    assert "exists and is not an empty directory (--force overwrites)" in capsys.readouterr().err
    assert main(["data", "convert", str(corpus / "corpus.txt"), "--out", str(corpus / "t"), "--tokenizer", "x"]) == 2
    assert "--tokenizer x: one of 'bytes' or 'tiktoken:NAME'" in capsys.readouterr().err


def test_tokenizers():
    assert ByteTokenizer().encode("aé") == [97, 0xC3, 0xA9]
    assert make_tokenizer("bytes").vocab_size == 257
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        with pytest.raises(TokenizerError, match="the tiktoken package is not installed"):
            make_tokenizer("tiktoken:gpt2")


def test_plans_are_matched_against_the_documents(corpus, capsys):
    data = convert(corpus, capsys)
    lengths = data.sequence_lengths(0, 5)  # [37, 11, 5, 15, 2]
    assert batch_starts([2, 3], 0) == [0, 2]
    assert check_batches(data, [lengths[:2], lengths[2:]], 0, vocab_size=257) == 5
    assert check_batches(data, [lengths[1:3]], 1, vocab_size=257) == 3
    with pytest.raises(DataMismatchError) as caught:
        check_batches(data, [lengths[:2], [5, 16, 2]], 0, vocab_size=257)
    assert str(caught.value) == (
        f"step 1: the plan's input_lengths differ from the data's batch (documents 2..4 of {data.path}): sequence 1 "
        "has length 16 in the plan, 15 in document 3 (`hydraplan data lengths --start 2 --count 3` prints the "
        "batch's lengths)"
    )
    with pytest.raises(DataMismatchError, match="step 4 needs documents 5..5 but .* holds 5 "):
        check_batches(data, [lengths[3:], [1]], 3, vocab_size=257, first_step=3)
    # the bytes of "é" (0xC3, 0xA9) lie beyond a 128-token vocabulary: document 1, the first one holding it
    with pytest.raises(DataMismatchError, match="step 0: document 1 holds token 195, beyond the model's vocabulary"):
        check_batches(data, [lengths[1:3]], 1, vocab_size=128)
    with pytest.raises(DataMismatchError, match="document 0 holds token 256"):
        check_batches(data, [lengths[:1]], 0, vocab_size=256)


def test_online_planning_reads_each_steps_batch_from_the_documents(corpus, capsys, monkeypatch):
    """`hydraplan run --data DIR` without a plan file: rank 0 plans step k for the next
    `--batch-sequences` documents, the same ones the ranks then train on (`StepFeed`)."""
    pytest.importorskip("torch")
    from hydraplan.api.cli.run_planning import DocumentLengths
    from hydraplan.runtime import launch

    data = convert(corpus, capsys)
    lengths = DocumentLengths(str(corpus / "tokens"), 1, 2)
    assert lengths(0) == data.sequence_lengths(1, 2) and lengths(1) == data.sequence_lengths(3, 2)
    with pytest.raises(ValueError, match=r"step 2 needs documents 5\.\.6, it holds 5"):
        lengths(2)
    specs = []

    def fake_run_ranks(fn, nproc, *, backend, args, timeout_s, stall_timeout_s, on_progress=None):
        specs.append(args[0])
        return None  # as a failed launch: what the CLI gets is not under test here, the spec it launched is

    monkeypatch.setattr(launch, "run_ranks", fake_run_ranks)
    argv = ["run", "--nproc", "1", "--steps", "2", "--data", str(corpus / "tokens"), "--data-start", "1"]
    assert main([*argv, "--batch-sequences", "2"]) == 1
    (spec,) = specs
    assert spec.data_path == str(corpus / "tokens") and spec.data_start == 1
    assert spec.next_lengths(0) == data.sequence_lengths(1, 2)
    assert spec.next_lengths(1) == data.sequence_lengths(3, 2)
