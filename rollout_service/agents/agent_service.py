"""The agent's side of `workflow_args.service`: serve an `async def run(client, task)` as a long-running
agent service that takes episodes from NATS (docs/agents.md, "Agent services").

    nc = await nats.connect(...)
    await serve_agent(nc, run="my-run", name="solver", fn=my_agents.solver.run)

Any language can do the same: subscribe to `jetrl.<run>.agents.<name>` in queue group `jetrl-agents`,
read the JSON request {"base_url", "api_key", "session_id", "reward_url", "task"}, run the episode against
base_url with api_key, reply JSON {"reward": float | null} (null: the reward service scores the final
answer) or {"error": "..."}.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from shared.contract import subjects

log = logging.getLogger("jetrl.agent_service")

AgentFn = Callable[[Any, dict], Awaitable[float | None]]


async def serve_agent(nc, run: str, name: str, fn: AgentFn, max_concurrent: int = 16):
    """Subscribe `fn` to the run's episodes for agent `name`; returns the subscription (unsubscribe to stop).
    Up to `max_concurrent` episodes run at once; each gets its own openai.AsyncOpenAI client."""
    import httpx
    import openai

    sem = asyncio.Semaphore(max_concurrent)
    http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
    running: set[asyncio.Task] = set()

    async def episode(msg) -> None:
        async with sem:
            try:
                ep = json.loads(msg.data)
                client = openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                                            http_client=http)
                reward = await fn(client, ep["task"])
                reply: dict[str, Any] = {"reward": None if reward is None else float(reward)}
            except Exception as exc:  # the worker dead-letters the group with this reason
                log.warning("episode failed: %s: %s", type(exc).__name__, exc)
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            await msg.respond(json.dumps(reply).encode())

    async def on_request(msg) -> None:  # nats-py runs one callback at a time: each episode is its own task
        t = asyncio.create_task(episode(msg))
        running.add(t)
        t.add_done_callback(running.discard)

    return await nc.subscribe(subjects.agent_episodes(run, name), queue=subjects.AGENT_QUEUE_GROUP, cb=on_request)
