"""Why a run is (not) advancing: GET /v1/runs/{run}/diagnosis (controller/diagnosis.py over evidence.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from controller import diagnosis, evidence
from controller.routes.common import ERRORS, run_path
from controller.routes.deps import READ, Ctl

router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/runs/{run}/diagnosis", dependencies=READ, operation_id="runDiagnosis",
            summary="Why the run is not advancing (or that it is), each cause with its evidence and what to do")
async def run_diagnosis(ctl: Ctl, run: str = run_path(),
                        with_evidence: bool = Query(False, alias="evidence",
                                                    description="Also return the whole evidence snapshot.")
                        ) -> dict[str, Any]:
    ev = await evidence.gather(ctl, run)
    out = diagnosis.diagnose(ev)
    out["run"] = run
    out["checked_at"] = ev["now"]
    if with_evidence:
        out["evidence"] = ev
    return out
