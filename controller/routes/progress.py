"""How a run's training goes, over its versions: the weight versions announced, metric series, the
staleness of trained samples and per-version stage timings (all from SQL, written by the RunFollower)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from controller import store
from controller.routes.common import ERRORS, run_path
from controller.routes.deps import READ, Ctl

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/runs/{run}/versions", summary="Weight versions announced on the bus", dependencies=READ)
def versions(ctl: Ctl, run: str = run_path()) -> list[dict[str, Any]]:
    with ctl.Session() as s:
        store.get_run(s, run)
        return store.versions(s, run)


@router.get("/runs/{run}/metrics", summary="Metric series {service.name: [[x, value], ...]}", dependencies=READ,
            operation_id="runMetrics", response_model=dict[str, list[list[float]]])
def metrics(ctl: Ctl, run: str = run_path(), name: list[str] = Query([], max_length=100),
            limit: int = Query(20_000, ge=1, le=200_000)) -> Response:
    with ctl.Session() as s:
        store.get_run(s, run)
        series = store.metric_series(s, run, name, limit)
    # The dashboard reads up to 20,000 points every 2 s: encoded directly, not validated point by point
    # against the response model (the same JSON; docs/benchmarks.md, "Observability overhead").
    return JSONResponse(series)


@router.get("/runs/{run}/staleness", summary="Staleness histogram of trained samples", dependencies=READ)
def staleness(ctl: Ctl, run: str = run_path(), last: int = Query(0, ge=0, le=1_000_000)) -> dict[str, int]:
    with ctl.Session() as s:
        store.get_run(s, run)
        return store.staleness_hist(s, run, last)


@router.get("/runs/{run}/timings", summary="Per-version stage timings: trainer, rollout, weight fetch/swap",
            dependencies=READ)
def stage_timings(ctl: Ctl, run: str = run_path(),
                  last: int = Query(0, ge=0, le=1_000_000, description="Only the last N steps (0 = all).")
                  ) -> dict[str, Any]:
    with ctl.Session() as s:
        store.get_run(s, run)
        return store.stage_timings(s, run, last)
