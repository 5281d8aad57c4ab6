"""A run's "no learning signal" state: the trainer's "no_signal" events (docs/protocol.md, "Event kinds").

The trainer sends `{"active": true, "step", "since_step", "groups", "message"}` when its recent steps
trained only zero-advantage groups (or everything was filtered for want of signal), and `active: false`
when signal came back. The follower keeps the report with the highest step per run (`run_signal`; events
are stored concurrently, so arrival order is not step order); `GET /v1/runs/{run}`, `jetrl status` and
the dashboard show it.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from controller.db import RunSignal, now, upsert


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31 else None


def printable(text: str) -> str:
    """The message without control characters (it is printed by `jetrl status` on a terminal)."""
    return "".join(c if c.isprintable() else " " for c in text)


def record(s: Session, run_id: str, data: dict) -> None:
    """Keep this report unless one of a later step is already kept (in the caller's transaction)."""
    if not isinstance(data.get("active"), bool):
        return
    row = dict(run_id=run_id, no_signal=data["active"], step=_int(data.get("step")) or 0,
               since_step=_int(data.get("since_step")), groups=_int(data.get("groups")),
               message=printable(str(data.get("message") or ""))[:2000], updated_at=now())
    t = RunSignal.__table__.c
    s.execute(upsert(s, RunSignal.__table__, [row], ["run_id"],
                     lambda ex: {k: getattr(ex, k) for k in row if k != "run_id"},
                     where=lambda ex: t.step <= ex.step))


def state(s: Session, run_id: str) -> dict:
    """{"no_signal", "since_step", "step", "groups", "message"} ({"no_signal": false, ...} before any report)."""
    r = s.get(RunSignal, run_id)
    if r is None:
        return {"no_signal": False, "since_step": None, "step": None, "groups": None, "message": ""}
    return {"no_signal": r.no_signal, "since_step": r.since_step if r.no_signal else None, "step": r.step,
            "groups": r.groups, "message": r.message if r.no_signal else ""}
