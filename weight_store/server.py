"""The weight store HTTP service (FastAPI on uvicorn): upload, commit, list, download, retention.

Routes (docs/weight_store.md has the full table):
    PUT    /v1/runs/{run}/versions/{v}/files/{name}   streamed upload (X-Content-SHA256 optional)
    POST   /v1/runs/{run}/versions/{v}/commit         {files: [{name, size, sha256}], step, dtype, metadata[, adapter]}
    DELETE /v1/runs/{run}/versions/{v}/staging        drop an uncommitted upload
    GET    /v1/runs, /v1/runs/{run}/versions, /v1/runs/{run}/latest, /v1/runs/{run}/versions/{v}/manifest
    GET    /v1/runs/{run}/versions/{v}/files/{name}   streamed download, Range, ETag = "sha256"
    PUT|DELETE /v1/runs/{run}/versions/{v}/pin         retention never removes a pinned version
    GET    /healthz, /metrics
Every route but /healthz needs `Authorization: Bearer <token>` (reads also accept `read_token`); the
service refuses to start without a token unless `weights.insecure_no_auth` is true. 401 without a
token, 403 with a wrong one; checked before a body is read. Every refusal is JSON {"error": code, "message": text}.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections import Counter as Tally
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from shared.auth import AuthConfigError, RefuseControlChars, check_auth_setting, token_matches
from shared.config import WeightStoreConfig
from weight_store.manifest import check_adapter, new_hasher
from weight_store.ranges import RangeError, parse_range
from weight_store.storage import Storage, StoreError, check_file_name, check_run, check_version

log = logging.getLogger("jetrl.weights.server")
MAX_JSON_BYTES = 16 << 20


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.bytes_in = Counter("jetrl_weights_bytes_in", "Bytes received in uploads.", registry=r)
        self.bytes_out = Counter("jetrl_weights_bytes_out", "Bytes sent in downloads.", registry=r)
        self.sendfile_out = Counter("jetrl_weights_bytes_out_sendfile", "Download bytes sent with os.sendfile.",
                                    registry=r)
        self.versions = Gauge("jetrl_weights_versions", "Committed versions held, per run.", ["run"], registry=r)
        self.commits = Counter("jetrl_weights_commits", "Versions committed.", registry=r)
        self.commit_seconds = Histogram("jetrl_weights_commit_seconds", "Latency of a commit.", registry=r,
                                        buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10))
        self.deleted = Counter("jetrl_weights_deleted_versions", "Versions removed by retention.", registry=r)
        self.active = Gauge("jetrl_weights_active_downloads", "Downloads in progress.", registry=r)
        self.refused = Counter("jetrl_weights_refused", "Requests refused, by error code.", ["code"], registry=r)


class _State:
    """What one service process holds beyond the disk: readers in progress and retention bookkeeping."""

    def __init__(self, cfg: WeightStoreConfig):
        self.cfg = cfg
        self.storage = Storage(cfg.root, fsync=cfg.fsync)
        self.metrics = Metrics()
        self.readers: Tally[tuple[str, int]] = Tally()
        self.retiring: set[tuple[str, int]] = set()
        self.locks: dict[str, asyncio.Lock] = {}
        self.uploading: Tally[tuple[str, int]] = Tally()  # uploads in progress per version
        self.chunk = cfg.chunk_mb << 20

    def lock(self, run: str) -> asyncio.Lock:
        return self.locks.setdefault(run, asyncio.Lock())

    def busy(self, run: str) -> set[int]:
        return {v for (r, v), n in self.readers.items() if r == run and n > 0}

    async def retain(self, run: str) -> list[int]:
        """Delete versions beyond keep_last that are not pinned and not being downloaded."""
        async with self.lock(run):
            victims = await asyncio.to_thread(self.storage.to_retire, run, self.cfg.keep_last, self.busy(run))
            victims = [v for v in victims if self.readers[(run, v)] == 0]  # a reader may have started meanwhile
            self.retiring.update((run, v) for v in victims)
            try:
                for v in victims:
                    await asyncio.to_thread(self.storage.delete, run, v)
                    self.metrics.deleted.inc()
                    log.info("retention: deleted version %d of run %s", v, run)
            finally:
                self.retiring.difference_update((run, v) for v in victims)
            self.metrics.versions.labels(run).set(len(await asyncio.to_thread(self.storage.versions, run)))
        return victims

    def reader_done(self, run: str, version: int) -> None:
        key = (run, version)
        self.readers[key] -= 1
        self.metrics.active.dec()
        if self.readers[key] <= 0:
            del self.readers[key]
            asyncio.get_running_loop().create_task(self.retain(run))


def _check_token(request: Request, wanted: list[str]) -> None:
    """Pass when no token is wanted or the request carries one of `wanted` (constant-time compare)."""
    wanted = [w for w in wanted if w]
    if not wanted:
        return
    results = [token_matches(request.headers.get("authorization", ""), w) for w in wanted]
    if results[0] is None:
        raise StoreError(401, "unauthorized", "this request needs 'Authorization: Bearer <token>'")
    if not any(results):
        raise StoreError(403, "forbidden", "the bearer token is not valid for this request")


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


async def _receive_to_file(request: Request, part: Path, limit: int, chunk: int,
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


class FileRangeResponse(Response):
    """Sends bytes [start, end) of an open file in large chunks, read ahead in a thread."""

    def __init__(self, fd: int, start: int, end: int, status: int, headers: dict, chunk: int, head: bool,
                 metrics: Metrics, on_done) -> None:
        super().__init__(status_code=status, headers=headers)
        self.fd, self.start, self.end, self.chunk, self.head = fd, start, end, chunk, head
        self.metrics, self.on_done = metrics, on_done

    async def __call__(self, scope, receive, send) -> None:
        gone = asyncio.Event()

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch_disconnect())
        loop = asyncio.get_running_loop()
        nxt: asyncio.Future | None = None
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            pos = self.start
            if self.head or pos >= self.end:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            cycle = scope.get("extensions", {}).get(SENDFILE_EXTENSION, {}).get("cycle")
            if cycle is not None:
                sent = await self._sendfile(loop, cycle, gone)
                if sent is not None:
                    if sent == self.end - self.start:
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
            nxt = loop.run_in_executor(None, os.pread, self.fd, min(self.chunk, self.end - pos), pos)
            while pos < self.end and not gone.is_set():
                data = await nxt
                nxt = None
                if not data:
                    raise RuntimeError("file shrank while being served")
                pos += len(data)
                if pos < self.end:
                    nxt = loop.run_in_executor(None, os.pread, self.fd, min(self.chunk, self.end - pos), pos)
                await send({"type": "http.response.body", "body": data, "more_body": pos < self.end})
                self.metrics.bytes_out.inc(len(data))
        finally:
            watcher.cancel()
            if nxt is not None:
                await asyncio.gather(nxt, return_exceptions=True)
            os.close(self.fd)
            self.on_done()

    async def _sendfile(self, loop, cycle, gone: asyncio.Event) -> int | None:
        """Zero-copy body via os.sendfile on the connection's socket (SendfileHttpToolsProtocol).

        Returns the bytes sent, or None when sendfile is not available here (nothing was sent)."""
        f = open(self.fd, "rb", buffering=0, closefd=False)
        pos = self.start
        try:
            while pos < self.end and not gone.is_set():
                count = min(64 << 20, self.end - pos)
                try:
                    n = await loop.sendfile(cycle.transport, f, pos, count, fallback=False)
                except (NotImplementedError, RuntimeError, asyncio.SendfileNotAvailableError):
                    if pos == self.start:
                        return None  # e.g. uvloop: use the chunked path
                    raise
                except OSError:  # the reader went away
                    break
                pos += n
                cycle.expected_content_length -= n  # uvicorn counts the body bytes it framed itself
                self.metrics.bytes_out.inc(n)
                self.metrics.sendfile_out.inc(n)
        finally:
            f.close()
        return pos - self.start


def _refusal(status: int, message: str) -> tuple[bytes, str]:
    code = {400: "bad_name", 401: "unauthorized", 403: "forbidden"}.get(status, "refused")
    return json.dumps({"error": code, "message": message}).encode(), "application/json"


def create_app(cfg: WeightStoreConfig) -> FastAPI:
    """The service over `cfg.root`; start-up removes staging and trash leftovers of a crash. Refuses
    (AuthConfigError) to serve without weights.token unless weights.insecure_no_auth is true."""
    write_token, read_token = cfg.secret("token"), cfg.secret("read_token")
    if read_token and not write_token:
        raise AuthConfigError("weights.read_token: set weights.token too (a read token alone would leave writes open)")
    check_auth_setting(write_token, cfg.insecure_no_auth, "weights", "the weight store")
    st = _State(cfg)
    cleaned = st.storage.clean_leftovers()
    if cleaned:
        log.info("removed %d uncommitted upload(s) / half-deleted version(s) left in %s", cleaned, st.storage.root)
    for run in st.storage.runs():
        st.metrics.versions.labels(run).set(len(st.storage.versions(run)))
    app = FastAPI(title="jetrl weight store", docs_url=None, redoc_url=None)
    app.add_middleware(RefuseControlChars, refusal=_refusal)
    app.state.store = st

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    limit = cfg.max_file_mb << 20

    def refuse(status: int, code: str, message: str) -> JSONResponse:
        st.metrics.refused.labels(code).inc()
        return JSONResponse({"error": code, "message": message}, status_code=status,
                            headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError):
        return refuse(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        return refuse(400, "bad_request", f"{'.'.join(map(str, err['loc']))}: {err['msg']}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return refuse(exc.status_code, "not_found" if exc.status_code == 404 else "http_error", str(exc.detail))

    def read_auth(request: Request) -> None:  # reads: the read token or the write token
        _check_token(request, [write_token, read_token])

    def write_auth(request: Request) -> None:
        _check_token(request, [write_token])

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "root": str(st.storage.root)}

    @app.get("/v1/runs")
    async def list_runs(request: Request):
        read_auth(request)
        return {"runs": await asyncio.to_thread(st.storage.runs)}

    @app.get("/v1/runs/{run}/versions")
    async def list_versions(run: str, request: Request):
        read_auth(request)
        run = check_run(run)
        versions = await asyncio.to_thread(st.storage.versions, run)
        return {"run": run, "versions": versions, "latest": versions[-1] if versions else None,
                "pinned": sorted(st.storage.pinned(run))}

    def manifest_response(run: str, version: int) -> Response:
        raw = st.storage.manifest_raw(run, version)
        etag = '"' + hashlib.sha256(raw).hexdigest() + '"'
        return Response(raw, media_type="application/json", headers={"ETag": etag, "X-Version": str(version)})

    @app.get("/v1/runs/{run}/latest")
    async def latest(run: str, request: Request):
        read_auth(request)
        run = check_run(run)
        for _ in range(3):  # retention may remove the version between listing and reading
            v = await asyncio.to_thread(st.storage.latest, run)
            if v is None:
                raise StoreError(404, "not_found", f"run {run!r} has no committed version")
            try:
                return manifest_response(run, v)
            except StoreError:
                continue
        raise StoreError(503, "busy", "versions changed while reading; retry")

    @app.get("/v1/runs/{run}/versions/{version}/manifest")
    async def manifest(run: str, version: str, request: Request):
        read_auth(request)
        return manifest_response(check_run(run), check_version(version))

    @app.api_route("/v1/runs/{run}/versions/{version}/files/{name:path}", methods=["GET", "HEAD"])
    async def download(run: str, version: str, name: str, request: Request):
        read_auth(request)
        run, v, name = check_run(run), check_version(version), check_file_name(name)
        if (run, v) in st.retiring:
            raise StoreError(404, "not_found", f"run {run!r} has no version {v}")
        path, entry = st.storage.file_entry(run, v, name)
        size, etag = entry["size"], f'"{entry["sha256"]}"'
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

    @app.put("/v1/runs/{run}/versions/{version}/files/{name:path}")
    async def upload(run: str, version: str, name: str, request: Request):
        write_auth(request)
        run, v, name = check_run(run), check_version(version), check_file_name(name)
        declared_len = request.headers.get("content-length")
        if declared_len is not None and (not declared_len.isdigit() or int(declared_len) > limit):
            raise StoreError(413, "too_large", f"Content-Length {declared_len} exceeds the limit of {limit} bytes "
                                               "(weights.max_file_mb)")
        want = request.headers.get("x-content-sha256", "").strip().lower()
        async with st.lock(run):  # a commit of this version holds it: no upload starts during one
            staged = await asyncio.to_thread(st.storage.staged_files, run, v)
            if name not in staged and len(staged) >= cfg.max_files:
                raise StoreError(413, "too_many_files",
                                 f"a version holds at most {cfg.max_files} files (weights.max_files)")
            part = await asyncio.to_thread(st.storage.new_part, run, v, name)
            st.uploading[(run, v)] += 1
        try:
            size, digest, fast = await _receive_to_file(request, part, limit, st.chunk, st.metrics)
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

    @app.post("/v1/runs/{run}/versions/{version}/commit", status_code=201)
    async def commit(run: str, version: str, request: Request):
        write_auth(request)
        run, v = check_run(run), check_version(version)
        body = await _json_body(request)
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
        t0 = time.perf_counter()
        async with st.lock(run):
            if st.uploading[(run, v)]:
                raise StoreError(409, "upload_in_progress",
                                 f"{st.uploading[(run, v)]} upload(s) to version {v} of run {run!r} are still running: "
                                 "commit once they have finished")
            if cfg.max_versions_per_run and len(st.storage.versions(run)) >= cfg.max_versions_per_run:
                raise StoreError(409, "too_many_versions", f"run {run!r} holds {cfg.max_versions_per_run} versions "
                                                           "(weights.max_versions_per_run)")
            manifest, raw = await asyncio.to_thread(st.storage.commit, run, v, files, step, dtype, metadata,
                                                 adapter)
        st.metrics.commit_seconds.observe(time.perf_counter() - t0)
        st.metrics.commits.inc()
        log.info("committed version %d of run %s (%d files)", v, run, len(manifest["files"]))
        await st.retain(run)
        await asyncio.to_thread(st.storage.clean_stale_staging, cfg.staging_ttl_s)
        return {"manifest": manifest, "manifest_sha256": hashlib.sha256(raw).hexdigest()}

    @app.delete("/v1/runs/{run}/versions/{version}/staging")
    async def abort(run: str, version: str, request: Request):
        write_auth(request)
        run, v = check_run(run), check_version(version)
        async with st.lock(run):
            if st.uploading[(run, v)]:
                raise StoreError(409, "upload_in_progress", f"uploads to version {v} of run {run!r} are still running")
            return {"aborted": await asyncio.to_thread(st.storage.abort, run, v)}

    @app.put("/v1/runs/{run}/versions/{version}/pin")
    async def pin(run: str, version: str, request: Request):
        write_auth(request)
        run, v = check_run(run), check_version(version)
        async with st.lock(run):
            await asyncio.to_thread(st.storage.pin, run, v)
        return {"run": run, "version": v, "pinned": True}

    @app.delete("/v1/runs/{run}/versions/{version}/pin")
    async def unpin(run: str, version: str, request: Request):
        write_auth(request)
        run, v = check_run(run), check_version(version)
        await asyncio.to_thread(st.storage.unpin, run, v)
        await st.retain(run)
        return {"run": run, "version": v, "pinned": False}

    return app


async def _json_body(request: Request) -> dict:
    n = request.headers.get("content-length")
    if n is not None and (not n.isdigit() or int(n) > MAX_JSON_BYTES):
        raise StoreError(413, "too_large", f"a JSON body is at most {MAX_JSON_BYTES} bytes")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_JSON_BYTES:
            raise StoreError(413, "too_large", f"a JSON body is at most {MAX_JSON_BYTES} bytes")
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise StoreError(400, "bad_json", f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise StoreError(400, "bad_json", "body must be a JSON object")
    return body


SENDFILE_EXTENSION = "jetrl.sendfile"


def http_protocol():
    """uvicorn's httptools protocol, extended so downloads can use os.sendfile; h11 without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "h11"

    class SendfileHttpToolsProtocol(HttpToolsProtocol):
        """Puts the request's cycle (its transport and Content-Length bookkeeping) into the ASGI
        scope, for FileRangeResponse to send file bytes with loop.sendfile instead of copies."""

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycle = getattr(self, "cycle", None)
            if cycle is not None and hasattr(cycle, "transport") and hasattr(cycle, "expected_content_length"):
                self.scope.setdefault("extensions", {})[SENDFILE_EXTENSION] = {"cycle": cycle}

    return SendfileHttpToolsProtocol


async def serve(cfg: WeightStoreConfig, log_level: str = "info") -> None:
    """Run the service until cancelled or SIGTERM/SIGINT."""
    import uvicorn

    app = create_app(cfg)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level.lower(), access_log=False,
                            http=http_protocol(), loop="asyncio", lifespan="off", log_config=None)
    server = uvicorn.Server(config)  # loop "asyncio": its transports support sendfile (uvloop's do not)
    log.info("weight store on http://%s:%d, root %s", cfg.host, cfg.port, Path(cfg.root).resolve())
    await server.serve()
