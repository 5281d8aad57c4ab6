"""The rollout worker: prompt tasks in, scored trajectory groups out (`jetrl rollout -c CONFIG`).

    PROMPTS --(durable pull consumer, shared by every worker of the run)--> workflow.run(ctx, task)
        --> engine (generate) + reward client (score) + tools --> TrajectoryGroup --> TRAJECTORIES

Delivery: a prompt is acked only after JetStream acknowledged its trajectory group, published with
Nats-Msg-Id = group id; a worker that dies mid-task leaves its prompts unacked, JetStream redelivers
them to another worker after ack_wait, and a group published twice is deduplicated by its id. Heartbeats
(in-progress acks) keep long tasks from being redelivered. Weights: a WeightFollower swaps each
announced version into the engine while tasks run; no new prompt is fetched while the engine is more
than schedule.max_staleness versions behind the newest announcement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from dataclasses import replace
from typing import Any

from rollout_service.adaptive import RoundYield, sample_adaptively
from rollout_service.engines.base import EngineDead, PromptTooLong
from rollout_service.metrics import RolloutMetrics
from rollout_service.tools import ToolRegistry, build_tools
from rollout_service.weight_sync import WeightFollower, weight_store_source
from rollout_service.workflows import Workflow, WorkflowContext, load_workflow
from shared.config import JetrlConfig
from shared.contract import bus, consumer, subjects
from shared.contract.messages import PromptTask, TrajectoryGroup
from shared.runtime.telemetry import Rate, start_metrics
from shared.runtime.waits import Phase

log = logging.getLogger("jetrl.rollout")

SERVICE = "rollout"


def worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def shifted(task: PromptTask, count: int, offset: int) -> PromptTask:
    """The task for one more round of adaptive sampling: `count` samples, numbered from `offset` (a set
    sampling seed moves by the offset, so a round never repeats an earlier one's draws)."""
    sampling = dict(task.sampling) if isinstance(task.sampling, dict) else {}
    if offset and sampling.get("seed") is not None:
        sampling["seed"] = int(sampling["seed"]) + offset
    return replace(task, group_size=count, sampling=sampling)


def prompt_record(group: TrajectoryGroup, success_reward: float) -> dict[str, Any]:
    """What the controller's prompt memory learns of one published group (the "published" event's
    "prompts"; docs/protocol.md): samples drawn, successes, mean reward, signal, newest policy version."""
    a = group.adaptive
    rewards = [s.reward for s in group.samples]
    versions = [int(s.versions[s.loss_mask.astype(bool)].max()) for s in group.samples if s.num_generated]
    if a:
        drawn, successes, mean, signal = a["drawn"], a["successes"], a["mean"], bool(a["signal"])
    else:
        drawn, successes = len(rewards), sum(r >= success_reward for r in rewards)
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        signal = bool(rewards) and max(rewards) - min(rewards) > 1e-6
    return {"group_id": group.group_id, "prompt_id": group.prompt_id, "drawn": int(drawn),
            "successes": int(successes), "reward_mean": float(mean), "signal": signal,
            "version": max(versions) if versions else -1}


class RolloutWorker:
    """One rollout worker. Parts not given are built from the config at `start()`:
    engine = make_engine(cfg), tokenizer = the model's, reward = RewardClient, weights = the weight store
    (`weights` = (watch, fetch[, latest]) replaces it, see weight_sync.py); `nc` = a NATS connection shared
    with other workers of the process (rollout_service/pool.py), which close() leaves open."""

    def __init__(self, cfg: JetrlConfig, *, engine=None, tokenizer=None, reward=None,
                 workflow: Workflow | None = None, tools: ToolRegistry | None = None,
                 weights: tuple | None = None, instance: str | None = None, nc=None, online: bool = False):
        self.cfg = cfg
        self.online_mode = online  # `jetrl serve-policy`: sessions from outside traffic, no prompts (online/)
        self.online = None
        self.instance = instance or worker_id()
        self.engine, self.tokenizer, self.reward, self.tools = engine, tokenizer, reward, tools
        self.workflow = workflow if workflow is not None else load_workflow(cfg.rollout.workflow,
                                                                             cfg.rollout.workflow_args)
        self.workflow_name = cfg.rollout.workflow if workflow is None else getattr(workflow, "name", "")
        self._weights = weights
        self.metrics = RolloutMetrics()
        self.rate = Rate(30.0)
        self.published = 0
        self.round_yield = RoundYield(cfg.rollout.adaptive.yield_window)  # rollout.adaptive.stop=yield
        self.samples_drawn = 0  # every sample generated and scored, adaptive sampling's extra rounds included
        self.errors = 0
        self.last_error: str | None = None  # the last failed task (its health events carry it: jetrl why)
        self.last_error_at: float | None = None
        self.fetch_wait = Phase("weights current")  # a weight fetch retried (telemetry.wait_deadline_s)
        self.nc = self.js = self.loop = self.follower = self.ctx = self.events = self.agents = None
        self._shared_nc = nc
        self._pending_ids: list[str] = []
        self._pending_prompts: list[dict] = []  # prompt_record of each id in _pending_ids
        self._closers: list[Any] = []
        self._fetch_stats = None  # the weight store client's fetch counters (weight_store_source), when it is one
        self._wire_seen = {"delta": 0, "full": 0}  # of them, the bytes already counted in metrics.weight_bytes
        self._tasks: list[asyncio.Task] = []
        self._stopped = asyncio.Event()
        self.fatal: EngineDead | None = None  # set when the engine died: run() raises it after stopping

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        if self.tools is None:
            self.tools = build_tools(cfg.rollout.tools)
        if cfg.rollout.tools.mcp and not self.tools.mcp_started:  # started here, so closed with this worker
            from rollout_service.tools.mcp_tools import start_mcp_tools

            self._closers.append(await start_mcp_tools(cfg.rollout.tools, self.tools))
        if self.tokenizer is None:
            from shared.model.tinymodel import load_tokenizer

            self.tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
        if self.engine is None:
            from rollout_service.engines import make_engine

            self.engine = make_engine(cfg)
        await self.engine.start()
        self.nc = self._shared_nc or await bus.connect(cfg.nats, name=f"rollout-{self.instance}")
        self.js = self.nc.jetstream()
        await bus.ensure_streams(self.js, cfg.streams)
        self.events = bus.EventPublisher(self.js, self.nc, cfg.run, SERVICE, self.instance)
        if self.reward is None:
            from reward_service.client import RewardClient

            self.reward = RewardClient(self.nc, cfg.reward)
        if cfg.rollout.service.follow_weights:
            if self._weights is None:
                watch, fetch, latest, close = weight_store_source(cfg, self.js)
                self._closers.append(close)
                self._fetch_stats = fetch.stats
            else:
                watch, fetch, latest = (tuple(self._weights) + (None,))[:3]
                self._fetch_stats = getattr(fetch, "stats", None)
            from shared.model.adapters import base_fingerprint

            self.follower = WeightFollower(self.engine, cfg.run, watch, fetch, latest,
                                           served_base=lambda: base_fingerprint(cfg.model),
                                           on_refused=self._weights_refused, on_swap=self._swapped)
            await self.follower.prime()
        self.ctx = WorkflowContext(engine=self.engine, tokenizer=self.tokenizer, reward=self.reward,
                                   tools=self.tools, cfg=cfg)
        if self.online_mode:
            await self._start_online()
            return
        if getattr(self.workflow, "name", "") == "agent":
            from rollout_service.agents.server import AgentServer

            self.agents = self.ctx.agents = AgentServer(self.ctx)
            self.agents.nc = self.nc
            await self.agents.start()
        svc = cfg.rollout.service
        self.loop = consumer.ConsumerLoop(
            self.js, self.nc, run=cfg.run, stream=subjects.PROMPTS_STREAM, subject=subjects.prompts(cfg.run),
            durable=subjects.rollout_consumer(cfg.run), handler=self._handle, expect=PromptTask, source="rollout",
            batch=min(svc.fetch_batch, cfg.rollout.max_in_flight), max_in_flight=cfg.rollout.max_in_flight,
            ack_wait_s=svc.ack_wait_s, max_deliver=svc.max_deliver, can_fetch=self.can_fetch,
        )
        if cfg.telemetry.metrics_port >= 0:
            start_metrics(cfg.telemetry, self.metrics.registry)
        log.info("rollout worker %s: run %s, workflow %s, engine %s (version %d), %d in flight", self.instance,
                 cfg.run, self.workflow_name, getattr(self.engine, "name", "?"), self.engine.version,
                 cfg.rollout.max_in_flight)

    async def _start_online(self) -> None:
        from rollout_service.online.server import OnlineServer, publish_group

        cfg = self.cfg
        publish = publish_group(self.js, self.nc, cfg.run, cfg.rollout.service.publish_timeout_s)
        self.online = OnlineServer(self.ctx, self.js, cfg.run, self.instance, publish, self.events.emit)
        self.online.on_count = lambda outcome, n: self.metrics.online_sessions.labels(outcome).inc(n)
        await self.online.start()
        if cfg.telemetry.metrics_port >= 0:
            start_metrics(cfg.telemetry, self.metrics.registry)
        log.info("serve-policy %s: run %s, engine %s (version %d), endpoint %s", self.instance, cfg.run,
                 getattr(self.engine, "name", "?"), self.engine.version, self.online.base_url)

    async def run(self) -> None:
        """Start (if needed) and serve until `stop()`; in-flight tasks finish before it returns."""
        if self.loop is None and self.online is None:
            await self.start()
        if self.follower is not None:
            self._tasks.append(asyncio.create_task(self.follower.run()))
        self._tasks.append(asyncio.create_task(self._telemetry()))
        self._tasks.append(asyncio.create_task(self._flush_published_loop()))
        await self.events.emit("health", self._health())
        consume = asyncio.ensure_future(self.online.serve(self._stopped) if self.online else self.loop.run())
        deadline = asyncio.create_task(self._stop_deadline(consume))
        try:
            try:
                await consume
            except asyncio.CancelledError:
                if not deadline.done() or deadline.cancelled() or not deadline.result():
                    raise  # run() itself was cancelled
        finally:
            deadline.cancel()
            await self._flush_published()
            await self.close()
        if self.fatal is not None:
            raise self.fatal

    async def _stop_deadline(self, consume: asyncio.Future) -> bool:
        """After stop(), give tasks in flight rollout.service.stop_timeout_s to finish, then cancel them
        (unacked: redelivered elsewhere). True when it had to cancel."""
        await self._stopped.wait()
        try:
            await asyncio.wait_for(asyncio.shield(consume), self.cfg.rollout.service.stop_timeout_s)
            return False
        except asyncio.TimeoutError:
            log.warning("tasks still running %.0f s after the stop: cancelling them (JetStream redelivers them)",
                        self.cfg.rollout.service.stop_timeout_s)
            consume.cancel()
            return True
        except Exception:
            return False

    def stop(self) -> None:
        """Stop fetching prompts; tasks in flight finish, publish and are acked."""
        self._stopped.set()
        if self.loop is not None:
            self.loop.stop()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        # Bounded: on Python 3.11 a cancel can be swallowed by asyncio.wait_for inside nats-py, and a
        # loop that lost its cancel would keep close() waiting forever.
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10.0)
        self._tasks.clear()
        for close in self._closers:
            with contextlib.suppress(Exception):
                await close()
        if self.agents is not None:
            await self.agents.close()
        if self.online is not None:
            await self.online.close()
        if hasattr(self.workflow, "close"):
            with contextlib.suppress(Exception):
                await self.workflow.close()
        if self.reward is not None and hasattr(self.reward, "close"):
            with contextlib.suppress(Exception):
                await self.reward.close()
        if self.engine is not None:
            with contextlib.suppress(Exception):
                await self.engine.close()
        if self.nc is not None and not self.nc.is_closed and self.nc is not self._shared_nc:
            # Everything worth keeping is acked by now (groups by JetStream, prompts by us): flush, close.
            with contextlib.suppress(Exception):
                await bus.flush(self.nc, timeout=5)
            with contextlib.suppress(Exception):
                await self.nc.close()

    async def _weights_refused(self, version: int, error: str) -> None:
        """A weight version this worker cannot apply (a LoRA adapter on another base): say so, loudly."""
        await self.events.emit("weights_refused", {"version": version, "error": error, "worker": self.instance,
                                                   "engine_version": self.engine.version})

    # --- the work -------------------------------------------------------------------------------
    def can_fetch(self) -> bool:
        """The staleness gate: no new work while the engine lags the newest announcement too far."""
        if self._stopped.is_set():
            return False
        return self.follower is None or self.follower.lag <= self.cfg.schedule.max_staleness

    @property
    def in_flight(self) -> int:
        return self.loop.in_flight if self.loop is not None else 0

    def check_bounds(self, task: PromptTask) -> None:
        """consumer.Reject (dead-lettered at once, unprocessed) for a task over the worker's bounds: what a task
        may ask for is the config's to decide, not the sender's."""
        svc = self.cfg.rollout.service
        if task.run != self.cfg.run:
            raise consumer.Reject(f"prompt task of run {task.run!r} on run {self.cfg.run!r}'s subject")
        if not 1 <= task.group_size <= svc.max_group_size:
            raise consumer.Reject(f"group_size {task.group_size} is outside 1..{svc.max_group_size} "
                             "(rollout.service.max_group_size)")
        mnt = task.sampling.get("max_new_tokens") if isinstance(task.sampling, dict) else None
        if mnt is not None and (isinstance(mnt, bool) or not isinstance(mnt, int) or not 1 <= mnt <= svc.max_new_tokens):
            raise consumer.Reject(f"sampling.max_new_tokens {mnt!r} is outside 1..{svc.max_new_tokens} "
                             "(rollout.service.max_new_tokens)")
        p = task.payload if isinstance(task.payload, dict) else {}
        prompt, messages = p.get("prompt"), p.get("messages")
        size = len(prompt) if isinstance(prompt, str) else 0
        if isinstance(messages, list):
            size += sum(len(str(m.get("content", ""))) if isinstance(m, dict) else len(str(m)) for m in messages)
        if size > svc.max_prompt_chars:
            raise consumer.Reject(f"prompt of {size} characters is over rollout.service.max_prompt_chars "
                             f"{svc.max_prompt_chars}")

    def check_sample_lengths(self, samples) -> None:
        """consumer.Reject for a group with a sample longer than rollout.service.max_sample_tokens (0 = the model's
        context where the engine knows it): refused here, at admission, not in the trainer."""
        limit = self.cfg.rollout.service.max_sample_tokens or self.engine.context_tokens
        if not limit:
            return
        for i, s in enumerate(samples):
            if len(s.tokens) > limit:
                raise consumer.Reject(f"sample {i} of the group has {len(s.tokens)} tokens, over "
                                 f"rollout.service.max_sample_tokens {limit}"
                                 + ("" if self.cfg.rollout.service.max_sample_tokens else " (the model's context)"))

    async def _handle(self, task: PromptTask, msg) -> None:
        t0 = time.monotonic()
        self.check_bounds(task)
        try:
            if self.follower is not None:
                await self.follower.wait_for_version(task.released_at_version)
            adaptive: dict = {}
            if self.cfg.rollout.adaptive.max_samples:
                drawn = await sample_adaptively(lambda n, offset: self.workflow.run(self.ctx, shifted(task, n, offset)),
                                                task.group_size, self.cfg.rollout.adaptive,
                                                random.Random(f"{task.group_id}:{self.instance}"),
                                                self.round_yield)
                samples, adaptive = drawn.samples, drawn.account()
                self.metrics.adaptive_draws.inc(drawn.drawn)
                if not drawn.signal:
                    self.metrics.adaptive_no_signal.inc()
            else:
                samples = await self.workflow.run(self.ctx, task)
            for i, s in enumerate(samples):
                problem = s.validate()
                if problem:
                    raise ValueError(f"workflow {self.workflow_name}: sample {i}{problem[0]} {problem[1]}")
            self.check_sample_lengths(samples)
            group = TrajectoryGroup(
                run=task.run, prompt_id=task.prompt_id, epoch=task.epoch, samples=samples,
                workflow=self.workflow_name, worker=self.instance, released_at_version=task.released_at_version,
                metrics={"task_s": time.monotonic() - t0, "engine_version": self.engine.version,
                         "delivery": msg.metadata.num_delivered if msg.metadata else 1},
                adaptive=adaptive,
            )
            await bus.publish(self.js, self.nc, subjects.trajectories(task.run), group, msg_id=task.group_id,
                              timeout=self.cfg.rollout.service.publish_timeout_s)
            for s in samples:
                for stage in ("generate", "reward", "tools"):
                    v = s.timings.get(stage)
                    if isinstance(v, (int, float)):
                        self.metrics.stage_seconds.labels(stage).observe(v)
        except PromptTooLong as exc:  # the task's own prompt: no retry can help
            raise consumer.Reject(str(exc)) from None
        except EngineDead as exc:
            if self.fatal is None:
                log.error("engine dead, stopping this worker (its tasks go back to the stream): %s", exc)
                self.fatal = exc
                self.stop()
            raise
        except Exception as exc:
            self.errors += 1
            self.last_error, self.last_error_at = f"{type(exc).__name__}: {exc}"[:1000], time.time()
            self.metrics.errors.inc()
            log.warning("task %s failed: %s: %s", task.group_id, type(exc).__name__, exc)
            raise
        self.published += 1
        self.samples_drawn += adaptive.get("drawn", len(samples))
        self.metrics.published.inc()
        self.metrics.task_seconds.observe(time.monotonic() - t0)
        self._pending_ids.append(task.group_id)
        self._pending_prompts.append(prompt_record(group, self.cfg.rollout.adaptive.success_reward))
        if len(self._pending_ids) >= self.cfg.rollout.service.events_batch:
            await self._flush_published()

    # --- telemetry ------------------------------------------------------------------------------
    async def _flush_published(self) -> None:
        if not self._pending_ids or self.events is None:
            return
        ids, self._pending_ids = self._pending_ids, []
        prompts, self._pending_prompts = self._pending_prompts, []
        await self.events.emit("published", {"group_ids": ids, "worker": self.instance, "prompts": prompts})

    async def _flush_published_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self._flush_published()

    async def _swapped(self, version: int, fetch_s: float, swap_s: float) -> None:
        """A weight version is in the engine: a "weights" event and the fetch / swap histograms."""
        self.metrics.stage_seconds.labels("fetch").observe(fetch_s)
        self.metrics.stage_seconds.labels("swap").observe(swap_s)
        wire = {}
        if (stats := self._fetch_stats) is not None:  # HTTP fetches (weight_store.client)
            for how in ("delta", "full"):
                self.metrics.weight_bytes.labels(how).inc(stats[f"{how}_bytes"] - self._wire_seen[how])
                self._wire_seen[how] = stats[f"{how}_bytes"]
            wire = {k: stats[k] for k in ("delta_fetches", "full_fetches", "delta_bytes", "full_bytes", "delta_refused")}
        if self.events is not None:
            await self.events.emit("weights", {"version": version, "fetch_s": fetch_s, "swap_s": swap_s,
                                               "worker": self.instance, **wire})

    def snapshot(self) -> dict[str, Any]:
        """The 'metrics' event: tokens_per_s, in_flight, version, version_lag, tool_calls, errors."""
        s = self.ctx.stats if self.ctx else None
        return {
            "tokens_per_s": round(self.rate.per_second(), 2),
            "in_flight": self.in_flight,
            "version": self.engine.version if self.engine else -1,
            "version_lag": self.follower.lag if self.follower else 0,
            "tool_calls": s.tool_calls if s else 0,
            "tool_errors": s.tool_errors if s else 0,
            "errors": self.errors,
            "published": self.published,
            "samples_drawn": self.samples_drawn,
            "generated_tokens": s.generated_tokens if s else 0,
            "weight_swaps": self.follower.swaps if self.follower else 0,
            **({"online": dict(self.online.counts), "online_open": len(self.online.store.sessions)}
               if self.online is not None else {}),
        }

    def _health(self) -> dict[str, Any]:
        """The health event: what `jetrl why` reads (controller/evidence.py)."""
        f = self.follower
        return {"status": "ok", "instance": self.instance, "version": self.engine.version,
                "announced": f.latest if f else None, "fetch_error": f.fetch_error if f else None,
                "in_flight": self.in_flight, "last_error": self.last_error, "last_error_at": self.last_error_at,
                "online": self.online is not None}

    async def _check_waits(self) -> None:
        """A weight fetch failing past telemetry.wait_deadline_s: a wait_deadline event (and again each deadline)."""
        f = self.follower
        if f is None:
            return
        if f.fetch_error:
            self.fetch_wait.enter(f"retrying the fetch of version {f.latest}", f.fetch_error)
        else:
            self.fetch_wait.enter("weights current")
            return
        late = self.fetch_wait.overdue(self.cfg.telemetry.wait_deadline_s)
        if late is not None:
            log.warning("weight fetch failing for %.0f s: %s", late["waited_s"], f.fetch_error)
            await self.events.emit("wait_deadline", {**late, "error": f.fetch_error, "worker": self.instance})

    async def _telemetry(self) -> None:
        last = {"tokens": 0, "swaps": 0, "tool_calls": 0, "tool_errors": 0}
        counters = {"tokens": self.metrics.tokens, "swaps": self.metrics.weight_swaps,
                    "tool_calls": self.metrics.tool_calls, "tool_errors": self.metrics.tool_errors}
        interval = self.cfg.telemetry.events_interval_s
        next_event = time.monotonic() + interval
        while True:
            await asyncio.sleep(min(1.0, interval))
            st = self.ctx.stats
            now = {"tokens": st.generated_tokens, "swaps": self.follower.swaps if self.follower else 0,
                   "tool_calls": st.tool_calls, "tool_errors": st.tool_errors}
            self.rate.add(now["tokens"] - last["tokens"])
            for k, c in counters.items():
                c.inc(max(0, now[k] - last[k]))
            last = now
            snap = self.snapshot()
            self.metrics.tokens_per_s.set(snap["tokens_per_s"])
            self.metrics.in_flight.set(snap["in_flight"])
            self.metrics.version.set(snap["version"])
            self.metrics.version_lag.set(snap["version_lag"])
            if time.monotonic() >= next_event:
                next_event = time.monotonic() + interval
                await self.events.emit("metrics", snap)
                await self.events.emit("health", self._health())
                await self._check_waits()


async def serve(cfg: JetrlConfig, **parts: Any) -> None:
    """Run one worker until SIGTERM / SIGINT (then finish the tasks in flight)."""
    import signal

    worker = RolloutWorker(cfg, **parts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Not on Windows, nor outside the main thread (tests): the caller stops it there.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, worker.stop)
    await worker.run()
