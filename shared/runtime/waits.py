"""What a service is waiting for, since when, and a deadline that turns a long wait into evidence.

A service sets its phase as it works (`Phase.enter("waiting for groups")`); its health event carries the
phase and since when (`Phase.report()`), and `Phase.overdue(deadline_s)` says, once per deadline passed,
that the current phase has lasted too long: the service then sends a `wait_deadline` event
(telemetry.wait_deadline_s). The controller's diagnosis (controller/diagnosis.py) reads both.
"""

from __future__ import annotations

import time

WAITING_FOR_WORK = "waiting for groups"  # a phase that waits on others' work: the diagnosis does not call it stuck


class Phase:
    def __init__(self, name: str = "starting"):
        self.name, self.since, self._reported, self.detail = name, time.time(), 0, ""

    def enter(self, name: str, detail: str = "") -> None:
        """Move to phase `name` (a no-op when already in it: its clock keeps running)."""
        if name != self.name:
            self.name, self.since, self._reported = name, time.time(), 0
        self.detail = detail

    def report(self) -> dict:
        """The health event fields: phase, phase_since."""
        return {"phase": self.name, "phase_since": self.since}

    def overdue(self, deadline_s: float, now: float | None = None) -> dict | None:
        """{"phase", "waited_s", "since"} the first time the phase passes each multiple of deadline_s, else None."""
        now = time.time() if now is None else now
        passed = int((now - self.since) // deadline_s)
        if passed <= self._reported:
            return None
        self._reported = passed
        return {"phase": self.name, "waited_s": round(now - self.since, 1), "since": self.since,
                "detail": self.detail}
