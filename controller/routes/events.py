"""Where a run's work stands: the events seen on the bus, the ledger summary (where every released group
is) and the queue depths on the bus (prompts, trajectories, dead letters)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from controller import ledger, store
from controller.routes.common import ERRORS, run_path
from controller.routes.deps import READ, Ctl

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/runs/{run}/events", summary="Events seen on the bus (after id, oldest first)", dependencies=READ,
            operation_id="runEvents")
def events(ctl: Ctl, run: str = run_path(), kind: str | None = Query(None, max_length=64),
           service: str | None = Query(None, max_length=64), after: int = Query(0, ge=0, le=2**62),
           limit: int = Query(200, ge=1, le=10_000)) -> list[dict[str, Any]]:
    with ctl.Session() as s:
        store.get_run(s, run)
        return store.events(s, run, kind, service, after, limit)


@router.get("/runs/{run}/ledger", summary="Where every released group stands", dependencies=READ,
            operation_id="runLedger")
def ledger_summary(ctl: Ctl, run: str = run_path()) -> dict[str, Any]:
    with ctl.Session() as s:
        r = store.get_run(s, run)
        d = store.run_dict(s, r)
        return dict(ledger.summary(s, run), admission_bound=d["admission_bound"],
                    current_version=r.current_version, enqueued=d["enqueued"])


@router.get("/runs/{run}/queues", summary="Queue depths on the bus (prompts, trajectories, dead letters)",
            dependencies=READ)
async def queues(ctl: Ctl, run: str = run_path()) -> dict[str, Any]:
    def check() -> None:
        with ctl.Session() as s:
            store.get_run(s, run)

    await run_in_threadpool(check)
    return await ctl.queue_depths(run)
