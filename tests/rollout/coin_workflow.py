"""A scripted workflow for adaptive-sampling tests: real generation (tokens, logprobs, versions from the
engine), but the reward is a coin with the success probability the prompt's payload sets ("p"), seeded by
the prompt and the sample's sampling seed (rollout.sampling.seed must be set), so a run is reproducible."""

from __future__ import annotations

import asyncio
import random

from rollout_service.workflows.base import Trace, Workflow, WorkflowContext
from shared.contract.messages import PromptTask, Sample


class CoinWorkflow(Workflow):
    name = "coin"

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s  # seconds each call (a round of draws) takes at least: paces the groups

    async def run(self, ctx: WorkflowContext, task: PromptTask) -> list[Sample]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        prompt = ctx.render_prompt(task.payload)
        params = [ctx.sampling(task, i) for i in range(task.group_size)]
        results = await asyncio.gather(*(ctx.generate(prompt, sp) for sp in params))
        p = float(task.payload["reference"])
        samples = []
        for sp, res in zip(params, results, strict=True):
            trace = Trace(prompt)
            trace.add_policy(res)
            coin = random.Random(f"{task.prompt_id}:{sp.seed}").random()
            samples.append(trace.to_sample(1.0 if coin < p else 0.0))
        return samples
