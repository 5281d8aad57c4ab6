"""The trainer service: rank 0 drives, every rank executes.

Rank 0 runs the asyncio service (NATS intake, batching, publishing, events); the other ranks wait in
`follow()` for the commands rank 0 runs (`Trainer.on_all_ranks(fn, **args)`: rank 0 broadcasts
{"kind", **args} and calls `fn` itself; a follower looks the kind up in COMMANDS: step / state_dict /
stage / save / load / noop / stop), so every collective (FSDP all-gathers, DCP save) happens in the same
order on all ranks. A step (`Trainer._train`) is: batch -> advantages -> `train` (all ranks:
backend.train_step) -> full state dict (all ranks) -> publish v+1 (rank 0; by default uploaded while the
next step trains, `trainer.publish_overlap`) -> events and metrics (`_report_step`) -> checkpoint every
`checkpoint_every` steps (all ranks). docs/trainer.md has the details.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shared.config import JetrlConfig
from shared.contract import bus
from shared.contract.messages import TrajectoryGroup
from shared.runtime.telemetry import start_metrics
from shared.runtime.waits import WAITING_FOR_WORK, Phase
from trainer_service import checkpoint, memory, metrics, timings
from trainer_service.algorithms.advantages import DrawStats, group_advantages
from trainer_service.algorithms.staleness import rewards_all_equal
from trainer_service.drain import DrainWatch
from trainer_service.guard import Guard
from trainer_service.intake import Batch, Intake, IntakeState
from trainer_service.packing import TrainItem
from trainer_service.publish import (
    StagedVersion,
    VersionTakenError,
    make_publisher,
    retryable_publish_error,
    stage_version,
)
from trainer_service.signal_watch import SignalWatch, default_threshold

log = logging.getLogger("jetrl.trainer")

NOOP_AFTER_S = 5.0  # rank 0 pings the followers this often while it waits for data
PUBLISH_RETRY_S = (0.5, 10.0)  # first and longest pause between attempts to publish a version


def norm_length(cfg: JetrlConfig) -> int:
    return cfg.trainer.algorithm.norm_length or cfg.rollout.sampling.max_new_tokens


# --- commands: what every rank runs, in the same order (rank 0 broadcasts each, `Trainer.on_all_ranks`) ---


def train(backend, cfg: JetrlConfig, items: list[TrainItem]) -> dict:
    """The step on this rank: the backend's update (backends/base.py:TrainBackend.train_step, i.e.
    trainer_service/step.py:train_step; sim's step-cost model), then with trainer.release_memory the
    freed memory handed back. Returns the step's statistics."""
    stats = backend.train_step(items, cfg.trainer, norm_length(cfg))
    if cfg.trainer.release_memory:
        memory.release_freed_memory()
    return stats


def state_dict(backend, cfg: JetrlConfig) -> dict | None:
    """The full state dict (rank 0; None elsewhere)."""
    return backend.full_state_dict()


def stage(backend, cfg: JetrlConfig, parent: Path | None = None) -> StagedVersion | None:
    """(trainer.publish_snapshot disk) the full state dict as a version's files, written on rank 0."""
    return stage_snapshot(backend, cfg, backend.full_state_dict(), parent)


def save(backend, cfg: JetrlConfig, path: str, extra: dict) -> None:
    """A checkpoint at `path`; rank 0 then prunes the old ones (trainer.keep_checkpoints)."""
    backend.save_checkpoint(path, extra)
    if backend.rank == 0:
        checkpoint.prune(cfg.trainer.checkpoint_dir, cfg.run, cfg.trainer.keep_checkpoints)


def load(backend, cfg: JetrlConfig, path: str) -> dict:
    """The checkpoint at `path`; returns its `extra`."""
    return backend.load_checkpoint(path)


def scale_lr(backend, cfg: JetrlConfig, factor: float) -> None:
    """Multiply the learning rate by `factor` (a collapse-guard rollback, guard.py)."""
    backend.scale_lr(factor)


def noop(backend, cfg: JetrlConfig) -> None:
    """Nothing (rank 0 waits for data: the followers hear from it every NOOP_AFTER_S)."""


def stop_following(backend, cfg: JetrlConfig) -> None:
    """Nothing; a follower returns after it."""


