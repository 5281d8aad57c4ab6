"""A version's files: the streamed upload into staging (size limit, optional X-Content-SHA256 check, at
most weights.max_files per version) and the download of a committed file (Range, If-Range, ETag =
"sha256", HEAD), which holds its version against retention until the last byte is sent."""

from __future__ import annotations

import asyncio
import os

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from weight_store.bodies import receive_to_file
from weight_store.deps import READ, WRITE, Store
from weight_store.ranges import RangeError, parse_range
from weight_store.sendfile import FileRangeResponse
from weight_store.storage import StoreError, check_file_name, check_run, check_version

router = APIRouter()


@router.api_route("/v1/runs/{run}/versions/{version}/files/{name:path}", methods=["GET", "HEAD"], dependencies=READ)
async def download(st: Store, run: str, version: str, name: str, request: Request):
    run, v, name = check_run(run), check_version(version), check_file_name(name)
    if (run, v) in st.retiring:
        raise StoreError(404, "not_found", f"run {run!r} has no version {v}")
    path, entry = st.storage.file_entry(run, v, name)
    return send_file(st, run, v, path, entry["size"], entry["sha256"], request)


def send_file(st, run: str, v: int, path, size: int, sha256: str, request: Request):
    """The response streaming `path` (`size` bytes, ETag `sha256`) of version `v`: Range, If-Range and
    HEAD; the version is held against retention until the last byte is sent."""
    etag = f'"{sha256}"'
    headers = {"ETag": etag, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    start, end, status = 0, size, 200
    rng = request.headers.get("range")
    if_range = request.headers.get("if-range")
    if rng and (not if_range or if_range.strip() == etag):
        try:
            parsed = parse_range(rng, size)
        except RangeError as exc:
            return JSONResponse({"error": "bad_range", "message": str(exc)}, status_code=416,
                                headers={"Content-Range": f"bytes */{size}"})
        if parsed is not None:
            start, end = parsed
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    headers["Content-Length"] = str(end - start)
    fd = os.open(path, os.O_RDONLY)
    st.readers[(run, v)] += 1
    st.metrics.active.inc()
    return FileRangeResponse(fd, start, end, status, headers, st.chunk, request.method == "HEAD", st.metrics,
                             lambda: st.reader_done(run, v))


@router.put("/v1/runs/{run}/versions/{version}/files/{name:path}", dependencies=WRITE)
async def upload(st: Store, run: str, version: str, name: str, request: Request):
    run, v, name = check_run(run), check_version(version), check_file_name(name)
    limit, max_files = st.cfg.max_file_mb << 20, st.cfg.max_files
    declared_len = request.headers.get("content-length")
    if declared_len is not None and (not declared_len.isdigit() or int(declared_len) > limit):
        raise StoreError(413, "too_large", f"Content-Length {declared_len} exceeds the limit of {limit} bytes "
                                           "(weights.max_file_mb)")
    want = request.headers.get("x-content-sha256", "").strip().lower()
    async with st.lock(run):  # a commit of this version holds it: no upload starts during one
        staged = await asyncio.to_thread(st.storage.staged_files, run, v)
        if name not in staged and len(staged) >= max_files:
            raise StoreError(413, "too_many_files", f"a version holds at most {max_files} files (weights.max_files)")
        part = await asyncio.to_thread(st.storage.new_part, run, v, name)
        st.uploading[(run, v)] += 1
    try:
        size, digest, fast = await receive_to_file(request, part, limit, st.chunk, st.metrics)
        if declared_len is not None and size != int(declared_len):
            raise StoreError(400, "short_body", f"received {size} bytes, Content-Length said {declared_len}")
        if want and want != digest:
            raise StoreError(400, "digest_mismatch",
                             f"file {name!r}: declared sha256 {want}, received bytes hash to {digest}")
        rec = await asyncio.to_thread(st.storage.finish_part, run, v, name, part, size, digest, fast)
    except ClientDisconnect:
        part.unlink(missing_ok=True)
        return Response(status_code=499)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        st.uploading[(run, v)] -= 1
        if st.uploading[(run, v)] <= 0:
            del st.uploading[(run, v)]
    return rec.as_dict()
