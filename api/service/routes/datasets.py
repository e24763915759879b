"""GET /v1/datasets and /v1/datasets/{name}/sample: the bundled length distributions, so a
client without its own lengths (the web page) can plan a realistic batch."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from hydraplan.api.datasets import DATASET_DESCRIPTIONS, DATASETS, sample_batch
from hydraplan.api.service.auth import TOKEN_REQUIRED
from hydraplan.api.service.dependencies import ServicesDep
from hydraplan.api.service.planning import Cancel
from hydraplan.api.service.problems import not_found, too_large
from hydraplan.api.service.schemas import DatasetInfo, DatasetList, DatasetSample

router = APIRouter(prefix="/v1/datasets", tags=["catalog"], dependencies=TOKEN_REQUIRED)
# Most tokens one sample may ask for: 64x the CLI's default batch, ~200K Wikipedia documents.
MAX_SAMPLE_TOKENS = 64_000_000


@router.get("", response_model=DatasetList, summary="Bundled datasets")
def list_datasets() -> DatasetList:
    entries = [DatasetInfo(name=name, description=text) for name, text in DATASET_DESCRIPTIONS.items()]
    return DatasetList(datasets=entries)


@router.get(
    "/{name}/sample",
    response_model=DatasetSample,
    summary="Sample a batch from a bundled dataset",
    description=(
        "The lengths `hydraplan plan --dataset NAME --num-tokens N --seed S --context-cap C` plans. The draw "
        "runs in the solver pool (503 when it is full); a sample of more sequences than the server plans "
        "per request (at least num_tokens / context_cap of them) is refused with 413 before any is drawn."
    ),
)
async def sample(
    name: Annotated[str, Path(max_length=64, description="Dataset name (GET /v1/datasets).")],
    services: ServicesDep,
    num_tokens: Annotated[int, Query(ge=1, le=MAX_SAMPLE_TOKENS, description="Tokens to draw.")] = 1_000_000,
    seed: Annotated[int, Query(ge=0, le=2**32 - 1, description="Seed of the draw.")] = 0,
    context_cap: Annotated[
        int, Query(ge=1, le=2**31 - 1, description="Longer documents become cap-sized chunks plus the rest.")
    ] = 32768,
) -> DatasetSample:
    if name not in DATASETS:
        raise not_found(f"dataset {name!r} is unknown; valid: {', '.join(DATASETS)}")
    limit = services.settings.max_sequences
    at_least = -(-num_tokens // context_cap)  # every piece of a split document holds <= context_cap tokens
    if at_least > limit:
        raise too_large(
            f"num_tokens {num_tokens} with context_cap {context_cap} make at least {at_least} sequences, over "
            f"this server's limit of {limit} per request"
        )
    lengths = await services.solver.run(_draw, name, num_tokens, seed, context_cap, limit)
    return DatasetSample(dataset=name, seed=seed, num_tokens=sum(lengths), lengths=lengths)


def _draw(name: str, num_tokens: int, seed: int, context_cap: int, limit: int, cancel: Cancel) -> list[int]:
    lengths = sample_batch(name, num_tokens, seed, context_cap)
    if len(lengths) > limit:
        raise too_large(
            f"num_tokens {num_tokens} with context_cap {context_cap} drew {len(lengths)} sequences, over this "
            f"server's limit of {limit} per request"
        )
    return lengths
