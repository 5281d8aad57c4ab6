"""The reward service: a NATS micro service on `jetrl.reward.<task>` in queue group `jetrl-reward`.

Replicas of the same task share the load (NATS picks one member of the queue group per request) and
are discoverable with `$SRV.PING.jetrl-reward` / `$SRV.STATS.jetrl-reward` (nats-py's micro
framework). Each request is scored as a task of its own, at most `concurrency` at once; the reply is
always a RewardResult, even for a request that is not one (docs/protocol.md, docs/reward.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from typing import Any

from nats.aio.client import Client as NATS
from nats.micro import add_service
from nats.micro.request import Request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from reward_service.engine import ScoringEngine, error_result
from shared import __version__
from shared.config import JetrlConfig
from shared.contract import bus, codec, subjects
from shared.contract.bus import EventPublisher
from shared.contract.messages import RewardResult

log = logging.getLogger("jetrl.reward.service")

SERVICE_NAME = "jetrl-reward"


class RewardMetrics:
    """Prometheus metrics of one service (a private registry, so several can live in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("jetrl_reward_requests", "Reward requests answered", ["task", "outcome"], registry=r)
        self.completions = Counter("jetrl_reward_completions", "Completions scored", ["task"], registry=r)
        self.errors = Counter("jetrl_reward_completion_errors", "Completions scored with an error", ["task"],
                              registry=r)
        self.latency = Histogram("jetrl_reward_request_seconds", "Time to score one request", ["task"],
                                 buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30), registry=r)
        # sum of rewards (mean = this / completions): one update per request, not per completion
        self.reward_sum = Counter("jetrl_reward_value_sum", "Sum of rewards given", ["task"], registry=r)
        self.in_flight = Gauge("jetrl_reward_in_flight", "Requests being scored", ["task"], registry=r)
        # the LLM judge (reward_service/judge): each criterion's score (mean = sum / count) and its calls
        self.criterion_sum = Counter("jetrl_reward_criterion_sum", "Sum of a judge criterion's scores",
                                     ["task", "criterion"], registry=r)
        self.criterion_count = Counter("jetrl_reward_criterion_count", "Completions a judge criterion scored",
                                       ["task", "criterion"], registry=r)
        self.judge = Gauge("jetrl_reward_judge", "Judge counters: calls, cache_hits, retries, unparseable, "
                           "unavailable", ["task", "counter"], registry=r)