COMMANDS = {"step": train, "state_dict": state_dict, "stage": stage, "save": save, "load": load,
            "scale_lr": scale_lr, "noop": noop, "stop": stop_following}
KIND = {fn: kind for kind, fn in COMMANDS.items()}


def execute(backend, cmd: dict, cfg: JetrlConfig) -> Any:
    """Run a broadcast command, {"kind": name in COMMANDS, **its arguments}, on this rank."""
    kind = cmd["kind"]
    if kind not in COMMANDS:
        raise ValueError(f"unknown trainer command {kind!r}")
    return COMMANDS[kind](backend, cfg, **{k: v for k, v in cmd.items() if k != "kind"})


def stage_snapshot(backend, cfg: JetrlConfig, sd: dict | None, parent: Path | None) -> StagedVersion | None:
    """Write the state dict `sd` (None on ranks > 0) as a version's files and let go of it; with
    trainer.release_memory hand the freed memory back."""
    if sd is None:
        return None
    staged = stage_version(cfg, sd, backend.hf_config(), backend.tokenizer, parent)
    del sd
    if cfg.trainer.release_memory:
        memory.release_freed_memory()
    return staged


def follow(backend, cfg: JetrlConfig) -> None:
    """Ranks > 0: execute rank 0's commands until it says stop."""
    while True:
        cmd = backend.broadcast(None)
        execute(backend, cmd, cfg)
        if cmd["kind"] == "stop":
            return


def draw_stats(g: TrajectoryGroup) -> DrawStats | None:
    """The statistics of every draw when adaptive sampling drew more samples than the group holds
    (TrajectoryGroup.adaptive, checked on decode), else None: the group's own rewards are its baseline."""
    a = g.adaptive
    if not a or a["drawn"] <= len(g.samples):
        return None
    return DrawStats(n=int(a["drawn"]), mean=float(a["mean"]), std=float(a["std"]))


def group_has_spread(g: TrajectoryGroup) -> bool:
    """Whether the group's rewards differ (it carries a learning signal)."""
    a = g.adaptive
    if a and "signal" in a:
        return bool(a["signal"])
    return not rewards_all_equal([s.reward for s in g.samples])


def samples_drawn(g: TrajectoryGroup) -> int:
    """Samples generated for the group: its own, or every draw of adaptive sampling."""
    return int(g.adaptive["drawn"]) if g.adaptive else len(g.samples)


def batch_items(batch: Batch, cfg: JetrlConfig) -> list[TrainItem]:
    """Advantages over each group's full reward list (stale samples still inform the baseline), then
    one TrainItem per fresh sample."""
    a = cfg.trainer.algorithm
    advs = group_advantages([[s.reward for s in g.samples] for g in batch.groups], a.adv_estimator, a.adv_eps,
                            draws=[draw_stats(g) for g in batch.groups],
                            weights=[[s.weight for s in g.samples] for g in batch.groups])
    items: list[TrainItem] = []
    for g, fresh, adv in zip(batch.groups, batch.fresh, advs, strict=True):
        keep = {id(s) for s in fresh}
        for s, a_i in zip(g.samples, adv, strict=True):
            if id(s) in keep:
                items.append(TrainItem(tokens=s.tokens, loss_mask=s.loss_mask, behav_logp=s.logprobs,
                                       advantage=float(a_i), group_id=g.group_id, reward=float(s.reward)))
    return items


