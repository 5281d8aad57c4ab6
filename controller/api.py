"""REST routes of the controller, versioned under /v1 (OpenAPI at /openapi.json, docs at /docs).

Every /v1 route except /v1/health needs `Authorization: Bearer <controller.token>` (reads too), checked
before a request body is read (shared/auth.py); without a token the controller starts only with
`controller.insecure_no_auth: true`. Every error is a 4xx JSON body {"detail": "what is wrong and what to
fix", "errors": [...]}; reads are plain JSON.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path as FsPath
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller import datasets as ds
from controller import ledger, store
from controller.metrics import LatencyMiddleware
from controller.store import ApiError
from shared.auth import BearerAuth, RefuseControlChars, check_auth_setting, token_matches

log = logging.getLogger("jetrl.controller.api")

RUN_ID = r"^[A-Za-z0-9_-]{1,64}$"  # pydantic-core (Rust regex): `$` is the end of the text
OPEN_PATHS = ("/v1/health", "/", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")  # + /static/
DASHBOARD = FsPath(__file__).parent / "dashboard"


class ErrorBody(BaseModel):
    detail: str = Field(description="What is wrong and what to fix.")
    errors: list[dict[str, Any]] = Field(default_factory=list, description="Per-row or per-field problems.")


ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422, 503)}


class PathDataset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="A JSONL or Parquet file on the controller's host.", min_length=1, max_length=4096)
    name: str = Field("", max_length=256, description="Display name ('' = the file name).")
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    mapping: ds.FieldMapping = Field(default_factory=ds.FieldMapping)


class HfDataset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Hub id (gsm8k), a local dataset dir, or a builder (json, parquet) with data_files.",
                      min_length=1, max_length=512)
    split: str = Field("train", min_length=1, max_length=128)
    subset: str | None = Field(None, max_length=128, description="Dataset config name (e.g. 'main' for gsm8k).")
    data_files: list[str] | None = Field(None, max_length=1000)
    revision: str | None = Field(None, max_length=128)
    display_name: str = Field("", max_length=256)
    mapping: ds.FieldMapping = Field(default_factory=ds.FieldMapping)


class EnqueueRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str = Field(description="Dataset id, content hash (prefix of >= 8) or name.", min_length=1, max_length=128)
    epochs: int = Field(1, ge=1, le=10_000)
    shuffle_seed: int | None = Field(None, ge=0, le=2**31 - 1, description="Shuffle rows per epoch (None = file order).")
    limit: int | None = Field(None, ge=1, le=2**31 - 1, description="Use only the first N rows of the dataset.")


bearer = HTTPBearer(auto_error=False, description="controller.token")


def make_app(ctl) -> FastAPI:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await ctl.start()
        yield
        await ctl.close()

    app = FastAPI(title="jetrl controller", version="1", lifespan=lifespan,
                  description="Datasets, runs, admission-controlled prompt release, and run telemetry.")
    app.state.ctl = ctl
    install_error_handlers(app)
    token = ctl.ccfg.secret("token")
    check_auth_setting(token, ctl.ccfg.insecure_no_auth, "controller", "the controller")
    # Checked on the raw request, before any body is read (a dependency would run after form parsing).
    app.add_middleware(RefuseControlChars)
    app.add_middleware(BearerAuth, tokens=lambda _kind: [token], open_paths=OPEN_PATHS, open_prefixes=("/static/",),
                       wrong_status=401,
                       realm="jetrl controller")
    app.add_middleware(LatencyMiddleware, metrics=ctl.metrics)  # outermost: refusals are timed too

    def documented_auth(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        """Only puts the bearer scheme into the OpenAPI spec: BearerAuth has checked the token already."""

    v1 = APIRouter(prefix="/v1", responses=ERRORS)
    write = [Depends(documented_auth)]
    read = [Depends(documented_auth)]

    # --- datasets -----------------------------------------------------------------------------
    def _normalize(path: FsPath, fmt: str, filename: str, mapping: ds.FieldMapping, name: str, source: str,
                   ref: str) -> tuple[dict, bool]:
        if fmt == "auto":
            fmt = ds.sniff_format(path, filename)
        if fmt == "parquet":
            rows, unit = ds.read_parquet(path), "row"
        else:
            rows, unit = ds.read_jsonl(path, ctl.ccfg.max_line_kb * 1024), "line"
        norm = ds.normalize(rows, mapping, ctl.data_dir / "datasets", max_errors=ctl.ccfg.max_errors,
                            max_row_bytes=ctl.ccfg.max_line_kb * 1024, unit=unit)
        return store.register_dataset(ctl.Session, norm, name, source, ref, fmt)

    def _reply(d: dict, created: bool) -> JSONResponse:
        return JSONResponse(dict(d, created=created), status_code=201 if created else 200)

    @v1.post("/datasets", dependencies=write, status_code=201, summary="Register a dataset by upload",
             operation_id="uploadDataset", openapi_extra=_links({"getDataset": {"dataset": "$response.body#/id"}}))
    def upload_dataset(file: UploadFile = File(description="JSONL (one JSON object per line) or Parquet."),
                       name: str = Form("", max_length=256), format: Literal["auto", "jsonl", "parquet"] = Form("auto"),
                       mapping: str = Form("", max_length=100_000,
                                           description='Field mapping as JSON, e.g. {"prompt": "question"}')):
        fm = _parse_mapping(mapping)
        limit = ctl.ccfg.max_upload_mb * 1024 * 1024
        tmp = ctl.data_dir / "uploads" / f"{uuid.uuid4().hex}.part"
        try:
            size = 0
            with open(tmp, "wb") as out:
                while chunk := file.file.read(1 << 20):
                    size += len(chunk)
                    if size > limit:
                        raise ApiError(413, f"upload is over {ctl.ccfg.max_upload_mb} MiB (controller.max_upload_mb): "
                                            f"raise the limit or register the file by server-side path")
                    out.write(chunk)
            fname = file.filename or "upload"
            return _reply(*_normalize(tmp, format, fname, fm, name or fname, "upload", fname))
        finally:
            tmp.unlink(missing_ok=True)

    @v1.post("/datasets/path", dependencies=write, status_code=201, summary="Register a dataset by server-side path",
             operation_id="registerDatasetPath", openapi_extra=_links({"getDataset": {"dataset": "$response.body#/id"}}))
    def path_dataset(req: PathDataset):
        p = ds.confine(req.path, ctl.ccfg.path_roots)  # first: outside the roots nothing is looked at
        try:
            ok = p.is_file() and os.access(p, os.R_OK)
        except OSError:
            ok = False
        if not ok:
            raise ApiError(404, f"{req.path!r} is not a readable file on the controller's host")
        if p.stat().st_size > ctl.ccfg.max_upload_mb * 1024 * 1024:
            raise ApiError(413, f"{str(p)!r} is over {ctl.ccfg.max_upload_mb} MiB (controller.max_upload_mb)")
        return _reply(*_normalize(p, req.format, p.name, req.mapping, req.name or p.name, "path", str(p)))

    @v1.post("/datasets/hf", dependencies=write, status_code=201, summary="Register a Hugging Face dataset")
    def hf_dataset(req: HfDataset):
        cache = ctl.ccfg.hf_cache_dir or str(ctl.data_dir / "hf-cache")
        name, data_files = ds.check_hf_source(req.name, req.data_files, ctl.ccfg.path_roots)
        rows = ds.read_hf(name, req.split, req.subset, data_files, req.revision, cache)
        norm = ds.normalize(rows, req.mapping, ctl.data_dir / "datasets", max_errors=ctl.ccfg.max_errors,
                            max_row_bytes=ctl.ccfg.max_line_kb * 1024, unit="row")
        ref = f"hf:{req.name}" + (f"/{req.subset}" if req.subset else "") + f"[{req.split}]"
        return _reply(*store.register_dataset(ctl.Session, norm, req.display_name or ref, "hf", ref, "hf"))

    @v1.get("/datasets", summary="List datasets", dependencies=read)
    def list_datasets(limit: int = Query(100, ge=1, le=10_000)) -> list[dict[str, Any]]:
        from sqlalchemy import select

        from controller.db import Dataset

        with ctl.Session() as s:
            return [store.dataset_dict(d) for d in s.scalars(select(Dataset).order_by(Dataset.id).limit(limit))]

    @v1.get("/datasets/{dataset}", summary="One dataset (id, content hash or name)", dependencies=read,
            operation_id="getDataset")
    def get_dataset(dataset: str) -> dict[str, Any]:
        with ctl.Session() as s:
            return store.dataset_dict(store.find_dataset(s, dataset))

    # --- runs ---------------------------------------------------------------------------------
    run_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/JetrlConfig"}},
        "application/yaml": {"schema": {"type": "string", "description": "The same config as YAML"}},
    }}}

    run_id = {"run": "$response.body#/id"}
    run_links = _links({op: run_id for op in ("getRun", "enqueue", "listEnqueues", "pauseRun", "resumeRun", "stopRun",
                                              "runLedger", "runEvents", "runMetrics")})

    @v1.post("/runs", dependencies=write, status_code=201, summary="Create a run from a config (JSON or YAML)",
             operation_id="createRun", openapi_extra={**run_body, **run_links})
    async def create_run(request: Request):
        body = await _read_limited(request, 1 << 20, "run config is over 1 MiB")
        ctype = request.headers.get("content-type", "application/json").lower()
        cfg = store.parse_run_config(body, ctype)
        run, created = await run_in_threadpool(store.create_run, ctl.Session, cfg)
        ctl.run_changed(cfg.run)
        return _reply(run, created)

    @v1.get("/schema/run-config", summary="JSON schema of a run config", dependencies=read)
    def run_config_schema() -> dict[str, Any]:
        from shared.config import JetrlConfig

        return JetrlConfig.model_json_schema()

    @v1.get("/runs", summary="List runs", dependencies=read)
    def list_runs() -> list[dict[str, Any]]:
        from sqlalchemy import select

        from controller.db import Run

        with ctl.Session() as s:
            return [store.run_dict(s, r) for r in s.scalars(select(Run).order_by(Run.created_at))]

    @v1.get("/runs/{run}", summary="Run status, admission bound and ledger summary", dependencies=read,
            operation_id="getRun")
    def get_run(run: str = _run_path()) -> dict[str, Any]:
        with ctl.Session() as s:
            return store.run_dict(s, store.get_run(s, run))

    def _action(action: str):
        def handler(run: str = _run_path()) -> dict[str, Any]:
            out = store.set_status(ctl.Session, run, action)
            ctl.run_changed(run)
            return out

        handler.__name__ = f"{action}_run"
        return handler

    for action in ("pause", "resume", "stop"):
        v1.post(f"/runs/{{run}}/{action}", dependencies=write, summary=f"{action.capitalize()} a run",
                operation_id=f"{action}Run", openapi_extra=_links({"getRun": run_id}, "200"))(_action(action))

    @v1.post("/runs/{run}/enqueues", dependencies=write, status_code=201, summary="Enqueue a dataset into a run",
             operation_id="enqueue", openapi_extra=_links({"listEnqueues": {"run": "$response.body#/run"},
                                                           "runLedger": {"run": "$response.body#/run"}}))
    def enqueue(req: EnqueueRequest, run: str = _run_path()):
        out, created = store.enqueue(ctl.Session, run, req.dataset, req.epochs, req.shuffle_seed, req.limit)
        ctl.run_changed(run)
        return _reply(out, created)

    @v1.get("/runs/{run}/enqueues", summary="Enqueues of a run and how far each is released", dependencies=read,
            operation_id="listEnqueues")
    def list_enqueues(run: str = _run_path()) -> list[dict[str, Any]]:
        from sqlalchemy import select

        from controller.db import Enqueue

        with ctl.Session() as s:
            store.get_run(s, run)
            return [store.enqueue_dict(e) for e in s.scalars(select(Enqueue).where(Enqueue.run_id == run).order_by(Enqueue.id))]

    # --- reads --------------------------------------------------------------------------------
    @v1.get("/runs/{run}/versions", summary="Weight versions announced on the bus", dependencies=read)
    def versions(run: str = _run_path()) -> list[dict[str, Any]]:
        with ctl.Session() as s:
            store.get_run(s, run)
            return store.versions(s, run)

    @v1.get("/runs/{run}/metrics", summary="Metric series {service.name: [[x, value], ...]}", dependencies=read,
            operation_id="runMetrics", response_model=dict[str, list[list[float]]])
    def metrics(run: str = _run_path(), name: list[str] = Query([], max_length=100),
                limit: int = Query(20_000, ge=1, le=200_000)) -> Response:
        with ctl.Session() as s:
            store.get_run(s, run)
            series = store.metric_series(s, run, name, limit)
        # The dashboard reads up to 20,000 points every 2 s: encoded directly, not validated point by point
        # against the response model (the same JSON; docs/benchmarks.md, "Observability overhead").
        return JSONResponse(series)

    @v1.get("/runs/{run}/staleness", summary="Staleness histogram of trained samples", dependencies=read)
    def staleness(run: str = _run_path(), last: int = Query(0, ge=0, le=1_000_000)) -> dict[str, int]:
        with ctl.Session() as s:
            store.get_run(s, run)
            return store.staleness_hist(s, run, last)

    @v1.get("/runs/{run}/timings", summary="Per-version stage timings: trainer, rollout, weight fetch/swap",
            dependencies=read)
    def stage_timings(run: str = _run_path(), last: int = Query(0, ge=0, le=1_000_000,
                                                                 description="Only the last N steps (0 = all).")
                      ) -> dict[str, Any]:
        with ctl.Session() as s:
            store.get_run(s, run)
            return store.stage_timings(s, run, last)

    @v1.get("/runs/{run}/rollouts", summary="Trajectory groups, newest first, read from the TRAJECTORIES stream",
            dependencies=read, operation_id="runRollouts")
    async def rollouts(run: str = _run_path(),
                       version: int | None = Query(None, ge=-1, le=2**31 - 1,
                                                   description="Only groups whose newest token version is this."),
                       prompt: str | None = Query(None, min_length=1, max_length=128, description="Only this prompt id."),
                       min_reward: float | None = Query(None, ge=-1e9, le=1e9, description="Only samples >= this."),
                       max_reward: float | None = Query(None, ge=-1e9, le=1e9, description="Only samples <= this."),
                       before: int | None = Query(None, ge=1, le=2**62,
                                                  description="Cursor: stream sequence to read below (next_before)."),
                       limit: int = Query(20, ge=1, le=100, description="Groups per page."),
                       scan: int = Query(1000, ge=1, le=10_000, description="Messages read at most for this page.")
                       ) -> dict[str, Any]:
        from controller.rollouts import RolloutQuery, read_page

        def model_cfg() -> dict:
            with ctl.Session() as s:
                return dict(store.get_run(s, run).config.get("model") or {})

        mcfg = await run_in_threadpool(model_cfg)
        if min_reward is not None and max_reward is not None and min_reward > max_reward:
            raise ApiError(422, f"min_reward {min_reward} is above max_reward {max_reward}: swap them")
        if not ctl.ready:
            raise ApiError(503, f"the controller is not connected to NATS yet ({ctl.nats_state}); retry shortly")
        q = RolloutQuery(version=version, prompt=prompt, min_reward=min_reward, max_reward=max_reward, before=before,
                         limit=limit, scan=scan)
        return await read_page(ctl.js, run, q, mcfg, ctl.tokenizers, run_in_threadpool)

    @v1.get("/runs/{run}/events", summary="Events seen on the bus (after id, oldest first)", dependencies=read,
            operation_id="runEvents")
    def events(run: str = _run_path(), kind: str | None = Query(None, max_length=64),
               service: str | None = Query(None, max_length=64), after: int = Query(0, ge=0, le=2**62),
               limit: int = Query(200, ge=1, le=10_000)) -> list[dict[str, Any]]:
        with ctl.Session() as s:
            store.get_run(s, run)
            return store.events(s, run, kind, service, after, limit)

    @v1.get("/runs/{run}/ledger", summary="Where every released group stands", dependencies=read,
            operation_id="runLedger")
    def ledger_summary(run: str = _run_path()) -> dict[str, Any]:
        with ctl.Session() as s:
            r = store.get_run(s, run)
            d = store.run_dict(s, r)
            out = dict(ledger.summary(s, run), admission_bound=d["admission_bound"],
                       current_version=r.current_version, enqueued=d["enqueued"])
            return out

    @v1.get("/runs/{run}/queues", summary="Queue depths on the bus (prompts, trajectories, dead letters)", dependencies=read)
    async def queues(run: str = _run_path()) -> dict[str, Any]:
        def check():
            with ctl.Session() as s:
                store.get_run(s, run)

        await run_in_threadpool(check)
        return await ctl.queue_depths(run)

    @v1.get("/health", summary="Controller health and every service seen on the bus")
    def health(request: Request) -> dict[str, Any]:
        """Open (for probes); the services seen on the bus only for a caller with the token."""
        db = "ok"
        services: list = []
        try:
            with ctl.Session() as s:
                services = store.health(s, stale_after_s=3 * ctl.cfg.telemetry.events_interval_s + 5)
        except Exception as exc:
            db = f"{type(exc).__name__}: {exc}"
        if token and not token_matches(request.headers.get("authorization", ""), token):
            services = []
        return {"status": "ok" if db == "ok" and ctl.ready else "degraded", "database": db, "nats": ctl.nats_state,
                "services": services}

    app.include_router(v1)
    _document_run_config(app)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics():
        """Prometheus text format (controller/metrics.py); needs the token like /v1 (bearer_token_file in a
        scrape config). The ledger figures are read from the database, off the event loop."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        body = await run_in_threadpool(generate_latest, ctl.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    def dashboard():
        return FileResponse(DASHBOARD / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=DASHBOARD), name="static")
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


