"""What several route modules share: the documented error responses, the run-id path parameter, OpenAPI
links between operations, and the reply of a create that may find its object already there."""

from __future__ import annotations

from typing import Any

from fastapi import Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

RUN_ID = r"^[A-Za-z0-9_-]{1,64}$"  # pydantic-core (Rust regex): `$` is the end of the text


class ErrorBody(BaseModel):
    detail: str = Field(description="What is wrong and what to fix.")
    errors: list[dict[str, Any]] = Field(default_factory=list, description="Per-row or per-field problems.")


ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody}
                                           for code in (400, 401, 403, 404, 409, 413, 415, 422, 503)}


def run_path() -> Any:
    return Path(pattern=RUN_ID, description="Run id (A-Z a-z 0-9 _ -, 1-64 characters).")


def links(targets: dict[str, dict[str, str]], *statuses: str) -> dict:
    """OpenAPI links from a response to the operations that take its ids (schemathesis' stateful tests
    follow them): {operationId: {parameter: runtime expression}}, on 201 and 200 by default."""
    out = {op: {"operationId": op, "parameters": params} for op, params in targets.items()}
    return {"responses": {st: {"description": "Created" if st == "201" else "OK", "links": out}
                          for st in (statuses or ("201", "200"))}}


def reply(d: dict, created: bool) -> JSONResponse:
    """201 with the new object, or 200 with the one that was already there (creates are idempotent)."""
    return JSONResponse(dict(d, created=created), status_code=201 if created else 200)
