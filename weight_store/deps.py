"""What a route needs from the service, through FastAPI `Depends`: the `StoreState` and the token checks
(`READ`: the read or the write token, `WRITE`: the write token). `create_app` puts the state and the
tokens into `app.state`; the checks run before the route's code, so before it reads a body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from shared.runtime.auth import token_matches
from weight_store.state import StoreState
from weight_store.storage import StoreError


@dataclass(frozen=True)
class Tokens:
    write: str  # weights.token ('' only with weights.insecure_no_auth)
    read: str  # weights.read_token: reads only ('' = none)


async def get_store(request: Request) -> StoreState:
    return request.app.state.store


def check_token(request: Request, wanted: list[str]) -> None:
    """Pass when no token is wanted or the request carries one of `wanted` (constant-time compare)."""
    wanted = [w for w in wanted if w]
    if not wanted:
        return
    results = [token_matches(request.headers.get("authorization", ""), w) for w in wanted]
    if results[0] is None:
        raise StoreError(401, "unauthorized", "this request needs 'Authorization: Bearer <token>'")
    if not any(results):
        raise StoreError(403, "forbidden", "the bearer token is not valid for this request")


async def read_auth(request: Request) -> None:
    """Reads: the read token or the write token."""
    tokens: Tokens = request.app.state.tokens
    check_token(request, [tokens.write, tokens.read])


async def write_auth(request: Request) -> None:
    check_token(request, [request.app.state.tokens.write])


Store = Annotated[StoreState, Depends(get_store)]
READ = [Depends(read_auth)]
WRITE = [Depends(write_auth)]