def _links(targets: dict[str, dict[str, str]], *statuses: str) -> dict:
    """OpenAPI links from a response to the operations that take its ids (schemathesis' stateful tests
    follow them): {operationId: {parameter: runtime expression}}, on 201 and 200 by default."""
    links = {op: {"operationId": op, "parameters": params} for op, params in targets.items()}
    return {"responses": {st: {"description": "Created" if st == "201" else "OK", "links": links}
                          for st in (statuses or ("201", "200"))}}


async def _read_limited(request: Request, limit: int, message: str) -> bytes:
    """The request body, refused with 413 as soon as it (or its Content-Length) passes `limit`."""
    n = request.headers.get("content-length")
    if n is not None and (not n.isdigit() or int(n) > limit):
        raise ApiError(413, message)
    out = bytearray()
    async for chunk in request.stream():
        out += chunk
        if len(out) > limit:
            raise ApiError(413, message)
    return bytes(out)


def _run_path():
    from fastapi import Path

    return Path(pattern=RUN_ID, description="Run id (A-Z a-z 0-9 _ -, 1-64 characters).")


def _parse_mapping(text: str) -> ds.FieldMapping:
    if not text.strip():
        return ds.FieldMapping()
    try:
        return ds.FieldMapping.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ApiError(422, f'mapping is not valid JSON ({exc.msg}): send e.g. {{"prompt": "question"}}') from None
    except ValidationError as exc:
        e = exc.errors()[0]
        field = ".".join(str(p) for p in e["loc"]) or "mapping"
        raise ApiError(422, f"mapping.{field}: {e['msg']} (keys: prompt, messages, reference, metadata)") from None


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

