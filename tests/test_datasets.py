"""Length files and seeded sample batches (api/datasets/)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydraplan.api.datasets import (
    DATASETS,
    LengthsError,
    draw_wikipedia_sample,
    load_lengths_file,
    sample_batch,
    split_at_cap,
    wikipedia_sample,
)

SHARED_WIKIPEDIA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikipedia_lengths.txt"


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------------------------------------
# load_lengths_file
# ---------------------------------------------------------------------------------------------


def test_text_file_one_integer_per_line_blank_lines_ignored(in_tmp: Path) -> None:
    Path("L.txt").write_text("12\n\n  7 \n+3\n\n", encoding="utf-8")
    assert load_lengths_file("L.txt") == [12, 7, 3]


def test_json_list(in_tmp: Path) -> None:
    Path("L.json").write_text(" [5, 1, 4096]\n", encoding="utf-8")
    assert load_lengths_file(Path("L.json")) == [5, 1, 4096]


def test_dash_reads_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("3\n4\n"))
    assert load_lengths_file("-") == [3, 4]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1\n2\nabc\n", "L.txt line 3: 'abc' is not an integer"),
        ("1\n2\n\n0\n", "L.txt line 4: length 0 must be >= 1"),
        ("5\n-3\n", "L.txt line 2: length -3 must be >= 1"),
        ("2.5\n", "L.txt line 1: '2.5' is not an integer"),
        ("1 2\n", "L.txt line 1: '1 2' is not an integer"),
        ("", "L.txt: no lengths"),
        ("\n  \n", "L.txt: no lengths"),
        ("[]", "L.txt: no lengths"),
        ("[1, 3.5]", "L.txt index 1: 3.5 is not an integer"),
        ("[true]", "L.txt index 0: true is not an integer"),
        ('[1, "7"]', 'L.txt index 1: "7" is not an integer'),
        ("[1, [2]]", "L.txt index 1: [2] is not an integer"),
        ("[4, 0]", "L.txt index 1: length 0 must be >= 1"),
        ("[4, -2]", "L.txt index 1: length -2 must be >= 1"),
    ],
)
def test_bad_lengths_name_the_place_and_the_value(in_tmp: Path, text: str, message: str) -> None:
    Path("L.txt").write_text(text, encoding="utf-8")
    with pytest.raises(LengthsError) as raised:
        load_lengths_file("L.txt")
    assert str(raised.value) == message


def test_invalid_json_and_non_list_json(in_tmp: Path) -> None:
    Path("L.txt").write_text("[1, 2", encoding="utf-8")
    with pytest.raises(LengthsError, match=r"^L\.txt: not a valid JSON list"):
        load_lengths_file("L.txt")


def test_missing_file_is_an_os_error(in_tmp: Path) -> None:
    with pytest.raises(OSError):
        load_lengths_file("missing.txt")


def test_lengths_error_is_a_value_error() -> None:
    assert issubclass(LengthsError, ValueError)


# ---------------------------------------------------------------------------------------------
# sample_batch
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", list(DATASETS))
def test_sample_batch_is_seeded_and_reaches_the_token_target(dataset: str) -> None:
    num_tokens = 200_000
    documents = sample_batch(dataset, num_tokens, seed=3, context_cap=None)
    assert documents == sample_batch(dataset, num_tokens, seed=3, context_cap=None)
    assert documents != sample_batch(dataset, num_tokens, seed=4, context_cap=None)
    assert all(isinstance(length, int) and length >= 1 for length in documents)
    # Drawn until the sum reaches the target: without the last document it is still short.
    assert sum(documents) >= num_tokens > sum(documents[:-1])


@pytest.mark.parametrize("dataset", list(DATASETS))
def test_context_cap_splits_long_documents_into_chunks(dataset: str) -> None:
    documents = sample_batch(dataset, 300_000, seed=1, context_cap=None)
    capped = sample_batch(dataset, 300_000, seed=1, context_cap=16384)
    assert capped == split_at_cap(documents, 16384)
    assert max(capped) <= 16384
    assert sum(capped) == sum(documents)


def test_default_wikipedia_batch_has_about_a_million_tokens_under_32k() -> None:
    batch = sample_batch("wikipedia", 1_000_000, seed=0)
    assert 1_000_000 <= sum(batch) < 1_000_000 + 32768
    assert max(batch) <= 32768
    assert 500 < len(batch) < 2000  # Wikipedia documents average ~1K tokens


def test_split_at_cap_makes_cap_sized_chunks_plus_remainder() -> None:
    assert split_at_cap([70000, 5, 32768], 32768) == [32768, 32768, 4464, 5, 32768]


@given(
    st.lists(st.integers(min_value=1, max_value=10**6), max_size=30),
    st.integers(min_value=1, max_value=5000),
)
def test_split_at_cap_keeps_tokens_and_respects_the_cap(lengths: list[int], cap: int) -> None:
    chunks = split_at_cap(lengths, cap)
    assert sum(chunks) == sum(lengths)
    assert all(1 <= chunk <= cap for chunk in chunks)
    assert len(chunks) == sum(math.ceil(length / cap) for length in lengths)


def test_lognormal_is_megatron_mock_with_mean_1024_before_clipping() -> None:
    rng = np.random.default_rng(0)
    clipped = DATASETS["lognormal"](rng, 200_000)
    assert clipped.min() >= 128 and clipped.max() <= 8192
    # mu = ln(1024) - sigma^2/2 makes the unclipped mean 1024: check with the clip undone.
    mu, sigma = math.log(1024) - 1.5**2 / 2, 1.5
    unclipped = np.random.default_rng(0).lognormal(mu, sigma, size=1_000_000)
    assert unclipped.mean() == pytest.approx(1024, rel=0.03)


def test_sft_mix_has_a_long_tail_of_about_0_11_percent() -> None:
    lengths = DATASETS["sft-mix"](np.random.default_rng(0), 1_000_000)
    is_long = lengths > 16_000
    assert 900 < is_long.sum() < 1300  # 0.11% of 1M = 1100
    assert lengths[~is_long].mean() == pytest.approx(1024, rel=0.02)
    assert np.median(lengths[is_long]) == pytest.approx(37 * 1024, rel=0.05)


def test_longalign_is_uniform_between_8k_and_64k() -> None:
    lengths = DATASETS["longalign"](np.random.default_rng(0), 100_000)
    assert lengths.min() >= 8192 and lengths.max() <= 65536
    assert lengths.mean() == pytest.approx((8192 + 65536) / 2, rel=0.01)


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'c4'; valid names: wikipedia, lognormal"):
        sample_batch("c4", 1000, seed=0)


@pytest.mark.parametrize(("num_tokens", "cap"), [(0, 100), (-5, 100), (100, 0)])
def test_non_positive_sizes_are_rejected(num_tokens: int, cap: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        sample_batch("lognormal", num_tokens, seed=0, context_cap=cap)


# ---------------------------------------------------------------------------------------------
# The bundled Wikipedia sample
# ---------------------------------------------------------------------------------------------


def test_bundled_wikipedia_sample_is_100k_real_lengths() -> None:
    sample = wikipedia_sample()
    assert sample.size == 100_000
    assert sample.min() >= 1
    # Published statistics of the full data: mean 1,014, median 347.
    assert sample.mean() == pytest.approx(1014, rel=0.05)
    assert np.median(sample) == pytest.approx(347, rel=0.05)


def test_notice_states_provenance_and_licence() -> None:
    notice = (Path(__file__).resolve().parents[1] / "api" / "datasets" / "data" / "NOTICE.md").read_text()
    for fact in (
        "PKU-DAIR/Hetu-Galvatron",
        "flexsp",
        "galvatron/datasets/wikipedia.txt",
        "Apache",
        "default_rng(0)",
    ):
        assert fact in notice


@pytest.mark.skipif(not SHARED_WIKIPEDIA.exists(), reason="shared/data is not beside the repo")
def test_bundled_sample_is_reproducible_from_the_source(tmp_path: Path) -> None:
    redrawn = tmp_path / "sample.txt"
    draw_wikipedia_sample(SHARED_WIKIPEDIA, redrawn)
    bundled = Path(__file__).resolve().parents[1] / "api" / "datasets" / "data" / "wikipedia_sample.txt"
    assert redrawn.read_bytes() == bundled.read_bytes()
