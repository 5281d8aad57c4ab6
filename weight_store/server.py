"""The weight store HTTP service (FastAPI on uvicorn): upload, commit, list, download, retention.

Routes (docs/weight_store.md has the full table):
    PUT    /v1/runs/{run}/versions/{v}/files/{name}   streamed upload (X-Content-SHA256 optional)
    POST   /v1/runs/{run}/versions/{v}/commit         {files: [{name, size, sha256}], step, dtype, metadata[, adapter]}
    DELETE /v1/runs/{run}/versions/{v}/staging        drop an uncommitted upload
    GET    /v1/runs, /v1/runs/{run}/versions, /v1/runs/{run}/latest, /v1/runs/{run}/versions/{v}/manifest
    GET    /v1/runs/{run}/versions/{v}/files/{name}   streamed download, Range, ETag = "sha256"
    PUT|DELETE /v1/runs/{run}/versions/{v}/pin         retention never removes a pinned version
    GET    /v1/runs/{run}/versions/{v}/delta[/files/{name}]  the version against an older one (delta.py)
    GET    /v1/runs/{run}/versions/{v}/pieces, POST .../relay  relay fan-out: piece digests, the chain (relay.py)
    GET    /healthz (just {"status": "ok"}), /metrics; no /docs, /redoc or /openapi.json
Every route but /healthz needs `Authorization: Bearer <token>` (reads also accept `read_token`); the
service refuses to start without a token unless `weights.insecure_no_auth` is true. 401 without a
token, 403 with a wrong one; checked before a body is read. Every refusal is JSON {"error": code, "message": text}.

`create_app` only assembles: the state (state.py) and tokens (deps.py) in `app.state`, the middleware, the
error handlers and the routers of weight_store/routes/ (one module per resource).
"""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.config import WeightStoreConfig
from shared.runtime.auth import AuthConfigError, RefuseControlChars, check_auth_setting
from weight_store.deps import Tokens
from weight_store.routes import deltas, files, health, manifests, relay, versions
from weight_store.sendfile import http_protocol
from weight_store.state import StoreState
from weight_store.storage import StoreError

log = logging.getLogger("jetrl.weights.server")
ROUTERS = (health, manifests, files, versions, deltas, relay)  # the order they were written in; no two share a path


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
    st = StoreState(cfg)
    cleaned = st.storage.clean_leftovers()
    if cleaned:
        log.info("removed %d uncommitted upload(s) / half-deleted version(s) left in %s", cleaned, st.storage.root)
    for run in st.storage.runs():
        st.metrics.versions.labels(run).set(len(st.storage.versions(run)))
    # No /docs, /redoc or /openapi.json: the route table is in docs/weight_store.md, and a schema served
    # without a token would tell an unauthenticated caller what to try.
    app = FastAPI(title="jetrl weight store", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RefuseControlChars, refusal=_refusal)
    app.state.store = st
    app.state.tokens = Tokens(write=write_token, read=read_token)

    def refuse(status: int, code: str, message: str) -> JSONResponse:
        st.metrics.refused.labels(code).inc()
        return JSONResponse({"error": code, "message": message}, status_code=status,
                            headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError):
        return refuse(exc.status, exc.code, exc.message)

    @app.exception_handler(OSError)
    async def _os_error(request: Request, exc: OSError):
        # a full disk is named (507: the writer retries; `jetrl why` reads the message), any other I/O
        # failure is a 500 with its error number, never the path layout of the store
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            log.error("weight store disk full: %s", exc)
            return refuse(507, "no_space", f"the weight store's disk is full ({exc.strerror}): free space under "
                          "weights.root or lower weights.keep_last")
        log.exception("I/O error serving %s", request.url.path)
        return refuse(500, "io_error", f"I/O error {errno.errorcode.get(exc.errno or 0, exc.errno)} in the weight store")

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        return refuse(400, "bad_request", f"{'.'.join(map(str, err['loc']))}: {err['msg']}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return refuse(exc.status_code, "not_found" if exc.status_code == 404 else "http_error", str(exc.detail))

    for module in ROUTERS:
        app.include_router(module.router)
    return app


async def serve(cfg: WeightStoreConfig, log_level: str = "info") -> None:
    """Run the service until cancelled or SIGTERM/SIGINT."""
    import uvicorn

    app = create_app(cfg)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level.lower(), access_log=False,
                            http=http_protocol(), loop="asyncio", lifespan="off", log_config=None)
    server = uvicorn.Server(config)  # loop "asyncio": its transports support sendfile (uvloop's do not)
    log.info("weight store on http://%s:%d, root %s", cfg.host, cfg.port, Path(cfg.root).resolve())
    await server.serve()
