"""A `jetrl serve-policy` worker process for the restart test: `python online_worker_proc.py NATS_URL RUN KEYS_DIR`.

The real RolloutWorker in online mode (real endpoint, records on the real nats-server) with a scripted
engine; it prints `url <base url>` once it serves.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_doubles import QWEN_LIKE_TEMPLATE, ScriptedEngine, char_tokenizer, worker_config  # noqa: E402

from rollout_service.service import RolloutWorker  # noqa: E402


async def main(url: str, run: str, keys: str) -> None:
    cfg = worker_config(url, run, online={"keys_dir": keys})
    cfg.rollout.service.follow_weights = False
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    worker = RolloutWorker(cfg, engine=ScriptedEngine(tok, lambda p, n: f"answer {n}"), tokenizer=tok,
                           instance="online", online=True)
    await worker.start()
    print("url", worker.online.base_url, flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
