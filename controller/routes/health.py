"""GET /v1/health: open, for probes. It says whether the database and NATS are up; the services seen on
the bus (run, service, instance, last seen, alive) only to a caller that sends the token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from controller import store
from controller.routes.common import ERRORS
from controller.routes.deps import Ctl, Token
from shared.runtime.auth import token_matches

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/health", summary="Controller health and every service seen on the bus")
def health(ctl: Ctl, token: Token, request: Request) -> dict[str, Any]:
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
