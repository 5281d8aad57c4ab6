"""Is the store up: GET /healthz, open for probes and saying nothing about the host, and GET /metrics
(Prometheus), which needs a token like any read: run names are among its labels."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from weight_store.deps import READ, Store

router = APIRouter()


@router.get("/healthz")
async def healthz():  # unauthenticated (probes): says it is up, nothing about the host
    return {"status": "ok"}


@router.get("/metrics", dependencies=READ)
async def metrics(st: Store) -> Response:  # run names are labels: a read like any other (read or write token)
    return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)
