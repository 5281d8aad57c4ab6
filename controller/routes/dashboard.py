"""The live dashboard: GET / (index.html) is open, like the /static/ files it loads (app.js, the vendored
uPlot; make_app mounts DASHBOARD there); the page reads /v1 with the token given in its URL fragment
(/#token=...), which browsers never send to the server."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

DASHBOARD = Path(__file__).parent.parent / "dashboard"

router = APIRouter()


@router.get("/", include_in_schema=False)
def dashboard() -> FileResponse:
    return FileResponse(DASHBOARD / "index.html", media_type="text/html")
