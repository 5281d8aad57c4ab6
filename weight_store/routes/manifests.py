"""What the store holds: the runs, a run's committed and pinned versions, and a version's manifest (by
number, or the latest), served as stored (ETag = sha256 of those bytes)."""

from __future__ import annotations

import asyncio
import hashlib

from fastapi import APIRouter
from starlette.responses import Response

from weight_store.deps import READ, Store
from weight_store.state import StoreState
from weight_store.storage import StoreError, check_run, check_version

router = APIRouter()


def manifest_response(st: StoreState, run: str, version: int) -> Response:
    raw = st.storage.manifest_raw(run, version)
    etag = '"' + hashlib.sha256(raw).hexdigest() + '"'
    return Response(raw, media_type="application/json", headers={"ETag": etag, "X-Version": str(version)})


@router.get("/v1/runs", dependencies=READ)
async def list_runs(st: Store):
    return {"runs": await asyncio.to_thread(st.storage.runs)}


@router.get("/v1/runs/{run}/versions", dependencies=READ)
async def list_versions(st: Store, run: str):
    run = check_run(run)
    versions = await asyncio.to_thread(st.storage.versions, run)
    return {"run": run, "versions": versions, "latest": versions[-1] if versions else None,
            "pinned": sorted(st.storage.pinned(run))}


@router.get("/v1/runs/{run}/latest", dependencies=READ)
async def latest(st: Store, run: str) -> Response:
    run = check_run(run)
    for _ in range(3):  # retention may remove the version between listing and reading
        v = await asyncio.to_thread(st.storage.latest, run)
        if v is None:
            raise StoreError(404, "not_found", f"run {run!r} has no committed version")
        try:
            return manifest_response(st, run, v)
        except StoreError:
            continue
    raise StoreError(503, "busy", "versions changed while reading; retry")


@router.get("/v1/runs/{run}/versions/{version}/manifest", dependencies=READ)
async def manifest(st: Store, run: str, version: str) -> Response:
    return manifest_response(st, check_run(run), check_version(version))
