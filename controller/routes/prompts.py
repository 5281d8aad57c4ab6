"""Prompt memory views: how a run's prompts fare (classes, solve-rate histograms, per version bucket, the
most sampled prompts, filtered groups by reason) and the same over every run on one dataset
(controller/prompt_stats.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from controller import prompt_stats, store
from controller.routes.common import ERRORS, run_path
from controller.routes.deps import READ, Ctl

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/runs/{run}/prompts/stats", dependencies=READ, operation_id="runPromptStats",
            summary="Prompt memory of a run: classes, solve-rate histograms per version, most sampled prompts")
def run_prompt_stats(ctl: Ctl, run: str = run_path(),
                     limit: int = Query(20, ge=0, le=1000, description="How many of the most sampled prompts."),
                     buckets: int = Query(8, ge=1, le=100, description="Version buckets of `by_version`.")
                     ) -> dict[str, Any]:
    with ctl.Session() as s:
        store.get_run(s, run)
        return prompt_stats.run_stats(s, run, limit, buckets)


@router.get("/datasets/{dataset}/prompts/stats", dependencies=READ, operation_id="datasetPromptStats",
            summary="Prompt memory of a dataset over every run: classes, solve-rate histogram, most sampled prompts")
def dataset_prompt_stats(ctl: Ctl, dataset: str,
                         limit: int = Query(20, ge=0, le=1000, description="How many of the most sampled prompts.")
                         ) -> dict[str, Any]:
    with ctl.Session() as s:
        return prompt_stats.dataset_stats(s, store.find_dataset(s, dataset), limit)
