"""Runs: create one from a config (JSON or YAML), list them, read one, pause / resume / stop it, and the
JSON schema a run config follows. A write tells the Controller (`run_changed`) so its tasks follow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from controller import store
from controller.routes.common import ERRORS, links, reply, run_path
from controller.routes.deps import READ, WRITE, Ctl
from controller.store import ApiError

router = APIRouter(prefix="/v1", responses=ERRORS)

RUN_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/JetrlConfig"}},
    "application/yaml": {"schema": {"type": "string", "description": "The same config as YAML"}},
}}}
RUN_ID_LINK = {"run": "$response.body#/id"}
RUN_LINKS = links({op: RUN_ID_LINK for op in ("getRun", "enqueue", "listEnqueues", "pauseRun", "resumeRun", "stopRun",
                                              "runLedger", "runEvents", "runMetrics")})


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


@router.post("/runs", dependencies=WRITE, status_code=201, summary="Create a run from a config (JSON or YAML)",
             operation_id="createRun", openapi_extra={**RUN_BODY, **RUN_LINKS})
async def create_run(ctl: Ctl, request: Request):
    body = await _read_limited(request, 1 << 20, "run config is over 1 MiB")
    ctype = request.headers.get("content-type", "application/json").lower()
    cfg = store.parse_run_config(body, ctype)
    run, created = await run_in_threadpool(store.create_run, ctl.Session, cfg)
    ctl.run_changed(cfg.run)
    return reply(run, created)


@router.get("/schema/run-config", summary="JSON schema of a run config", dependencies=READ)
def run_config_schema() -> dict[str, Any]:
    from shared.config import JetrlConfig

    return JetrlConfig.model_json_schema()


@router.get("/runs", summary="List runs", dependencies=READ)
def list_runs(ctl: Ctl) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from controller.db import Run

    with ctl.Session() as s:
        return [store.run_dict(s, r) for r in s.scalars(select(Run).order_by(Run.created_at))]


@router.get("/runs/{run}", summary="Run status, admission bound and ledger summary", dependencies=READ,
            operation_id="getRun")
def get_run(ctl: Ctl, run: str = run_path()) -> dict[str, Any]:
    with ctl.Session() as s:
        return store.run_dict(s, store.get_run(s, run))


def _action(action: str) -> Callable[..., dict[str, Any]]:
    def handler(ctl: Ctl, run: str = run_path()) -> dict[str, Any]:
        out = store.set_status(ctl.Session, run, action)
        ctl.run_changed(run)
        return out

    handler.__name__ = f"{action}_run"  # the route's name, and so its operationId's
    return handler


for _verb in ("pause", "resume", "stop"):
    router.post(f"/runs/{{run}}/{_verb}", dependencies=WRITE, summary=f"{_verb.capitalize()} a run",
                operation_id=f"{_verb}Run", openapi_extra=links({"getRun": RUN_ID_LINK}, "200"))(_action(_verb))
