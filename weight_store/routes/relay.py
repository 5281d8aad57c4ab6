"""Relay fan-out, the store's side (weight_store/relay.py is the workers'): a version's piece digests,
and the chain of workers fetching it. Each worker that joins is told its upstream, the worker that
joined before it (the first one: the store itself), so the version flows store -> w1 -> w2 -> ... and
each byte leaves the store about once. A worker whose upstream failed it (dead, slow, a piece that
failed its digest) asks again naming it: the failed one leaves the chain and the asker gets the one
before it. The chain lives in this process's memory (a restarted store starts new chains; workers
already fetching carry on, falling back to the store)."""

from __future__ import annotations

import asyncio
import re

from fastapi import APIRouter, Request
from starlette.responses import Response

from weight_store.bodies import json_body
from weight_store.deps import READ, Store
from weight_store.pieces import PIECES_JSON
from weight_store.storage import StoreError, check_run, check_version

router = APIRouter()
_PEER = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]{1,260}")
MAX_CHAIN = 4096


def check_peer(url: object) -> str:
    if not isinstance(url, str) or len(url) > 300 or not _PEER.fullmatch(url):
        raise StoreError(400, "bad_peer", f"a peer is an http(s)://host:port URL, got {str(url)[:100]!r}")
    return url


@router.get("/v1/runs/{run}/versions/{version}/pieces", dependencies=READ)
async def pieces(st: Store, run: str, version: str) -> Response:
    run, v = check_run(run), check_version(version)
    try:
        raw = await asyncio.to_thread((st.storage.version_dir(run, v) / PIECES_JSON).read_bytes)
    except FileNotFoundError:
        raise StoreError(404, "no_pieces", f"version {v} of run {run!r} has no piece digests: fetch it whole") from None
    return Response(raw, media_type="application/json")


@router.post("/v1/runs/{run}/versions/{version}/relay", dependencies=READ)
async def join(st: Store, run: str, version: str, request: Request):
    """{"peer": url[, "failed": [url, ...]]} -> {"upstream": url or null (the store), "position": i}."""
    run, v = check_run(run), check_version(version)
    body = await json_body(request)
    peer = check_peer(body.get("peer"))
    failed = body.get("failed") or []
    if not isinstance(failed, list) or len(failed) > 16:
        raise StoreError(400, "bad_peer", "failed must be a list of at most 16 peer URLs")
    failed = [check_peer(f) for f in failed]
    await asyncio.to_thread(st.storage.manifest_raw, run, v)  # 404 for a version the store does not hold
    chain = st.chains.setdefault((run, v), [])
    for f in failed:
        if f != peer and f in chain:
            chain.remove(f)
    if peer not in chain:
        if len(chain) >= MAX_CHAIN:
            return {"upstream": None, "position": -1}
        chain.append(peer)
    i = chain.index(peer)
    return {"upstream": chain[i - 1] if i > 0 else None, "position": i}
