"""The rollout viewer: a run's trajectory groups, newest first, read by sequence from the TRAJECTORIES
stream (controller/rollouts.py), not from SQL; so it needs the NATS connection and answers 503 without."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from controller import store
from controller.routes.common import ERRORS, run_path
from controller.routes.deps import READ, Ctl
from controller.store import ApiError

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/runs/{run}/rollouts", summary="Trajectory groups, newest first, read from the TRAJECTORIES stream",
            dependencies=READ, operation_id="runRollouts")
async def rollouts(ctl: Ctl, run: str = run_path(),
                   version: int | None = Query(None, ge=-1, le=2**31 - 1,
                                               description="Only groups whose newest token version is this."),
                   prompt: str | None = Query(None, min_length=1, max_length=128, description="Only this prompt id."),
                   min_reward: float | None = Query(None, ge=-1e9, le=1e9, description="Only samples >= this."),
                   max_reward: float | None = Query(None, ge=-1e9, le=1e9, description="Only samples <= this."),
                   before: int | None = Query(None, ge=1, le=2**62,
                                              description="Cursor: stream sequence to read below (next_before)."),
                   limit: int = Query(20, ge=1, le=100, description="Groups per page."),
                   scan: int = Query(1000, ge=1, le=10_000, description="Messages read at most for this page.")
                   ) -> dict[str, Any]:
    from controller.rollouts import RolloutQuery, read_page

    def model_cfg() -> dict:
        with ctl.Session() as s:
            return dict(store.get_run(s, run).config.get("model") or {})

    mcfg = await run_in_threadpool(model_cfg)
    if min_reward is not None and max_reward is not None and min_reward > max_reward:
        raise ApiError(422, f"min_reward {min_reward} is above max_reward {max_reward}: swap them")
    if not ctl.ready:
        raise ApiError(503, f"the controller is not connected to NATS yet ({ctl.nats_state}); retry shortly")
    q = RolloutQuery(version=version, prompt=prompt, min_reward=min_reward, max_reward=max_reward, before=before,
                     limit=limit, scan=scan)
    return await read_page(ctl.js, run, q, mcfg, ctl.tokenizers, run_in_threadpool)
