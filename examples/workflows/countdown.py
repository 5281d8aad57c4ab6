"""Countdown: reach a target number with arithmetic on given numbers (each used at most once).

A user workflow for jetrl: rollout.workflow = "examples.workflows.countdown:CountdownWorkflow".
It scores locally (no reward service needed); `ctx.score(task, texts)` would use the reward service.
Task payload: {"numbers": [3, 5, 7], "target": 22}.
"""

import asyncio
import re
from collections import Counter

from jetrl_api import ToolError, Trace, Workflow
from rollout_service.tools.calculator import evaluate  # a built-in tool's evaluator, used as a plain function


def countdown_reward(expr: str, numbers: list[int], target: int) -> float:
    used = Counter(int(n) for n in re.findall(r"\d+", expr))
    if any(used[n] > Counter(numbers)[n] for n in used):
        return 0.0  # a number not given, or used too often
    try:
        return 1.0 if abs(evaluate(expr) - target) < 1e-9 else 0.1  # 0.1: well-formed but wrong
    except ToolError:
        return 0.0


class CountdownWorkflow(Workflow):
    name = "countdown"

    def __init__(self, hint: str = "="):
        self.hint = hint

    async def run(self, ctx, task):
        nums, target = task.payload["numbers"], task.payload["target"]
        prompt = ctx.encode(f"use {' '.join(map(str, nums))} to make {target} {self.hint}")
        results = await asyncio.gather(*(ctx.generate(prompt, ctx.sampling(task, i)) for i in range(task.group_size)))
        samples = []
        for res in results:
            trace = Trace(prompt)
            trace.add_policy(res)
            expr = ctx.decode(res.output_ids).strip().split("\n")[0]
            samples.append(trace.to_sample(countdown_reward(expr, nums, target)))
        return samples
