"""The tracker sink: ordered (ephemeral, unacked) consumers on the run's EVENTS and TRAJECTORIES
subjects, so it changes nothing for the trainer, the workers or the controller's durable consumers; each
message becomes scalars (tracker/scalars.py) written to one tracker (tracker/writers.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.js import api
from prometheus_client import CollectorRegistry, Counter

from shared.config import JetrlConfig
from shared.contract import bus, codec, subjects
from shared.contract.messages import Event, TrajectoryGroup
from tracker.scalars import RolloutStats, WorkerGauges, event_scalars

log = logging.getLogger("jetrl.track")


class TrackerSink:
    def __init__(self, cfg: JetrlConfig, writer):
        self.cfg, self.writer = cfg, writer
        self.rollouts = RolloutStats()
        self.gauges = WorkerGauges()
        self.version = 0  # newest trainer version seen: the x of per-worker gauges
        self.last_message = time.monotonic()
        self.registry = CollectorRegistry()
        self.messages = Counter("jetrl_track_messages", "Bus messages read by the tracker sink.", ["stream"],
                                registry=self.registry)
        self.errors = Counter("jetrl_track_decode_errors", "Messages the sink could not decode (skipped).",
                              ["stream"], registry=self.registry)
        self.written = Counter("jetrl_track_scalars", "Scalars written to the tracker.", registry=self.registry)

    def _write(self, version: int, scalars: dict[str, float]) -> None:
        if scalars:
            self.writer.write(version, scalars)
            self.written.inc(len(scalars))

    def on_event(self, ev: Event) -> None:
        if ev.service == "rollout" and ev.kind == "metrics":
            self._write(self.version, self.gauges.update(ev))
            return
        got = event_scalars(ev)
        if got is None:
            return
        version, scalars = got
        if ev.service == "trainer" and ev.kind == "step":
            self.version = max(self.version, version)
        self._write(version, scalars)

    def on_group(self, g: TrajectoryGroup) -> None:
        for version, scalars in self.rollouts.add(g):
            self._write(version, scalars)

    async def _consume(self, js, subject: str, kind: type, handle, stream: str) -> object:
        policy = api.DeliverPolicy.ALL if self.cfg.tracking.from_start else api.DeliverPolicy.NEW

        async def cb(msg) -> None:
            self.last_message = time.monotonic()
            self.messages.labels(stream).inc()
            try:
                obj = codec.decode(msg.data, kind)
            except codec.DecodeError as exc:
                self.errors.labels(stream).inc()
                log.warning("skipping an undecodable message on %s: %s", msg.subject, exc)
                return
            handle(obj)

        return await js.subscribe(subject, cb=cb, ordered_consumer=True, deliver_policy=policy)

    async def run(self, stop: asyncio.Event, until_idle_s: float = 0.0) -> None:
        """Until `stop` is set (or, with `until_idle_s`, nothing arrived for that long); then the
        rollout figures still open are written and the tracker closed."""
        nc = await bus.connect(self.cfg.nats, name="jetrl-track")
        subs = []
        try:
            js = nc.jetstream()
            await bus.ensure_streams(js, self.cfg.streams)
            run = self.cfg.run
            subs.append(await self._consume(js, subjects.events_all(run), Event, self.on_event, "events"))
            subs.append(await self._consume(js, subjects.trajectories(run), TrajectoryGroup, self.on_group,
                                            "trajectories"))
            log.info("tracking run %s -> %s", run, type(self.writer).__name__)
            every = self.cfg.tracking.flush_every_s
            while not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(every, until_idle_s or every))
                self.writer.flush()
                if until_idle_s and time.monotonic() - self.last_message >= until_idle_s:
                    break
        finally:
            for s in subs:
                with contextlib.suppress(Exception):
                    await s.unsubscribe()
            for version, scalars in self.rollouts.flush():
                self._write(version, scalars)
            self.writer.close()
            with contextlib.suppress(Exception):
                await nc.close()
