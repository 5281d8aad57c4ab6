"""A version's delta (weight_store/delta.py): written at commit (Storage.commit) against the run's previous
version, and served to readers that hold that version. 404 when the version has none (the first version, a LoRA
version, a delta that would not have been smaller): the reader fetches the full version."""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import APIRouter, Request
from starlette.responses import Response

from weight_store.delta import DELTA_DIR, DELTA_JSON, blob_name
from weight_store.deps import READ, Store
from weight_store.routes.files import send_file
from weight_store.state import StoreState
from weight_store.storage import StoreError, check_file_name, check_run, check_version

log = logging.getLogger("jetrl.weights.server")
router = APIRouter()


def delta_written(st: StoreState, run: str, doc: dict | None) -> None:
    """Count and log the delta a commit wrote (Storage.commit writes it before the version appears)."""
    if doc is None:
        return
    st.metrics.delta_bytes.inc(doc["delta_bytes"])
    st.metrics.delta_full_bytes.inc(doc["full_bytes"])
    log.info("version %d of run %s: delta against %d is %d of %d bytes (%.1f %%)", doc["version"], run, doc["base"],
             doc["delta_bytes"], doc["full_bytes"], 100 * doc["delta_bytes"] / max(1, doc["full_bytes"]))


def _doc(st: StoreState, run: str, v: int) -> tuple[bytes, dict]:
    if (run, v) in st.retiring:
        raise StoreError(404, "not_found", f"run {run!r} has no version {v}")
    try:
        raw = (st.storage.version_dir(run, v) / DELTA_DIR / DELTA_JSON).read_bytes()
    except FileNotFoundError:
        raise StoreError(404, "no_delta", f"version {v} of run {run!r} has no delta: fetch the full version") from None
    return raw, json.loads(raw)


@router.get("/v1/runs/{run}/versions/{version}/delta", dependencies=READ)
async def delta(st: Store, run: str, version: str) -> Response:
    run, v = check_run(run), check_version(version)
    raw, _ = await asyncio.to_thread(_doc, st, run, v)
    return Response(raw, media_type="application/json")


@router.api_route("/v1/runs/{run}/versions/{version}/delta/files/{name:path}", methods=["GET", "HEAD"],
                  dependencies=READ)
async def delta_file(st: Store, run: str, version: str, name: str, request: Request):
    run, v, name = check_run(run), check_version(version), check_file_name(name)
    _, doc = await asyncio.to_thread(_doc, st, run, v)
    entry = next((e for e in doc["files"] if e["name"] == name and e["mode"] != "copy"), None)
    if entry is None:
        raise StoreError(404, "not_found", f"the delta of version {v} of run {run!r} has no blob for {name!r}")
    path = st.storage.version_dir(run, v) / DELTA_DIR / blob_name(name)
    return send_file(st, run, v, path, entry["size"], entry["sha256"], request)
