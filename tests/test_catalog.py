"""Catalog loading, lookup errors and user extension files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hydraplan.cost_models.catalog import CatalogError, get_gpu, get_model, load_gpus, load_models
from hydraplan.planner.schemas import GpuSpec, ModelSpec

MODEL_NAMES = {"llama2-7b", "llama2-13b", "llama3-8b", "llama3-70b", "llama3-405b", "llama-32b", "tiny"}
GPU_NAMES = {"a100-40gb", "a100-80gb", "h100-sxm-80gb", "h200-141gb"}


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_bundled_catalogs_hold_every_entry_with_a_source() -> None:
    models, gpus = load_models(), load_gpus()
    assert set(models) == MODEL_NAMES
    assert set(gpus) == GPU_NAMES
    for spec in [*models.values(), *gpus.values()]:
        assert spec.source.strip(), f"{spec.name} has no source"


@pytest.mark.parametrize(
    ("name", "published_params"),
    [
        ("llama2-7b", 6.74e9),
        ("llama2-13b", 13.02e9),
        ("llama3-8b", 8.03e9),
        ("llama3-70b", 70.55e9),
    ],
)
def test_model_configs_give_the_published_parameter_counts(name: str, published_params: float) -> None:
    # Published counts (Hugging Face model cards) check layers, widths, heads and vocab together.
    assert get_model(name).num_params == pytest.approx(published_params, rel=0.005)


def test_model_entries_match_official_configs() -> None:
    llama3_8b = get_model("llama3-8b")
    assert (llama3_8b.num_layers, llama3_8b.hidden_size, llama3_8b.ffn_hidden_size) == (
        32,
        4096,
        14336,
    )
    assert (llama3_8b.num_heads, llama3_8b.num_kv_heads, llama3_8b.vocab_size) == (32, 8, 128256)
    llama_32b = get_model("llama-32b")
    assert (llama_32b.num_layers, llama_32b.hidden_size, llama_32b.ffn_hidden_size) == (
        60,
        6656,
        17920,
    )
    assert (llama_32b.num_heads, llama_32b.num_kv_heads, llama_32b.vocab_size) == (64, 64, 32000)
    tiny = get_model("tiny")
    assert (tiny.num_layers, tiny.hidden_size, tiny.ffn_hidden_size) == (4, 256, 688)
    assert (tiny.num_heads, tiny.num_kv_heads, tiny.vocab_size) == (4, 2, 1024)


def test_gpu_entries_match_datasheets() -> None:
    a100 = get_gpu("a100-80gb")
    assert a100.memory_bytes == 80e9
    assert a100.peak_bf16_flops == 312e12
    assert a100.intra_node_bandwidth_bytes_per_s == 300e9
    assert a100.inter_node_bandwidth_bytes_per_s == 25e9
    assert get_gpu("a100-40gb").memory_bytes == 40e9
    for name in ("h100-sxm-80gb", "h200-141gb"):
        hopper = get_gpu(name)
        assert hopper.peak_bf16_flops == pytest.approx(989.5e12)
        assert hopper.intra_node_bandwidth_bytes_per_s == 450e9
        assert hopper.inter_node_bandwidth_bytes_per_s == 50e9
    assert get_gpu("h200-141gb").memory_bytes == 141e9
    assert get_gpu("h200-141gb").hbm_bandwidth_bytes_per_s > get_gpu("h100-sxm-80gb").hbm_bandwidth_bytes_per_s


@pytest.mark.parametrize(("lookup", "valid_names"), [(get_model, MODEL_NAMES), (get_gpu, GPU_NAMES)])
def test_unknown_name_lists_the_valid_names(lookup, valid_names: set[str]) -> None:
    with pytest.raises(CatalogError, match="unknown .* 'gpt-5'") as caught:
        lookup("gpt-5")
    assert isinstance(caught.value, ValueError)
    for name in valid_names:
        assert name in str(caught.value)


def test_user_file_adds_and_overrides_models(tmp_path: Path) -> None:
    custom = get_model("tiny").model_dump() | {"name": "my-model", "num_layers": 6}
    override = get_model("llama3-8b").model_dump() | {"vocab_size": 32000, "source": "mine"}
    extra = _write(tmp_path / "my_models.json", {"models": [custom, override]})
    models = load_models(extra)
    assert set(models) == MODEL_NAMES | {"my-model"}
    assert models["my-model"] == ModelSpec(**custom)
    assert models["llama3-8b"].vocab_size == 32000
    assert get_model("my-model", extra_path=str(extra)).num_layers == 6
    assert load_models()["llama3-8b"].vocab_size == 128256  # the bundled catalog is untouched


def test_user_file_adds_gpus(tmp_path: Path) -> None:
    custom = get_gpu("h100-sxm-80gb").model_dump() | {"name": "h100-pcie", "source": "mine"}
    extra = _write(tmp_path / "my_gpus.json", {"gpus": [custom]})
    assert get_gpu("h100-pcie", extra) == GpuSpec(**custom)
    assert set(load_gpus(extra)) == GPU_NAMES | {"h100-pcie"}


def test_malformed_entry_names_file_and_field(tmp_path: Path) -> None:
    broken = get_model("tiny").model_dump() | {"name": "broken"}
    del broken["num_heads"]
    entries = [get_model("tiny").model_dump(), broken]
    extra = _write(tmp_path / "my_models.json", {"models": entries})
    with pytest.raises(CatalogError) as caught:
        load_models(extra)
    assert str(caught.value) == f"{extra}: models[1].num_heads: Field required"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"gpus": [{"name": "x", "memory_bytes": -1}]}, "gpus[0].memory_bytes: Input should be"),
        ({"gpus": [{"name": "x", "peak_flops": 1}]}, "gpus[0].peak_flops: Extra inputs"),
        ({"devices": []}, "gpus: a list of entries is required"),
        ([1, 2], "the top level must be a JSON object"),
    ],
)
def test_malformed_gpu_file_messages(tmp_path: Path, content: object, expected: str) -> None:
    extra = _write(tmp_path / "my_gpus.json", content)
    with pytest.raises(CatalogError, match="my_gpus.json: ") as caught:
        load_gpus(extra)
    assert expected in str(caught.value)


def test_model_level_rule_violation_names_the_entry(tmp_path: Path) -> None:
    bad_heads = get_model("tiny").model_dump() | {"num_heads": 3}
    extra = _write(tmp_path / "m.json", {"models": [bad_heads]})
    expected = r"m\.json: models\[0\]: hidden_size 256 is not divisible by num_heads 3"
    with pytest.raises(CatalogError, match=expected):
        load_models(extra)


def test_invalid_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"models": [\n  {,}\n]}', encoding="utf-8")
    with pytest.raises(CatalogError, match=r"bad\.json: not valid JSON: line 2 column 4"):
        load_models(bad)
    with pytest.raises(CatalogError, match=r"absent\.json: no such file"):
        load_gpus(tmp_path / "absent.json")
