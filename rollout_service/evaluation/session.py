"""The wiring of one `jetrl eval` process: NATS connection, engine, reward and weight-store clients
(EvalSession), and one evaluation of one version (eval_once).

`local_reward` (`jetrl eval --local-reward`) needs no running services: it scores with the reward
service's own ScoringEngine in this process (reward_service.local_client.LocalRewardClient) and reads
versions from the weight store's directory (`weights.root`, a finished run's `<run dir>/weights`), so a
run can be evaluated before it starts and after it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from rollout_service.evaluation.evaluator import Evaluator
from rollout_service.evaluation.passk import EvalResult
from rollout_service.evaluation.rows import read_rows
from shared.config import JetrlConfig
from shared.config.eval import EvalConfig

SERVICE = "eval"


class EvalError(ValueError):
    """A request `jetrl eval` cannot serve (a version not stored, an Event without NATS): a message, no traceback."""


def eval_config(cfg: JetrlConfig) -> EvalConfig:
    """The run's `eval` section (defaults when the config model has none)."""
    section = getattr(cfg, "eval", None)
    return section if isinstance(section, EvalConfig) else EvalConfig()


def stored_versions(cfg: JetrlConfig) -> list[int]:
    """The run's committed versions in the weight store's directory (`weights.root`), oldest first."""
    from weight_store.manifest import committed_versions

    return committed_versions(cfg.weights.root, cfg.run)


class EvalSession:
    """NATS connection, engine, reward and weight-store clients of `jetrl eval` (async context manager).

    `local_reward`: no NATS at all; score in this process (LocalRewardClient) and take versions from the weight
    store's directory (`weights.root`) instead of the announcements."""

    def __init__(self, cfg: JetrlConfig, ecfg: EvalConfig, local_reward: bool = False):
        self.cfg, self.ecfg, self.local_reward = cfg, ecfg, local_reward
        self.nc = self.js = self.engine = self.weights = self.reward = None
        self.evaluator: Evaluator | None = None

    async def __aenter__(self) -> EvalSession:
        from reward_service.client import RewardClient
        from reward_service.local_client import LocalRewardClient
        from rollout_service.engines import make_engine
        from shared.contract import bus
        from shared.model.tinymodel import load_tokenizer
        from weight_store.client import WeightStoreClient

        cfg = self.cfg
        if self.local_reward:
            self.reward = LocalRewardClient(cfg.reward)
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
        await self.evaluator.start(self.nc)
        return self

    async def __aexit__(self, *exc) -> None:
        for closer in (self.evaluator.close if self.evaluator else None, self.engine.close if self.engine else None,
                       self.weights.close if self.weights else None, self.reward.close if self.reward else None):
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
        from shared.contract.bus import EventPublisher

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
