"""Request bodies, read within limits: an upload streamed to its staging file with both manifest digests
computed on the way (memory stays at ~2 chunks), and a commit's JSON body, refused (400 or 413, never a
500) when it is too large, too deep, holds a huge integer or is not JSON at all."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from fastapi import Request

from weight_store.manifest import new_hasher
from weight_store.state import Metrics
from weight_store.storage import StoreError

MAX_JSON_BYTES = 16 << 20
MAX_JSON_DEPTH = 32  # a commit body nests 4 levels; deeper is refused (400), never a RecursionError (500)
MAX_INT_DIGITS = 20  # every integer of a commit fits 64 bits; a 5,000-digit one is refused (400)


def _write_hash(fd: int, hashers, chunks: list[bytes]) -> None:
    """Hash and append the received chunks (handed over as they came: no joining copy)."""
    for c in chunks:
        for h in hashers:
            h.update(c)
    views = [memoryview(c) for c in chunks if c]
    while views:
        n = os.writev(fd, views[:1024])
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


async def receive_to_file(request: Request, part: Path, limit: int, chunk: int,
                          metrics: Metrics) -> tuple[int, str, str]:
    """Stream the request body into `part`; returns (size, sha256, xxh3_128), both digests computed on the
    way (the manifest's, weight_store/manifest.py). Memory stays at ~2 chunks."""
    loop = asyncio.get_running_loop()
    h = (new_hasher("sha256"), new_hasher("xxh3_128"))
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    pending: asyncio.Future | None = None
    chunks: list[bytes] = []
    held = size = 0
    try:
        async for data in request.stream():
            size += len(data)
            metrics.bytes_in.inc(len(data))
            if size > limit:
                raise StoreError(413, "too_large", f"upload exceeds the limit of {limit} bytes (weights.max_file_mb)")
            chunks.append(data)
            held += len(data)
            if held >= chunk:
                if pending is not None:
                    await pending
                pending = loop.run_in_executor(None, _write_hash, fd, h, chunks)
                chunks, held = [], 0
        if pending is not None:
            await pending
            pending = None
        if chunks:
            await loop.run_in_executor(None, _write_hash, fd, h, chunks)
    finally:
        if pending is not None:
            await asyncio.gather(pending, return_exceptions=True)
        os.close(fd)
    return size, h[0].hexdigest(), h[1].hexdigest()


async def json_body(request: Request) -> dict:
    n = request.headers.get("content-length")
    if n is not None and (not n.isdigit() or int(n) > MAX_JSON_BYTES):
        raise StoreError(413, "too_large", f"a JSON body is at most {MAX_JSON_BYTES} bytes")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_JSON_BYTES:
            raise StoreError(413, "too_large", f"a JSON body is at most {MAX_JSON_BYTES} bytes")
    try:
        body = json.loads(raw or b"{}", parse_constant=_no_constant, parse_int=_small_int)
    except RecursionError:
        raise StoreError(400, "bad_json", "body is nested too deeply") from None
    except ValueError as exc:
        raise StoreError(400, "bad_json", f"body is not valid JSON: {exc}"[:300]) from None
    if not isinstance(body, dict):
        raise StoreError(400, "bad_json", "body must be a JSON object")
    if _depth(body) > MAX_JSON_DEPTH:
        raise StoreError(400, "bad_json", f"body is nested more than {MAX_JSON_DEPTH} levels deep")
    return body


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (standard JSON has no NaN or Infinity)")


def _small_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _depth(obj) -> int:
    """How deeply `obj` nests lists and objects (iterative: no recursion on hostile input)."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        o, d = todo.pop()
        if isinstance(o, dict):
            o = list(o.values())
        if isinstance(o, list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in o if isinstance(x, (dict, list)))
    return deepest
