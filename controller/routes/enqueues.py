"""Enqueues: put a dataset (some epochs, optionally shuffled or cut) into a run's release queue, and list
a run's enqueues with how far each has been released."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from controller import store
from controller.routes.common import ERRORS, links, reply, run_path
from controller.routes.deps import READ, WRITE, Ctl

router = APIRouter(prefix="/v1", responses=ERRORS)


class EnqueueRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str = Field(description="Dataset id, content hash (prefix of >= 8) or name.", min_length=1, max_length=128)
    epochs: int = Field(1, ge=1, le=10_000)
    shuffle_seed: int | None = Field(None, ge=0, le=2**31 - 1, description="Shuffle rows per epoch (None = file order).")
    limit: int | None = Field(None, ge=1, le=2**31 - 1, description="Use only the first N rows of the dataset.")


@router.post("/runs/{run}/enqueues", dependencies=WRITE, status_code=201, summary="Enqueue a dataset into a run",
             operation_id="enqueue", openapi_extra=links({"listEnqueues": {"run": "$response.body#/run"},
                                                          "runLedger": {"run": "$response.body#/run"}}))
def enqueue(ctl: Ctl, req: EnqueueRequest, run: str = run_path()):
    out, created = store.enqueue(ctl.Session, run, req.dataset, req.epochs, req.shuffle_seed, req.limit)
    ctl.run_changed(run)
    return reply(out, created)


@router.get("/runs/{run}/enqueues", summary="Enqueues of a run and how far each is released", dependencies=READ,
            operation_id="listEnqueues")
def list_enqueues(ctl: Ctl, run: str = run_path()) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from controller.db import Enqueue

    with ctl.Session() as s:
        store.get_run(s, run)
        return [store.enqueue_dict(e) for e in s.scalars(select(Enqueue).where(Enqueue.run_id == run).order_by(Enqueue.id))]
