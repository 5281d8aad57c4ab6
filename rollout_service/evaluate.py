"""Held-out evaluation of a policy version through the run's own engine and reward service.

    rows (JSONL) --> prompt rendering (as the workflows do) --> engine.generate (greedy or k samples)
        --> RewardClient.score (one request per prompt) --> mean reward, pass@1, pass@k

`Evaluator` owns one engine, one reward client and a weight-store client; `load(version)` swaps a
version in (version 0 = the engine's initial weights, which are the trainer's version 0). `jetrl eval`
runs it once; `jetrl eval --follow` (started by `jetrl up` when eval.dataset and eval.eval_every are set)
evaluates the newest version every `eval_every` versions and publishes each result as an Event
(service "eval", kind "eval": {version, reward, pass_at_k, pass_at_1, k, n, ...}).

`jetrl eval --local-reward` needs no running services: it scores with the reward service's own
ScoringEngine in this process (`LocalReward`) and reads versions from the weight store's directory
(`weights.root`, a finished run's `<run dir>/weights`), so a run can be evaluated before it starts and
after it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollout_service.engines.base import Engine, GenerateRequest, SamplingParams
from rollout_service.workflows.base import WorkflowContext
from shared.config import JetrlConfig
from shared.config.eval import EvalConfig

log = logging.getLogger("jetrl.eval")

SERVICE = "eval"
PROMPT_FIELDS = ("prompt", "question", "problem", "input")
REFERENCE_FIELDS = ("reference", "answer", "solution", "target")


class EvalError(ValueError):
    """A request `jetrl eval` cannot serve (a version not stored, an Event without NATS): a message, no traceback."""


def eval_config(cfg: JetrlConfig) -> EvalConfig:
    """The run's `eval` section (defaults when the config model has none)."""
    section = getattr(cfg, "eval", None)
    return section if isinstance(section, EvalConfig) else EvalConfig()


# --- pure maths ----------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with `c` solved out of `n` samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# --- data ----------------------------------------------------------------------------------------


def _pick(row: dict, name: str, candidates: tuple[str, ...], what: str, where: str) -> str:
    if name:
        if name not in row:
            raise ValueError(f"{where}: no field {name!r} (eval.{what}_field); the row has {sorted(row)}")
        return name
    for c in candidates:
        if c in row:
            return c
    raise ValueError(f"{where}: no {what} field (looked for {', '.join(candidates)}; the row has {sorted(row)}): "
                     f"set eval.{what}_field")


