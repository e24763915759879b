"""Catalogs of models and GPUs: bundled JSON files, extendable by a user's file.

Each file holds one list, ``{"models": [ModelSpec, ...]}`` or ``{"gpus": [GpuSpec, ...]}``, every
entry with exactly the `ModelSpec` / `GpuSpec` fields and a `source` citation. A user's file in the
same format adds entries; an entry whose name is already in the catalog replaces it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hydraplan.cost_models.profile_io import format_validation_error, read_json_object
from hydraplan.planner.schemas import GpuSpec, ModelSpec

__all__ = ["CatalogError", "get_gpu", "get_model", "load_gpus", "load_models"]

SpecT = TypeVar("SpecT", bound=BaseModel)


class CatalogError(ValueError):
    """An unknown catalog name, or a malformed catalog file (the message names file and field)."""


def _parse_entries(data: dict[str, Any], list_key: str, spec_type: type[SpecT], file_name: str) -> dict[str, SpecT]:
    """Validate `data[list_key]` entry by entry into `spec_type`, keyed by name."""
    entries = data.get(list_key)
    if not isinstance(entries, list):
        raise CatalogError(f"{file_name}: {list_key}: a list of entries is required")
    specs: dict[str, SpecT] = {}
    for index, entry in enumerate(entries):
        try:
            spec = spec_type.model_validate(entry)
        except ValidationError as exc:
            detail = format_validation_error(exc, (list_key, index))
            raise CatalogError(f"{file_name}: {detail}") from None
        specs[spec.name] = spec  # type: ignore[attr-defined]
    return specs


def _load(bundled_file: str, list_key: str, spec_type: type[SpecT], extra_path: str | Path | None) -> dict[str, SpecT]:
    """The bundled catalog, then the user's entries on top of it."""
    bundled = resources.files("hydraplan.cost_models").joinpath("data", bundled_file)
    with resources.as_file(bundled) as bundled_path:
        data = read_json_object(bundled_path, CatalogError)
    specs = _parse_entries(data, list_key, spec_type, bundled_file)
    if extra_path is not None:
        extra = read_json_object(Path(extra_path), CatalogError)
        specs.update(_parse_entries(extra, list_key, spec_type, str(extra_path)))
    return specs


def load_models(extra_path: str | Path | None = None) -> dict[str, ModelSpec]:
    """All catalog models by name; `extra_path` adds or overrides entries."""
    return _load("models.json", "models", ModelSpec, extra_path)


def load_gpus(extra_path: str | Path | None = None) -> dict[str, GpuSpec]:
    """All catalog GPUs by name; `extra_path` adds or overrides entries."""
    return _load("gpus.json", "gpus", GpuSpec, extra_path)


def _lookup(specs: dict[str, SpecT], name: str, kind: str) -> SpecT:
    try:
        return specs[name]
    except KeyError:
        valid = ", ".join(sorted(specs))
        raise CatalogError(f"unknown {kind} {name!r}; valid names: {valid}") from None


def get_model(name: str, extra_path: str | Path | None = None) -> ModelSpec:
    """The catalog model `name`; `CatalogError` listing the valid names when unknown."""
    return _lookup(load_models(extra_path), name, "model")


def get_gpu(name: str, extra_path: str | Path | None = None) -> GpuSpec:
    """The catalog GPU `name`; `CatalogError` listing the valid names when unknown."""
    return _lookup(load_gpus(extra_path), name, "gpu")
