"""A version's life: commit the staged files (checked against the declared list, then retention runs),
drop an uncommitted upload, pin a version so retention keeps it, and unpin it. Each takes the run's
lock where it must not interleave with an upload or another commit."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from fastapi import APIRouter, Request

from weight_store.bodies import json_body
from weight_store.deps import WRITE, Store
from weight_store.manifest import check_adapter
from weight_store.routes.deltas import delta_written
from weight_store.storage import StoreError, check_run, check_version

log = logging.getLogger("jetrl.weights.server")
router = APIRouter()


@router.post("/v1/runs/{run}/versions/{version}/commit", status_code=201, dependencies=WRITE)
async def commit(st: Store, run: str, version: str, request: Request):
    run, v = check_run(run), check_version(version)
    body = await json_body(request)
    files = body.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise StoreError(400, "bad_commit", "body.files must be a list of {name, size, sha256}")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise StoreError(400, "bad_commit", "body.metadata must be an object")
    step, dtype = body.get("step", 0), body.get("dtype", "")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        raise StoreError(400, "bad_commit", f"body.step must be a non-negative integer, got {step!r}"[:200])
    if not isinstance(dtype, str) or len(dtype) > 64:
        raise StoreError(400, "bad_commit", "body.dtype must be a string of at most 64 characters")
    adapter = body.get("adapter")
    if adapter is not None:
        try:
            check_adapter(adapter)
        except ValueError as exc:
            raise StoreError(400, "bad_commit", f"body.{exc}") from None
    cfg = st.cfg
    t0 = time.perf_counter()
    async with st.lock(run):
        if st.uploading[(run, v)]:
            raise StoreError(409, "upload_in_progress",
                             f"{st.uploading[(run, v)]} upload(s) to version {v} of run {run!r} are still running: "
                             "commit once they have finished")
        if cfg.max_versions_per_run and len(st.storage.versions(run)) >= cfg.max_versions_per_run:
            raise StoreError(409, "too_many_versions", f"run {run!r} holds {cfg.max_versions_per_run} versions "
                                                       "(weights.max_versions_per_run)")
        delta = (cfg.delta_level, cfg.delta_max_ratio) if cfg.delta else None
        manifest, raw = await asyncio.to_thread(st.storage.commit, run, v, files, step, dtype, metadata, adapter,
                                                delta, cfg.piece_kb << 10)
        delta_written(st, run, st.storage.last_delta)
    st.metrics.commit_seconds.observe(time.perf_counter() - t0)
    st.metrics.commits.inc()
    log.info("committed version %d of run %s (%d files)", v, run, len(manifest["files"]))
    await st.retain(run)
    await asyncio.to_thread(st.storage.clean_stale_staging, cfg.staging_ttl_s)
    return {"manifest": manifest, "manifest_sha256": hashlib.sha256(raw).hexdigest()}


@router.delete("/v1/runs/{run}/versions/{version}/staging", dependencies=WRITE)
async def abort(st: Store, run: str, version: str):
    run, v = check_run(run), check_version(version)
    async with st.lock(run):
        if st.uploading[(run, v)]:
            raise StoreError(409, "upload_in_progress", f"uploads to version {v} of run {run!r} are still running")
        return {"aborted": await asyncio.to_thread(st.storage.abort, run, v)}


@router.put("/v1/runs/{run}/versions/{version}/pin", dependencies=WRITE)
async def pin(st: Store, run: str, version: str):
    run, v = check_run(run), check_version(version)
    async with st.lock(run):
        await asyncio.to_thread(st.storage.pin, run, v)
    return {"run": run, "version": v, "pinned": True}


@router.delete("/v1/runs/{run}/versions/{version}/pin", dependencies=WRITE)
async def unpin(st: Store, run: str, version: str):
    run, v = check_run(run), check_version(version)
    await asyncio.to_thread(st.storage.unpin, run, v)
    await st.retain(run)
    return {"run": run, "version": v, "pinned": False}
