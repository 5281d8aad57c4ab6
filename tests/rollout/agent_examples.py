"""Agents for the agent-workflow tests, written against the openai client only. `by_prompt` picks a
behaviour from the prompt id: a good agent, one that crashes, one that hangs, one that never ends."""

from __future__ import annotations

import asyncio


async def two_turns(client, task):
    """Answers, is asked again, answers again; returns None: the reward service scores the last answer."""
    msgs = [{"role": "user", "content": task["prompt"]}]
    r = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "sure?"}]
    await client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    return None


async def by_prompt(client, task):
    kind = task["prompt_id"].split("-")[0]
    msgs = [{"role": "user", "content": task["prompt"]}]
    if kind == "hang":
        await asyncio.sleep(3600)
    if kind == "endless":
        while True:
            await client.chat.completions.create(model="policy", messages=msgs, max_tokens=2)
    if kind == "ok":
        return await two_turns(client, task)
    await client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    if kind == "crash":
        raise RuntimeError("the agent fell over")
    return 0.25  # kind "self": the agent scores itself


async def configured(client, task, reward: float, max_tokens: int = 4):
    """Takes its settings from workflow_args.args: answers once and returns the configured reward."""
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}],
                                         max_tokens=max_tokens)
    return reward
