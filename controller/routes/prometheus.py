"""GET /metrics: the Prometheus text format (controller/metrics.py), outside /v1 and the OpenAPI spec;
it needs the token like /v1 (bearer_token_file in a scrape config)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from controller.routes.deps import Ctl

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(ctl: Ctl) -> Response:
    """The ledger figures are read from the database at scrape time: off the event loop."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    body = await run_in_threadpool(generate_latest, ctl.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