def read_rows(path: str | Path, ecfg: EvalConfig) -> list[dict]:
    """Task payloads {"prompt" | "messages", "reference", "metadata"} from a held-out JSONL file."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"eval dataset {str(p)!r}: no such file")
    rows: list[dict] = []
    with open(p) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
            ref_key = _pick(row, ecfg.reference_field, REFERENCE_FIELDS, "reference", where)
            if "messages" in row and not ecfg.prompt_field:
                prompt_key = "messages"
                payload: dict[str, Any] = {"messages": row["messages"]}
            else:
                prompt_key = _pick(row, ecfg.prompt_field, PROMPT_FIELDS, "prompt", where)
                payload = {"prompt": str(row[prompt_key])}
            payload["reference"] = row[ref_key]
            payload["metadata"] = {k: v for k, v in row.items() if k not in (ref_key, prompt_key)}
            rows.append(payload)
            if ecfg.limit and len(rows) >= ecfg.limit:
                break
    if not rows:
        raise ValueError(f"eval dataset {str(p)!r} has no rows")
    return rows


# --- results -------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    version: int
    reward: float  # mean reward over every sample of every prompt
    pass_at_1: float
    pass_at_k: float
    k: int
    n: int  # prompts
    dataset: str = ""
    errors: int = 0  # samples whose scoring failed (they count as reward 0)
    seconds: float = 0.0
    per_prompt: list[list[float]] = field(default_factory=list, repr=False)
    completions: list[list[str]] = field(default_factory=list, repr=False)  # the decoded samples, per prompt

    def event_data(self) -> dict:
        d = asdict(self)
        d.pop("per_prompt")
        d.pop("completions")
        return d

    def line(self) -> str:
        return (f"version {self.version}: reward {self.reward:.3f}, pass@1 {self.pass_at_1:.3f}, "
                f"pass@{self.k} {self.pass_at_k:.3f} on {self.n} prompts ({self.errors} scoring errors, "
                f"{self.seconds:.1f} s)")


def summarise(version: int, per_prompt: list[list[float]], success: float, errors: int = 0,
              dataset: str = "", seconds: float = 0.0) -> EvalResult:
    """Mean reward and pass@1 / pass@k (k = samples per prompt) of per-prompt sample rewards."""
    if not per_prompt:
        raise ValueError("summarise: no prompts")
    k = len(per_prompt[0])
    if k == 0 or any(len(r) != k for r in per_prompt):
        raise ValueError("summarise: every prompt needs the same, non-zero number of samples")
    solved = [sum(1 for x in r if x >= success) for r in per_prompt]
    n = len(per_prompt)
    return EvalResult(
        version=version,
        reward=sum(sum(r) for r in per_prompt) / (n * k),
        pass_at_1=sum(pass_at_k(k, c, 1) for c in solved) / n,
        pass_at_k=sum(pass_at_k(k, c, k) for c in solved) / n,
        k=k, n=n, dataset=dataset, errors=errors, seconds=seconds, per_prompt=per_prompt,
    )


# --- the evaluator -------------------------------------------------------------------------------


class Evaluator:
    """Generate and score held-out prompts with one engine; swap versions in with `load`."""

    def __init__(self, cfg: JetrlConfig, ecfg: EvalConfig, engine: Engine, tokenizer, reward, weights=None):
        self.cfg, self.ecfg = cfg, ecfg
        self.engine, self.reward, self.weights = engine, reward, weights
        self.ctx = WorkflowContext(engine=engine, tokenizer=tokenizer, reward=reward, tools=None, cfg=cfg)

    def sampling(self, index: int) -> SamplingParams:
        s = self.cfg.rollout.sampling
        greedy = self.ecfg.greedy
        return SamplingParams(
            temperature=0.0 if greedy else self.ecfg.temperature,
            top_p=1.0 if greedy else s.top_p,
            top_k=0 if greedy else s.top_k,
            max_new_tokens=self.ecfg.max_new_tokens or s.max_new_tokens,
            stop=list(s.stop), stop_token_ids=list(s.stop_token_ids),
            seed=None if greedy else self.ecfg.seed + index,
        )

    async def load(self, version: int) -> None:
        """Put `version` into the engine (fetched from the weight store unless it is already there)."""
        if version == self.engine.version:
            return
        if self.weights is None:
            raise ValueError(f"version {version}: no weight store client to fetch it with")
        path = await self.weights.fetch(self.cfg.run, version)
        await self.engine.update_weights(version, path=str(path))

    async def _one(self, payload: dict, sem: asyncio.Semaphore) -> tuple[list[float], int, list[str]]:
        async with sem:
            prompt = self.ctx.render_prompt(payload)
            outs = await asyncio.gather(*(self.engine.generate(GenerateRequest(prompt_ids=prompt, sampling=self.sampling(i)))
                                          for i in range(self.ecfg.samples)))
            texts = [self.ctx.decode(o.output_ids) for o in outs]
            rr = await self.reward.score(self.cfg.reward.task, texts, payload.get("reference"), payload=payload,
                                         completion_ids=[o.output_ids for o in outs])
            if rr.error:
                raise RuntimeError(f"reward task {self.cfg.reward.task!r}: {rr.error}")
            errors = sum(1 for e in (rr.errors or []) if e)
            return [float(x) for x in rr.rewards], errors, texts

    async def evaluate(self, rows: list[dict], dataset: str = "") -> EvalResult:
        version = self.engine.version
        t0 = time.monotonic()
        sem = asyncio.Semaphore(self.ecfg.concurrency)
        results = await asyncio.gather(*(self._one(r, sem) for r in rows))
        if self.engine.version != version:
            raise RuntimeError(f"the engine changed version during evaluation ({version} -> {self.engine.version})")
        result = summarise(version, [r for r, _, _ in results], self.ecfg.success_reward,
                           errors=sum(e for _, e, _ in results), dataset=dataset, seconds=time.monotonic() - t0)
        result.completions = [t for _, _, t in results]
        return result


# --- processes: one evaluation, or follow a run ---------------------------------------------------


class LocalReward:
    """`RewardClient.score` without NATS: the reward service's own ScoringEngine, in this process."""

    def __init__(self, cfg):
        from reward_service.engine import ScoringEngine

        self.engine = ScoringEngine(cfg)

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    async def score(self, task: str, completions: list[str], reference: Any, payload: dict | None = None,
                    completion_ids: list[list[int]] | None = None):
        import uuid

        import numpy as np

        from shared.messages import RewardRequest

        ids = None if completion_ids is None else [np.asarray(c, dtype=np.int32) for c in completion_ids]
        return await self.engine.score_request(RewardRequest(
            task=task, completions=list(completions), reference=reference, payload=payload or {},
            request_id=uuid.uuid4().hex, completion_ids=ids))


def stored_versions(cfg: JetrlConfig) -> list[int]:
    """The run's committed versions in the weight store's directory (`weights.root`), oldest first."""
    from weight_store.storage import MANIFEST

    d = Path(cfg.weights.root) / cfg.run
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and (p / MANIFEST).is_file())