class Trainer:
    """Rank 0's service loop."""

    def __init__(self, cfg: JetrlConfig, backend):
        self.cfg, self.backend = cfg, backend
        self.instance = f"{socket.gethostname()}:{os.getpid()}"
        self.version = 0
        self.step = 0
        self.short = 0  # groups the lineage's steps trained short of batch_size (drained or waited-out batches): WeightVersion.short
        self._stop = asyncio.Event()
        self._stopped_followers = False
        # One thread runs every backend command, in order: commands must not overlap (collectives), and
        # torch work hopping between the default pool's threads spreads its allocations over several
        # malloc arenas (the suspected cause of a SmolLM2 trainer growing from ~7 to ~11 GB over 12 steps
        # while the same steps on one thread stayed flat; docs/benchmarks.md).
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jetrl-trainer-backend")
        self._pending_publish: asyncio.Task | None = None  # trainer.publish_overlap's upload in flight
        self.signal = SignalWatch(cfg.trainer.no_signal_groups
                                  or default_threshold(cfg.schedule.batch_size, cfg.rollout.adaptive.max_samples > 0))
        self._store_s = 0.0  # seconds the last publish took to write, upload and announce
        self.phase = Phase()  # what rank 0 is doing now, in its health events (shared/runtime/waits.py)
        self.publish_error: str | None = None  # the last failed publish attempt, while it is retried
        self.guard = Guard(cfg.trainer.guard) if cfg.trainer.guard.enabled else None
        self.trained_at: dict[int, list[str]] = {}  # step -> its trained groups, back to the oldest checkpoint kept

    def _run(self, fn, args: dict) -> Any:
        self.backend.broadcast({"kind": KIND[fn], **args})  # the followers run it too (follow -> execute)
        return fn(self.backend, self.cfg, **args)

    async def on_all_ranks(self, fn, **args) -> Any:
        """`fn(backend, cfg, **args)`, one of COMMANDS, here (on the backend's thread) and on every other rank."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, self._run, fn, args)

    def stop(self) -> None:
        self._stop.set()

    async def stop_followers(self) -> None:
        if not self._stopped_followers:
            self._stopped_followers = True
            await self.on_all_ranks(stop_following)

    async def _publish(self, overlap: bool = False) -> None:
        """Store and announce the current weights as `self.version`; with `overlap`, in a background task
        that the next publish, checkpoint or shutdown awaits (`_published`). The state dict is taken
        here, so the next step may train while it uploads."""
        await self._published()  # the previous version first: versions stay in order, one copy in flight
        if self.cfg.trainer.publish_snapshot == "disk":
            staged = await self.on_all_ranks(stage, parent=self.publisher.staging_root)
            task = self._store(self.version, self.step, staged, self.short)
        else:
            sd = await self.on_all_ranks(state_dict)
            task = self._store(self.version, self.step, [sd], self.short)
            del sd  # _store drops the snapshot once its files are written
        if overlap:
            self._pending_publish = asyncio.create_task(task)
        else:
            await task

    async def _published(self) -> None:
        """Wait for a background publish; its failure is raised here."""
        task, self._pending_publish = self._pending_publish, None
        if task is not None:
            self.phase.enter("publishing")
            await task

    async def _store(self, version: int, step: int, state: list[dict] | StagedVersion, short: int = 0) -> None:
        """Store and announce `state` as `version`: staged files, or the state dict in a one-item list,
        whose files are written once here (publish.stage_version, in a thread) and the snapshot dropped
        at once, so it is not held in memory while the upload overlaps the next step. While the weight
        store or NATS is down (restarting), retry with back-off instead of crashing: a crash would throw
        away the steps since the last checkpoint. Publishing is idempotent per (instance, version), so a
        retry after a commit or an announcement whose reply was lost finishes it instead of failing."""
        t0 = time.perf_counter()
        staged = state if isinstance(state, StagedVersion) else await asyncio.to_thread(self._stage, state)
        try:
            wv = await self._send(version, step, staged, short)
            self.publish_error = None
        finally:
            staged.discard()
        self._store_s = time.perf_counter() - t0
        metrics.VERSION.set(wv.version)
        log.info("published version %d (step %d) in %.2f s %s", wv.version, step, self._store_s, wv.manifest_url)

    def _stage(self, holder: list[dict]) -> StagedVersion:
        """(A writer thread.) The snapshot's files; the snapshot itself is gone when this returns."""
        return stage_snapshot(self.backend, self.cfg, holder.pop(), self.publisher.staging_root)

    async def _send(self, version: int, step: int, staged: StagedVersion, short: int = 0):
        delay = PUBLISH_RETRY_S[0]
        while True:
            try:
                return await self.publisher.publish(version, step, staged, self.backend.hf_config(),
                                                    self.backend.tokenizer, metadata={"instance": self.instance},
                                                    short=short)
            except VersionTakenError as exc:  # left behind by a trainer that died before announcing it
                log.warning("%s; publishing as version %d instead", exc, version + 1)
                version += 1
                self.version = max(self.version, version)
            except Exception as exc:
                if not retryable_publish_error(exc) or self._stop.is_set():
                    raise
                self.publish_error = f"version {version}: {type(exc).__name__}: {exc}"[:1000]
                log.warning("publishing version %d failed (%s: %s); retrying in %.1fs", version,
                            type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, PUBLISH_RETRY_S[1])

    async def _checkpoint(self) -> None:
        await self._published()  # the checkpoint's version is announced before the checkpoint names it
        self.phase.enter("checkpointing")
        pos = self.intake.position()
        extra = {"version": self.version, "step": self.step, "short": self.short, "intake_position": pos.position,
                 "finished_groups": pos.finished, "run": self.cfg.run, "time": time.time()}
        path = checkpoint.step_dir(self.cfg.trainer.checkpoint_dir, self.cfg.run, self.step)
        await self.on_all_ranks(save, path=str(path), extra=extra)
        self.last_checkpoint_step = self.step
        kept = checkpoint.complete_checkpoints(self.cfg.trainer.checkpoint_dir, self.cfg.run)
        if kept:  # a rollback never goes further back than the oldest checkpoint kept
            oldest = checkpoint.step_of(kept[0])
            self.trained_at = {s: ids for s, ids in self.trained_at.items() if s > oldest}
        await self.events.emit("checkpoint", {"version": self.version, "step": self.step, "path": str(path),
                                              "intake_position": pos.position})
        log.info("checkpoint step %d version %d at %s (intake position %d)", self.step, self.version, path,
                 pos.position)

    async def _announcement_refused(self, wv, why: str) -> None:
        """An announcement in the KV that the store does not hold as announced (forged, or a store that
        lost it): never numbered after, reported as a "weights_refused" event naming its version."""
        await self.events.emit("weights_refused", {"version": wv.version, "step": wv.step, "error": why,
                                                   "service": "trainer", "instance": self.instance})

    async def _known_versions(self) -> tuple[int, int]:
        """(the verified announced version, the store's newest version), -1 for none. The trainer numbers
        after these, never after a KV value the store does not hold (issue 28: a forged `version=1000000`)."""
        delay = PUBLISH_RETRY_S[0]
        while True:
            try:
                latest = await self.publisher.latest()
                return (latest.version if latest is not None else -1), await self.publisher.newest_stored()
            except Exception as exc:
                if not retryable_publish_error(exc) or self._stop.is_set():
                    raise
                log.warning("reading the announced and stored versions failed (%s: %s); retrying in %.1fs",
                            type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, PUBLISH_RETRY_S[1])

    async def _start_state(self, resume: bool) -> IntakeState | None:
        t = self.cfg.trainer
        self.publisher.on_refused = self._announcement_refused
        verified, stored = await self._known_versions()
        announced = max(verified, stored)
        ck = checkpoint.latest_checkpoint(t.checkpoint_dir, self.cfg.run) if resume else None
        if ck is not None:
            extra = await self.on_all_ranks(load, path=str(ck))
            self.step = self.last_checkpoint_step = int(extra["step"])
            self.short = int(extra.get("short", 0))  # checkpoints before 0.11.1 hold none
            await self._resumed(int(extra["version"]), str(ck), announced, int(extra["intake_position"]))
            return IntakeState(position=int(extra["intake_position"]), finished=list(extra["finished_groups"]))
        if resume:
            log.warning("--resume: no checkpoint under %s; starting from the configured weights",
                        checkpoint.run_dir(t.checkpoint_dir, self.cfg.run))
        if announced >= 0:
            if not resume:
                raise RuntimeError(
                    f"run {self.cfg.run!r} already has version {announced} announced (or held by the weight store): resume it with --resume "
                    f"(checkpoints under {checkpoint.run_dir(t.checkpoint_dir, self.cfg.run)}) or use a new run id"
                )
            # Killed before its first checkpoint: begin again at step 0 from the configured weights and
            # read every group from the start of the stream (intake state None), like a resume from a
            # checkpoint of step 0.
            await self._resumed(0, None, announced, 0)
            return None
        self.version = 0
        await self._publish()  # version 0: the initial weights
        return None

    async def _resumed(self, weights_version: int, ck: str | None, announced: int, intake_position: int) -> None:
        """Continue numbering after anything announced since the weights' version (versions stay monotonic:
        the KV's CAS forbids going back) and tell the controller, acked: the ledger's lineage depends on it."""
        self.version = max(weights_version, announced)
        await self.events.emit_acked("resumed", {
            "version": weights_version, "step": self.step, "checkpoint": ck, "announced_version": announced,
            "next_version": self.version + 1, "intake_position": intake_position}, stop=self._stop)
        log.info("resumed from %s: weights of version %d, step %d, next version %d",
                 ck or "the configured weights (no checkpoint)", weights_version, self.step, self.version + 1)

    async def _health(self) -> None:
        tel = self.cfg.telemetry
        while True:
            held = len(self.intake.buffer) if self.intake is not None else 0
            data = {"status": "ok", "instance": self.instance, "version": self.version, "step": self.step,
                    "held_groups": held, "publish_error": self.publish_error, **self.phase.report()}
            await self.events.emit("health", data)
            late = self.phase.overdue(tel.wait_deadline_s)
            if late is not None:  # the evidence `jetrl why` reads (controller/diagnosis.py)
                log.warning("trainer: %s for %.0f s (%s)", late["phase"], late["waited_s"], late["detail"] or "-")
                await self.events.emit("wait_deadline", {**late, "error": self.publish_error, "held_groups": held})
            await asyncio.sleep(tel.events_interval_s)

    async def _train(self, batch: Batch, t_batch: float) -> None:
        """One step of `batch`, which formed at perf_counter `t_batch` (timings.py names the stages)."""
        rollout = timings.rollout_stages(batch.groups, time.time())
        t0 = time.perf_counter()
        items = batch_items(batch, self.cfg)
        t1 = time.perf_counter()
        self.phase.enter("training")
        stats = await self.on_all_ranks(train, items=items)
        self.step += 1
        self.short += max(0, self.cfg.schedule.batch_size - len(batch.groups)) if batch.partial else 0
        metrics.STEPS.inc()
        t2 = time.perf_counter()
        if self.step % self.cfg.trainer.publish_every == 0:
            await self._published()
            self.version += 1
            self.phase.enter("publishing")
            await self._publish(overlap=self.cfg.trainer.publish_overlap)
        t3 = time.perf_counter()
        carried, self._carry = self._carry, {}
        stages = timings.step_stages(
            t2 - t1, stats.pop("timings", {}),
            {"wait": t_batch - self._t_mark - sum(carried.values()), "prepare": t1 - t0, "publish": t3 - t2},
            carried)
        wall, self._t_mark = t3 - self._t_mark, t3
        await self._report_step(batch, items, stats, stages, rollout, wall)
        t4 = time.perf_counter()
        if self.step % self.cfg.trainer.checkpoint_every == 0:
            await self._checkpoint()
        t5 = time.perf_counter()
        self._carry = {"events": t4 - t3, "checkpoint": t5 - t4}  # charged to the next step

    async def _report_step(self, batch: Batch, items: list[TrainItem], stats: dict, stages: dict, rollout: dict,
                           wall: float) -> None:
        """The step's events ("step"; "groups", acked), metrics and log line."""
        reward_mean = sum(it.reward for it in items) / len(items) if items else 0.0
        trained = [g.group_id for g in batch.groups]
        spreads = [group_has_spread(g) for g in batch.groups]
        data = {"version": self.version, "step": self.step, "loss": stats["loss"], "reward_mean": reward_mean,
                "samples": len(items), "groups": len(trained), "partial": batch.partial,
                "dropped_stale_samples": batch.dropped_stale_samples,
                "groups_with_signal": sum(spreads), "samples_trained": len(items),
                "samples_drawn": sum(samples_drawn(g) for g in batch.groups),
                "staleness_hist": {str(k): v for k, v in sorted(batch.staleness_hist.items())}, **stats,
                "wall_s": wall, "timings": stages, "rollout_timings": rollout,
                "publish_store_s": self._store_s,  # the last finished write + upload (overlapped or not)
                **metrics.memory_gb(),
                **metrics.judge_metric_means(s for g in batch.groups for s in g.samples)}
        metrics.record_stages(stages, rollout["queue_wait"])
        await self.events.emit("step", data)
        # Acked (retried through a NATS outage): the controller's ledger learns the outcomes only from
        # this event, and the checkpoint after the step must not move past outcomes nobody heard of.
        await self.events.emit_acked("groups", {"version": self.version, "step": self.step, "trained": trained,
                                                "batch_version": batch.version,
                                                "dropped_stale": batch.dropped_stale, "filtered": batch.filtered,
                                                "filtered_reasons": batch.filtered_reasons},
                                     stop=self._stop)
        self.trained_at[self.step] = trained
        await self._watch_signal(spreads + [False] * len(batch.filtered))
        metrics.record_step(stats, batch, len(items), reward_mean)
        trip = self.guard.observe(self.step, data) if self.guard is not None else None
        if trip is not None:
            await self._guard_tripped(trip)
        log.info("step %d version %d loss %.4f reward %.3f samples %d dropped_stale %d tokens/s %.0f", self.step,
                 self.version, stats["loss"], reward_mean, len(items), batch.dropped_stale_samples,
                 stats["tokens_per_s"])

    async def _guard_tripped(self, trip: dict) -> None:
        """The collapse guard tripped (guard.py): a `guard_tripped` event (acked: the controller pauses the run
        on action pause) with the evidence, after the rollback when trainer.guard.action is rollback."""
        g = self.cfg.trainer.guard
        info = {**trip, "version": self.version, "action": g.action}
        log.warning("collapse guard tripped at step %d (failing since step %d): %s", trip["step"], trip["since_step"],
                    ", ".join(trip["reasons"]))
        if g.action == "rollback":
            ck = checkpoint.latest_checkpoint(self.cfg.trainer.checkpoint_dir, self.cfg.run,
                                              before_step=trip["since_step"])
            if ck is None:
                info.update(action="pause", why=f"no checkpoint from before step {trip['since_step']}: paused instead")
                log.warning("%s", info["why"])
            else:
                info.update(await self._rollback(ck))
        await self.events.emit_acked("guard_tripped", info, stop=self._stop)

    async def _rollback(self, ck: Path) -> dict:
        """Back to checkpoint `ck`: its weights published as the next version, the groups trained since and the
        groups generated by the versions since discarded (filtered, reason in the ledger), the LR scaled."""
        g = self.cfg.trainer.guard
        await self._published()
        self.phase.enter("rolling back")
        newest = self.version
        extra = await self.on_all_ranks(load, path=str(ck))
        ck_step, ck_version = int(extra["step"]), int(extra["version"])
        self.short = int(extra.get("short", 0))
        discarded = [gid for s, ids in sorted(self.trained_at.items()) if s > ck_step for gid in ids]
        self.trained_at = {s: ids for s, ids in self.trained_at.items() if s <= ck_step}
        self.step = ck_step
        self.intake.discard_versions(ck_version, newest)
        await self.on_all_ranks(scale_lr, factor=g.lr_factor)
        why = f"discarded: trained after step {ck_step}, rolled back by the collapse guard"
        await self.events.emit_acked("groups", {"version": newest, "step": self.step, "trained": [], "dropped_stale": [],
                                                "filtered": discarded, "filtered_reasons": dict.fromkeys(discarded, why)},
                                     stop=self._stop)
        self.version += 1
        await self._publish()
        self.guard.reset()
        log.warning("rolled back to %s (step %d, weights of version %d) as version %d; %d trained groups discarded; "
                    "learning rate x %g", ck, ck_step, ck_version, self.version, len(discarded), g.lr_factor)
        return {"checkpoint": str(ck), "to_step": ck_step, "weights_of_version": ck_version,
                "new_version": self.version, "discarded_groups": len(discarded),
                "discarded_versions": [ck_version + 1, newest], "lr_factor": g.lr_factor,
                "lr": self.backend.current_lr()}

    async def _report_outcomes(self) -> None:
        """Report groups dropped or filtered while no batch formed (the controller's ledger waits on them)."""
        out = self.intake.take_outcomes()
        if out is None:
            return
        await self.events.emit_acked("groups", {"version": self.version, "step": self.step, "trained": [],
                                                "dropped_stale": out.dropped_stale, "filtered": out.filtered,
                                                "filtered_reasons": out.filtered_reasons,
                                                "dropped_stale_samples": out.dropped_stale_samples},
                                     stop=self._stop)
        await self._watch_signal([False] * len(out.filtered))
        metrics.record_outcomes(out.dropped_stale, out.filtered, out.dropped_stale_samples)

    async def _watch_signal(self, spreads: list[bool]) -> None:
        """Groups just decided (True: with a reward spread) -> a `no_signal` event when the state changes."""
        for data in self.signal.observe(self.step, spreads):
            (log.warning if data["active"] else log.info)("%s", data["message"])
            await self.events.emit("no_signal", data)

    def _done(self) -> bool:
        # Steps, not versions: after a resume from an older checkpoint the versions jump past the lost
        # steps (numbering continues after the highest announced one), but the final model's lineage
        # still needs total_steps batches, and the controller released exactly that many.
        total = self.cfg.schedule.total_steps
        return self._stop.is_set() or (total > 0 and self.step >= total)

    def _may_cut_batches(self) -> bool:
        """Whether a batch may be trained short after schedule.batch_wait_s (the intake checks that it is on).
        Not in a run's last (max_staleness + 1) x publish_every steps: there the controller's total_steps cap
        binds (admission_bound: the window reaches it exactly then, whatever `short`), it has released what
        the remaining steps train in full batches, and a step cut short would leave groups in flight that no
        step trains."""
        s = self.cfg.schedule
        window = (s.max_staleness + 1) * self.cfg.trainer.publish_every
        return s.total_steps == 0 or self.step < s.total_steps - window

    async def serve(self, resume: bool = False) -> None:
        cfg = self.cfg
        start_metrics(cfg.telemetry)
        self.nc = await bus.connect(cfg.nats, name="trainer")
        self.js = self.nc.jetstream()
        await bus.ensure_streams(self.js, cfg.streams)
        self.events = bus.EventPublisher(self.js, self.nc, cfg.run, "trainer", self.instance)
        self.publisher = make_publisher(cfg, self.js)
        self.last_checkpoint_step = -1
        health = None
        self.intake = None
        self.drain = DrainWatch(cfg.run)
        try:
            state = await self._start_state(resume)
            self.intake = Intake(cfg, self.js, self.nc, state)
            await self.intake.start()
            await self.drain.start(self.js)
            await self.events.emit("started", {"version": self.version, "step": self.step, "instance": self.instance})
            health = asyncio.create_task(self._health())
            self._t_mark, self._carry = time.perf_counter(), {}
            while not self._done():
                self.phase.enter(WAITING_FOR_WORK, f"holding {len(self.intake.buffer)} of {cfg.schedule.batch_size} groups")
                stop_wait = asyncio.create_task(self._stop.wait())
                get = asyncio.create_task(self.intake.next_batch(self.version, timeout_s=NOOP_AFTER_S,
                                                                 cut_short=self._may_cut_batches()))
                await asyncio.wait({stop_wait, get}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                if not get.done():
                    get.cancel()
                    break
                batch = get.result()
                if batch is None and self.drain.ready(self.intake.held(), self.intake.decided):
                    batch = self.intake.take_partial(self.version)  # the run's data ended (drain.py)
                    self.drain.consumed()
                    if batch is not None:
                        log.info("the run's prompts are all released: training the last %d group(s) as a "
                                 "smaller batch (batch_size %d)", len(batch.groups), cfg.schedule.batch_size)
                if batch is None:
                    await self.on_all_ranks(noop)
                    await self._report_outcomes()
                    continue
                await self._train(batch, time.perf_counter())
            await self._published()
            if self.step > 0 and self.step != self.last_checkpoint_step:
                await self._checkpoint()
        finally:
            if self._pending_publish is not None:  # failing: a half-done upload is never announced
                self._pending_publish.cancel()
                with contextlib.suppress(BaseException):
                    await self._pending_publish
            if health is not None:
                health.cancel()
            await self.drain.stop()
            if self.intake is not None:
                await self.intake.stop()
            await self.stop_followers()
            await self.publisher.close()
            with contextlib.suppress(Exception):
                await self.nc.flush(timeout=5)
            await self.nc.close()


def run(cfg: JetrlConfig, resume: bool = False) -> None:
    """Entry point of every rank (torchrun or a single process)."""
    from trainer_service.backends import make_backend

    backend = make_backend(cfg)
    log.info("rank %d of world size %d (node rank %s)", backend.rank, backend.world_size,
             os.environ.get("GROUP_RANK", "0"))
    try:
        if backend.rank == 0:
            trainer = Trainer(cfg, backend)

            async def main() -> None:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, trainer.stop)
                await trainer.serve(resume)

            asyncio.run(main())
        else:
            follow(backend, cfg)
    finally:
        backend.close()
