"""The controller's REST app, versioned under /v1 (OpenAPI at /openapi.json, with the token; no /docs
or /redoc page: FastAPI's load Swagger UI / ReDoc from a CDN).

Every /v1 route except /v1/health needs `Authorization: Bearer <controller.token>` (reads too), checked
before a request body is read (shared/runtime/auth.py); without a token the controller starts only with
`controller.insecure_no_auth: true`. Every error is a 4xx JSON body {"detail": "what is wrong and what to
fix", "errors": [...]}; reads are plain JSON.

`make_app` only assembles: the lifespan, the middlewares (auth among them), the error handlers and the
routers of controller/routes/ (one module per resource; the service reached through routes/deps.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller import datasets as ds
from controller.metrics import LatencyMiddleware
from controller.routes import (
    dashboard,
    datasets,
    diagnosis,
    enqueues,
    events,
    health,
    progress,
    prometheus,
    prompts,
    rollouts,
    runs,
)
from controller.service import Controller
from controller.store import ApiError
from shared.runtime.auth import BearerAuth, RefuseControlChars, check_auth_setting

log = logging.getLogger("jetrl.controller.api")

OPEN_PATHS = ("/v1/health", "/")  # + /static/ (the dashboard); /openapi.json needs the token like /v1
# In this order: the spec lists paths in it, and a 405's Allow header names the first route a path matches.
V1_ROUTERS = (datasets, runs, enqueues, progress, prompts, rollouts, events, diagnosis, health)


def make_app(ctl: Controller) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await ctl.start()
        yield
        await ctl.close()

    app = FastAPI(title="jetrl controller", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Datasets, runs, admission-controlled prompt release, and run telemetry.")
    app.state.ctl = ctl
    install_error_handlers(app)
    token = ctl.ccfg.secret("token")
    check_auth_setting(token, ctl.ccfg.insecure_no_auth, "controller", "the controller")
    app.state.token = token  # read once: /v1/health compares against the token the middleware checks
    # Checked on the raw request, before any body is read (a dependency would run after form parsing).
    app.add_middleware(RefuseControlChars)
    app.add_middleware(BearerAuth, tokens=lambda _kind: [token], open_paths=OPEN_PATHS, open_prefixes=("/static/",),
                       wrong_status=401,
                       realm="jetrl controller")
    app.add_middleware(LatencyMiddleware, metrics=ctl.metrics)  # outermost: refusals are timed too

    for module in V1_ROUTERS:  # each router carries its /v1 prefix: a route's path is the metrics' route label
        app.include_router(module.router)
    _document_run_config(app)
    app.include_router(prometheus.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=dashboard.DASHBOARD), name="static")
    return app


def _document_run_config(app: FastAPI) -> None:
    """Put JetrlConfig (and the sections it refers to) into the spec's components, so the run-config body
    of POST /v1/runs is documented field by field (and a fuzzer can build valid ones)."""
    from shared.config import JetrlConfig

    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            spec = build()
            schema = JetrlConfig.model_json_schema(ref_template="#/components/schemas/{model}")
            comps = spec.setdefault("components", {}).setdefault("schemas", {})
            comps.update(schema.pop("$defs", {}))
            comps["JetrlConfig"] = schema
        return app.openapi_schema

    app.openapi = openapi


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_req, exc: ApiError):
        return JSONResponse({"detail": exc.message, "errors": exc.extra.get("errors", [])}, status_code=exc.status)

    @app.exception_handler(ds.DatasetError)
    async def dataset_error(_req, exc: ds.DatasetError):
        return JSONResponse({"detail": exc.message, "errors": exc.errors}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_req, exc: RequestValidationError):
        errs = exc.errors()
        items = [{"field": ".".join(str(p) for p in e.get("loc", ())), "error": str(e.get("msg", ""))} for e in errs[:20]]
        first = items[0] if items else {"field": "request", "error": "invalid"}
        return JSONResponse({"detail": f"{first['field']}: {first['error']}", "errors": items}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_req, exc: StarletteHTTPException):
        return JSONResponse({"detail": str(exc.detail), "errors": []}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal(_req, exc: Exception):  # a bug: logged with its traceback, answered without one
        log.error("internal error", exc_info=exc)
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); see the controller log",
                             "errors": []}, status_code=500)
