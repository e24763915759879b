"""POST /v1/profiles (upload a cost profile) and GET /v1/profiles/{profile_id}."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from hydraplan.api.service.auth import TOKEN_REQUIRED, public_path
from hydraplan.api.service.dependencies import ServicesDep
from hydraplan.api.service.schemas import ProfileCreated
from hydraplan.planner.schemas import CostProfile

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], dependencies=TOKEN_REQUIRED)


@router.post(
    "",
    response_model=ProfileCreated,
    status_code=201,
    summary="Upload a cost profile",
    description=(
        "Stores the profile under its content hash and returns that id, usable as `profile_id` "
        "in later requests. Uploading the same profile again returns the same id."
    ),
)
def upload_profile(profile: CostProfile, services: ServicesDep, request: Request, response: Response) -> ProfileCreated:
    profile_id = services.planning.save_profile(profile)
    response.headers["Location"] = public_path(request.scope, f"/v1/profiles/{profile_id}")
    return ProfileCreated(
        profile_id=profile_id,
        num_schemes=len(profile.schemes),
        model=profile.model,
        gpu=profile.gpu,
    )


@router.get("/{profile_id}", response_model=CostProfile, summary="Read an uploaded profile")
def get_profile(profile_id: str, services: ServicesDep) -> CostProfile:
    return services.planning.uploaded_profile(profile_id)


@router.delete(
    "/{profile_id}",
    status_code=204,
    summary="Delete an uploaded profile",
    description="Its place in the profile cap is free at once; requests naming it get 404 from then on.",
)
def delete_profile(profile_id: str, services: ServicesDep) -> Response:
    services.planning.delete_profile(profile_id)
    return Response(status_code=204)
