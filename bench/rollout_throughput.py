"""Rollout service overhead: prompt tasks -> trajectory groups through the real service (durable consumer,
publish + ack, events) vs the same sim engine and workflow called directly, 32 tasks at once, one run.

    python -m bench.rollout_throughput [--prompts 256] [--concurrency 32] [--group-size 4]

Both sides score through the same real reward service (embedded nats-server). Last line:
`rollout_service_ratio: X` = service groups/s / direct groups/s (target >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

# This file is named like the package it measures: keep bench/ off the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from reward_service.client import RewardClient  # noqa: E402
from reward_service.service import RewardService  # noqa: E402
from rollout_service.engines import make_engine  # noqa: E402
from rollout_service.service import RolloutWorker  # noqa: E402
from rollout_service.tools import ToolRegistry  # noqa: E402
from rollout_service.workflows import WorkflowContext, load_workflow  # noqa: E402
from shared.config import JetrlConfig  # noqa: E402
from shared.contract import bus, subjects  # noqa: E402
from shared.contract.messages import PromptTask  # noqa: E402
from shared.model.tinymodel import build_tokenizer  # noqa: E402
from shared.runtime.natsd import EmbeddedNats  # noqa: E402


def tasks(run: str, n: int, group_size: int) -> list[PromptTask]:
    out = []
    for i in range(n):
        digits = [(i * 7 + k * 3) % 10 for k in range(5)]
        out.append(PromptTask(run=run, prompt_id=f"p{i}", epoch=0, group_size=group_size,
                              payload={"prompt": "max " + " ".join(map(str, digits)) + " =",
                                       "reference": str(max(digits))}))
    return out


def config(url: str, run: str, concurrency: int, vocab: int) -> JetrlConfig:
    return JetrlConfig.model_validate({
        "run": run, "nats": {"servers": [url]}, "reward": {"task": "maxdigit"},
        "telemetry": {"metrics_port": -1, "log_level": "WARNING"},
        "rollout": {"engine": "sim", "max_in_flight": concurrency, "sampling": {"max_new_tokens": 128},
                    "sim": {"vocab_size": vocab, "output_len_median": 48, "max_concurrency": 512, "seed": 0},
                    "service": {"follow_weights": False, "fetch_batch": concurrency}},
    })


async def direct(cfg: JetrlConfig, nc, items: list[PromptTask], concurrency: int, tok) -> float:
    engine = make_engine(cfg)
    await engine.start()
    ctx = WorkflowContext(engine=engine, tokenizer=tok, reward=RewardClient(nc, cfg.reward), tools=ToolRegistry(),
                          cfg=cfg)
    wf = load_workflow(cfg.rollout.workflow)
    sem = asyncio.Semaphore(concurrency)

    async def one(t):
        async with sem:
            return await wf.run(ctx, t)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(t) for t in items))
    dt = time.perf_counter() - t0
    await engine.close()
    return dt


async def service(cfg: JetrlConfig, nc, js, items: list[PromptTask], tok) -> float:
    for t in items:
        await bus.publish(js, nc, subjects.prompts(cfg.run), t, msg_id=t.group_id)
    worker = RolloutWorker(cfg, tokenizer=tok, tools=ToolRegistry(), instance="bench")
    await worker.start()
    t0 = time.perf_counter()
    run = asyncio.create_task(worker.run())
    while worker.published < len(items):
        await asyncio.sleep(0.01)
    dt = time.perf_counter() - t0
    worker.stop()
    await run
    return dt


async def main(args) -> None:
    tok = build_tokenizer()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(tmp) as srv:
        cfg = config(srv.url, "bench", args.concurrency, len(tok))
        nc = await bus.connect(cfg.nats, name="bench")
        js = nc.jetstream()
        await bus.ensure_streams(js, cfg.streams)
        reward = RewardService(nc, cfg, task="maxdigit")
        await reward.start()
        items = tasks("bench", args.prompts, args.group_size)
        d = await direct(cfg, nc, items, args.concurrency, tok)
        s = await service(cfg, nc, js, items, tok)
        await reward.stop(drain_s=1)
        await nc.close()
    n = args.prompts
    print(f"prompts {n}, group size {args.group_size}, {args.concurrency} tasks in flight, sim engine")
    print(f"direct : {d:.2f} s  {n / d:.1f} groups/s")
    print(f"service: {s:.2f} s  {n / s:.1f} groups/s")
    print(f"rollout_service_ratio: {d / s:.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--group-size", type=int, default=4)
    asyncio.run(main(p.parse_args()))
