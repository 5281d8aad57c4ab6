"""What a route needs from the service, through FastAPI `Depends`: the `Controller` and the API token,
which `make_app` puts into `app.state`. Routers are module-level objects; reading the state per request
instead of closing over it is what lets them be."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controller.service import Controller

bearer = HTTPBearer(auto_error=False, description="controller.token")


async def get_ctl(request: Request) -> Controller:
    """async: a plain function would cost every request a trip through the threadpool."""
    return request.app.state.ctl


async def get_token(request: Request) -> str:
    """controller.token as read at start-up ('' with controller.insecure_no_auth)."""
    return request.app.state.token


def documented_auth(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
    """Only puts the bearer scheme into the OpenAPI spec: BearerAuth has checked the token already."""


Ctl = Annotated[Controller, Depends(get_ctl)]
Token = Annotated[str, Depends(get_token)]
WRITE = [Depends(documented_auth)]  # writes and reads need the same token; the two names say which a route is
READ = [Depends(documented_auth)]