class EvalSession:
    """NATS connection, engine, reward and weight-store clients of `jetrl eval` (async context manager).

    `local_reward`: no NATS at all; score in this process (LocalReward) and take versions from the weight
    store's directory (`weights.root`) instead of the announcements."""

    def __init__(self, cfg: JetrlConfig, ecfg: EvalConfig, local_reward: bool = False):
        self.cfg, self.ecfg, self.local_reward = cfg, ecfg, local_reward
        self.nc = self.js = self.engine = self.weights = self.reward = None
        self.evaluator: Evaluator | None = None

    async def __aenter__(self) -> EvalSession:
        from reward_service.client import RewardClient
        from rollout_service.engines import make_engine
        from shared import bus
        from shared.tinymodel import load_tokenizer
        from weight_store.client import WeightStoreClient

        cfg = self.cfg
        if self.local_reward:
            self.reward = LocalReward(cfg.reward)
            await self.reward.start()
        else:
            self.nc = await bus.connect(cfg.nats, name="jetrl-eval")
            self.js = self.nc.jetstream()
            await bus.ensure_streams(self.js, cfg.streams)
            self.reward = RewardClient(self.nc, cfg.reward)
        self.engine = make_engine(cfg)
        await self.engine.start()
        tokenizer = getattr(self.engine, "tokenizer", None) or load_tokenizer(cfg.model.tokenizer or cfg.model.path)
        self.weights = WeightStoreClient(cfg.weights)
        self.evaluator = Evaluator(cfg, self.ecfg, self.engine, tokenizer, self.reward, self.weights)
        return self

    async def __aexit__(self, *exc) -> None:
        for closer in (self.engine.close if self.engine else None, self.weights.close if self.weights else None,
                       self.reward.close if self.reward else None):
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), 5)

    async def latest_version(self) -> int | None:
        if self.js is None:
            versions = stored_versions(self.cfg)
            return versions[-1] if versions else None
        from weight_store.announce import latest

        wv = await latest(self.js, self.cfg.run)
        return None if wv is None else wv.version

    async def load(self, version: int) -> None:
        if self.local_reward and version != self.engine.version:
            stored = stored_versions(self.cfg)
            if version not in stored:
                raise EvalError(f"version {version} of run {self.cfg.run!r} is not in the weight store directory "
                                f"{Path(self.cfg.weights.root) / self.cfg.run} (it holds {stored}); "
                                f"with --local-reward pass the run dir's config (<run dir>/config.yaml)")
        await self.evaluator.load(version)

    async def emit(self, result: EvalResult, instance: str = "") -> None:
        from shared.bus import EventPublisher

        if self.js is None:
            raise EvalError("cannot publish an eval Event without NATS (--local-reward)")
        ev = EventPublisher(self.js, self.nc, self.cfg.run, SERVICE, instance)
        await ev.emit("eval", result.event_data(), msg_id=f"{self.cfg.run}:eval:{result.dataset}:{result.version}:"
                                                        f"{result.k}:{result.n}")


async def eval_once(cfg: JetrlConfig, ecfg: EvalConfig, version: int | None, emit: bool = False,
                    local_reward: bool = False) -> EvalResult:
    """Evaluate `version` (None = the newest announced, or the initial weights when none is).
    `local_reward`: without NATS (see EvalSession); the newest version is then the newest stored one."""
    if emit and local_reward:
        raise EvalError("emit needs NATS: not with local_reward")
    rows = read_rows(ecfg.dataset, ecfg)
    async with EvalSession(cfg, ecfg, local_reward=local_reward) as s:
        if version is None:
            version = await s.latest_version() or 0
        await s.load(version)
        result = await s.evaluator.evaluate(rows, dataset=Path(ecfg.dataset).name)
        if emit:
            await s.emit(result)
        return result


async def eval_follow(cfg: JetrlConfig, ecfg: EvalConfig, stop: asyncio.Event | None = None,
                      instance: str = "") -> None:
    """Evaluate the run's newest version whenever `eval_every` versions have passed since the last
    evaluation (the first version seen is always evaluated), publishing each result as an Event."""
    from shared.bus import EventPublisher
    from weight_store.announce import watch

    every = max(1, ecfg.eval_every)
    rows = read_rows(ecfg.dataset, ecfg)
    name = Path(ecfg.dataset).name
    stop = stop or asyncio.Event()
    async with EvalSession(cfg, ecfg) as s:
        health = EventPublisher(s.js, s.nc, cfg.run, SERVICE, instance)
        newest = -1
        done = -1
        changed = asyncio.Event()

        async def watcher() -> None:
            nonlocal newest
            async for wv in watch(s.js, cfg.run):
                newest = max(newest, wv.version)
                changed.set()

        async def heartbeat() -> None:
            while True:
                await health.emit("health", {"status": "ok", "instance": instance, "version": done})
                await asyncio.sleep(cfg.telemetry.events_interval_s)

        tasks = [asyncio.create_task(watcher()), asyncio.create_task(heartbeat())]
        try:
            while not stop.is_set():
                waiter = asyncio.create_task(changed.wait())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED, timeout=5.0)
                waiter.cancel()
                stopper.cancel()
                changed.clear()
                if stop.is_set() or newest < 0 or (done >= 0 and newest < done + every):
                    continue
                target = newest
                try:
                    await s.evaluator.load(target)
                    result = await s.evaluator.evaluate(rows, dataset=name)
                except Exception as exc:  # a version pruned before we fetched it, reward service restarting
                    log.warning("evaluation of version %d failed (%s: %s); retrying with the newest", target,
                                type(exc).__name__, exc)
                    await asyncio.sleep(1.0)
                    changed.set()
                    continue
                done = result.version
                log.info("eval %s", result.line())
                await s.emit(result, instance)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
