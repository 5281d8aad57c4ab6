"""single_turn: N independent answers to one prompt, scored together (one reward request per group)."""

from __future__ import annotations

import asyncio
import time

from rollout_service.workflows.base import Trace, Workflow, WorkflowContext, reward_metrics
from shared.contract.messages import PromptTask, Sample


class SingleTurnWorkflow(Workflow):
    name = "single_turn"

    async def run(self, ctx: WorkflowContext, task: PromptTask) -> list[Sample]:
        prompt = ctx.render_prompt(task.payload)
        results = await asyncio.gather(
            *(ctx.generate(prompt, ctx.sampling(task, i)) for i in range(task.group_size))
        )
        t0 = time.monotonic()
        rr = await ctx.score(task, [ctx.decode(r.output_ids) for r in results], [r.output_ids for r in results])
        reward_s = time.monotonic() - t0
        samples = []
        for i, res in enumerate(results):
            trace = Trace(prompt)
            trace.add_policy(res)
            trace.timings["reward"] = reward_s
            trace.metrics.update(reward_metrics(rr, i))
            samples.append(trace.to_sample(rr.rewards[i]))
        return samples
