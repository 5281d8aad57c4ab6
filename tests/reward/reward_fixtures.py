"""Helpers shared by the reward tests: in-process replicas and subprocess replicas of `jetrl reward serve`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from reward_service.service import RewardService
from shared.config import JetrlConfig, NatsConfig, RewardConfig
from shared.contract import bus

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def run_config(nats_config: NatsConfig, **reward) -> JetrlConfig:
    cfg = JetrlConfig(nats=nats_config, reward=RewardConfig(**reward))
    cfg.telemetry.events_interval_s = 0.5
    return cfg


@contextlib.asynccontextmanager
async def replicas(cfg: JetrlConfig, n: int = 1, task: str | None = None, js: bool = False):
    """n in-process replicas, each on its own NATS connection (as separate processes would be)."""
    conns, services = [], []
    try:
        for i in range(n):
            nc = await bus.connect(cfg.nats, name=f"reward-replica-{i}")
            conns.append(nc)
            svc = RewardService(nc, cfg, task, instance=f"replica-{i}", js=nc.jetstream() if js else None)
            await svc.start()
            services.append(svc)
        yield services
    finally:
        for svc in services:
            await svc.stop(drain_s=2)
        for nc in conns:
            await nc.close()


def spawn_replica(nats_url: str, task: str, log: Path, *overrides: str) -> subprocess.Popen:
    """`jetrl reward serve` as a real subprocess (tests/reward on PYTHONPATH for custom scorers)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
    cmd = [sys.executable, "-m", "launcher.cli", "reward", "serve", "--task", task,
           f"nats.servers=[{nats_url}]", "telemetry.metrics_port=-1", *overrides]
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


async def wait_for_log(log: Path, text: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"replica exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"{text!r} not in {log} after {timeout}s:\n{log.read_text(errors='replace')}")
