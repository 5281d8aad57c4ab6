"""The controller's "drain" events: every prompt of the run is released, train what is left.

controller/completion.py sends `{"group_ids": [...]}` on `jetrl.<run>.events.controller` (kind "drain")
while the trainer holds the run's last groups, fewer than a batch, with nothing else coming. The trainer
reads those events through an ephemeral ordered consumer (new events only: the controller repeats a drain
every few seconds while it lasts) and, once every named group is in its buffer or already decided, trains
the buffer as one smaller last batch (Intake.take_partial). docs/trainer.md, "The last batch".
"""

from __future__ import annotations

import logging

from nats.js import api

from shared.contract import codec, subjects
from shared.contract.messages import Event

log = logging.getLogger("jetrl.trainer.drain")


class DrainWatch:
    def __init__(self, run: str):
        self.run = run
        self.pending: set[str] | None = None  # the groups the last drain named (None: no drain heard)
        self._sub = None

    async def start(self, js) -> None:
        # the stream named: a lookup by subject would need $JS.API.STREAM.NAMES, which the trainer may not use
        self._sub = await js.subscribe(subjects.events(self.run, "controller"), stream=subjects.EVENTS_STREAM,
                                       cb=self._on_msg, ordered_consumer=True, deliver_policy=api.DeliverPolicy.NEW)

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection is closing anyway
                pass
            self._sub = None

    async def _on_msg(self, msg) -> None:
        try:
            ev = codec.decode(msg.data, Event)
        except codec.DecodeError as exc:
            log.warning("undecodable controller event skipped: %s", exc)
            return
        self.observe(ev)

    def observe(self, ev: Event) -> None:
        ids = ev.data.get("group_ids") if ev.kind == "drain" else None
        if isinstance(ids, list):
            self.pending = {str(g) for g in ids}

    def ready(self, held: set[str], decided) -> bool:
        """A drain was heard and every group it named is held (`held`) or decided already (`decided(gid)`),
        with at least one held."""
        if not self.pending or not held:
            return False
        return all(g in held or decided(g) for g in self.pending)

    def consumed(self) -> None:
        """The partial batch was formed: wait for the next drain (the controller repeats it while groups remain)."""
        self.pending = None
