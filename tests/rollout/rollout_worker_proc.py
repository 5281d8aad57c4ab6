"""A rollout worker process for the SIGKILL test: `python rollout_worker_proc.py NATS_URL RUN`.

It runs the real RolloutWorker (real consumer, real reward client) with a scripted engine, and freezes its
tasks at the two moments a crash hurts most: prompts with an even index publish their group and then
hang before the ack; odd ones hang while "generating". It prints one line per frozen task.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_doubles import ScriptedEngine, worker_config  # noqa: E402

from rollout_service.service import RolloutWorker  # noqa: E402
from shared.model.tinymodel import build_tokenizer  # noqa: E402


async def main(url: str, run: str) -> None:
    cfg = worker_config(url, run)
    cfg.rollout.service.follow_weights = False
    tok = build_tokenizer()
    worker = RolloutWorker(cfg, engine=ScriptedEngine(tok, lambda p, n: " 9"), tokenizer=tok, instance="victim")
    real = worker._handle

    async def frozen(task, msg):
        if int(task.prompt_id[1:]) % 2 == 0:
            await real(task, msg)
            print("published-unacked", task.group_id, flush=True)
        else:
            print("in-flight", task.group_id, flush=True)
        await asyncio.Event().wait()

    worker._handle = frozen  # before start(): the consumer loop takes this handler
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
