"""multi_turn: answer, get environment feedback ("wrong, try again"), answer again, up to K turns.

Each answer is scored by the reward service; the episode ends at the first answer scoring at least
`success_reward` or after `max_turns` answers. The sample's reward is the last answer's reward times
`turn_discount ** turn` (turn counted from 0), so a right first answer is worth most. Feedback tokens
are environment tokens: masked out of the loss.
"""

from __future__ import annotations

import time

from rollout_service.workflows.base import Trace, Workflow, WorkflowContext, prompt_messages, reward_metrics
from shared.contract.messages import PromptTask, Sample


def discounted(reward: float, turn: int, discount: float) -> float:
    """Reward of an answer given at 0-based `turn`."""
    return reward * discount**turn


class MultiTurnWorkflow(Workflow):
    name = "multi_turn"

    def __init__(self, max_turns: int | None = None, turn_discount: float | None = None,
                 feedback: str | None = None):
        self.max_turns, self.turn_discount, self.feedback = max_turns, turn_discount, feedback

    async def run(self, ctx: WorkflowContext, task: PromptTask) -> list[Sample]:
        return await self.run_group(ctx, task, self.one)

    async def one(self, ctx: WorkflowContext, task: PromptTask, index: int) -> Sample:
        mt = ctx.cfg.rollout.multi_turn
        max_turns = self.max_turns or mt.max_turns
        discount = mt.turn_discount if self.turn_discount is None else self.turn_discount
        feedback = mt.feedback if self.feedback is None else self.feedback
        sampling = ctx.sampling(task, index)
        messages = prompt_messages(task.payload)
        trace = Trace(ctx.render_prompt(task.payload))
        reward, turn = 0.0, 0
        for turn in range(max_turns):
            res = await ctx.generate(trace.tokens, sampling)
            trace.add_policy(res)
            answer = ctx.decode(res.output_ids)
            t0 = time.monotonic()
            rr = await ctx.score(task, [answer], [res.output_ids])
            trace.timings["reward"] += time.monotonic() - t0
            reward = rr.rewards[0]
            trace.metrics.update(reward_metrics(rr, 0))
            if reward >= mt.success_reward or res.finish_reason == "abort" or turn == max_turns - 1:
                break
            fb = {"role": "user", "content": feedback.strip() or feedback}
            trace.add_env(ctx.continuation_ids(messages, answer, ctx.decode(res.output_ids, False), [fb],
                                               plain_text=feedback))
            messages = messages + [{"role": "assistant", "content": answer}, fb]
        trace.metrics["turns"] = turn + 1
        trace.metrics["raw_reward"] = reward
        return trace.to_sample(discounted(reward, turn, discount))