class RewardService:
    """One replica. `await start()`, then it answers until `await stop()`."""

    def __init__(self, nc: NATS, cfg: JetrlConfig, task: str | None = None, concurrency: int | None = None,
                 js: Any = None, instance: str | None = None, metrics: RewardMetrics | None = None):
        self.nc, self.cfg = nc, cfg
        self.task = subjects.check_token(task or cfg.reward.task, "reward task")
        self.subject = subjects.reward(self.task)
        self.concurrency = concurrency or cfg.reward.concurrency
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}-{self.task}"
        self.engine = ScoringEngine(cfg.reward, self.task)
        self.metrics = metrics or RewardMetrics()
        self.events = EventPublisher(js, nc, cfg.run, "reward", self.instance) if js is not None else None
        self._sem = asyncio.Semaphore(self.concurrency)
        self._tasks: set[asyncio.Task] = set()
        self._svc = None
        self._health: asyncio.Task | None = None
        self._follow: asyncio.Task | None = None  # reward.judge.follow_policy
        self.js = js
        # The health loop stops on this event, not on cancel() alone: on Python 3.11 a cancel that lands
        # while nats-py's request (asyncio.wait_for) completes is swallowed, and the loop would run on.
        self._stopping = asyncio.Event()
        self.handled = 0
        self.started_at = time.time()

    async def start(self) -> None:
        await self.engine.start()
        self._svc = await add_service(self.nc, name=SERVICE_NAME, version=__version__,
                                      queue_group=subjects.REWARD_QUEUE_GROUP, description="jetrl reward scoring",
                                      metadata={"task": self.task, "instance": self.instance})
        await self._svc.add_endpoint(name=self.task, subject=self.subject, handler=self._on_request,
                                     queue_group=subjects.REWARD_QUEUE_GROUP, metadata={"task": self.task})
        await bus.flush(self.nc)  # the endpoint is registered before we say so
        judge = self.engine.judge
        if judge is not None and self.cfg.reward.judge.follow_policy:
            from reward_service.judge.follow import follow_run

            if self.js is None:
                raise ValueError("reward.judge.follow_policy needs JetStream (the weights KV)")
            self._follow = asyncio.create_task(follow_run(judge, self.js, self.cfg))
        if self.events is not None:
            self._health = asyncio.create_task(self._health_loop())
        log.info("reward service %s answering %s (queue %s, concurrency %d)", self.instance, self.subject,
                 subjects.REWARD_QUEUE_GROUP, self.concurrency)

    async def _on_request(self, req: Request) -> None:
        # Called in order by the subscription; scoring runs as its own task so requests overlap.
        await self._sem.acquire()
        self.metrics.in_flight.labels(self.task).inc()
        t = asyncio.create_task(self._process(req))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _process(self, req: Request) -> None:
        t0 = time.perf_counter()
        try:
            result = await self.engine.handle(req.data)
            result.extra["instance"] = self.instance
            try:
                data = codec.encode(result)
                if len(data) > self.nc.max_payload:
                    raise codec.MessageTooLarge("RewardResult", len(data), self.nc.max_payload, self.subject)
            except (codec.MessageTooLarge, TypeError, ValueError) as exc:  # e.g. a scorer's metrics
                result = error_result(result.task, result.request_id, len(result.rewards),
                                      f"the result could not be sent: {exc}")
                result.extra["instance"] = self.instance
                data = codec.encode(result)
            await req.respond(data)
            self._count(result, time.perf_counter() - t0)
        except Exception:
            log.exception("answering a reward request failed")
        finally:
            self.metrics.in_flight.labels(self.task).dec()
            self._sem.release()

    def _count(self, result: RewardResult, elapsed: float) -> None:
        self.handled += 1
        m = self.metrics
        m.requests.labels(self.task, "error" if result.error else "ok").inc()
        m.latency.labels(self.task).observe(elapsed)
        m.completions.labels(self.task).inc(len(result.rewards))
        n_err = sum(1 for e in result.errors if e)
        if n_err:
            m.errors.labels(self.task).inc(n_err)
        total = sum(result.rewards)
        if total > 0:
            m.reward_sum.labels(self.task).inc(total)
        judge = self.engine.judge
        if judge is not None:
            for metrics in result.metrics:
                for k, v in metrics.items():
                    if k.startswith(("criterion/", "pairwise/win_rate")):
                        name = k.split("/", 1)[1] if k.startswith("criterion/") else "win_rate"
                        m.criterion_sum.labels(self.task, name).inc(max(float(v), 0.0))
                        m.criterion_count.labels(self.task, name).inc()
            for k, v in judge.stats.items():
                m.judge.labels(self.task, k).set(v)

    async def _events_stream_ready(self) -> bool:
        try:
            await self.events.js.stream_info(subjects.EVENTS_STREAM)
            return True
        except Exception:
            return False

    async def _pause(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.cfg.telemetry.events_interval_s)

    async def _health_loop(self) -> None:
        warned = False
        while not self._stopping.is_set():
            if not await self._events_stream_ready():
                if not warned:
                    log.warning("stream %s does not exist (yet): health events are off until it does",
                                subjects.EVENTS_STREAM)
                    warned = True
                await self._pause()
                continue
            await self.events.emit("health", {"status": "ok", "instance": self.instance, "task": self.task,
                                              "handled": self.handled, "in_flight": len(self._tasks),
                                              "pool_restarts": self.engine.pool_restarts,
                                              **({"judge": dict(self.engine.judge.stats)}
                                                 if self.engine.judge is not None else {}),
                                              "uptime_s": round(time.time() - self.started_at, 1)})
            await self._pause()

    async def stop(self, drain_s: float = 10.0) -> None:
        """Stop taking requests, let the ones in flight finish (up to drain_s), release the pool."""
        self._stopping.set()
        if self._follow is not None:
            self._follow.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._follow
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(self._health, timeout=10.0)
        if self._svc is not None:
            # nats-py's subscription drain (inside micro's stop) can wait forever for a pending-message
            # count that never reaches zero; bound it; closing the connection drops the subscriptions.
            try:
                await asyncio.wait_for(self._svc.stop(), timeout=5.0)
            except asyncio.TimeoutError:
                log.warning("reward service %s: unsubscribing took over 5 s; closing anyway", self.instance)
            except Exception as exc:
                log.warning("reward service %s: stop failed (%s); closing anyway", self.instance, exc)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=drain_s)
        await self.engine.close()


async def serve(cfg: JetrlConfig, task: str | None = None, concurrency: int | None = None,
                stop: asyncio.Event | None = None) -> None:
    """`jetrl reward serve`: connect, serve until SIGTERM/SIGINT (or `stop`), drain and exit."""
    import signal

    from shared.contract import bus
    from shared.runtime.telemetry import start_metrics

    nc = await bus.connect(cfg.nats, name=f"reward-{task or cfg.reward.task}")
    svc = RewardService(nc, cfg, task, concurrency, js=nc.jetstream())
    start_metrics(cfg.telemetry, svc.metrics.registry)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Not on Windows, nor outside the main thread (tests): the caller stops it there.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await svc.start()
        await stop.wait()
    finally:
        await svc.stop()
        await nc.drain()
