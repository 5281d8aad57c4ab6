"""tool_agent: function calling in the Hermes / Qwen format.

With rollout.tool_agent.tool_choice "required" the first turn is constrained to one call of an offered tool
(its declared arguments only, matching their schemas); later turns are free.

The model writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; generation stops at the
closing tag, the call is parsed and run by the tool registry (time-limited), and the result is appended
as a `<tool_response>` turn (through the tokenizer's chat template, role "tool", where it has one).
Tool responses are environment tokens: masked out of the loss. A turn without a tool call is the final
answer, which the reward service scores. A malformed call is answered with an error message; after
`max_turns` model turns the sample ends with finish_reason "tool_limit".
"""

from __future__ import annotations

import time

from rollout_service.tools.call_format import CALL_CLOSE, parse_tool_calls, plain_preamble, plain_response
from rollout_service.workflows.base import Trace, Workflow, WorkflowContext, prompt_messages, reward_metrics
from shared.contract.messages import PromptTask, Sample


def closed_object(params: dict) -> dict:
    """A tool's parameters schema without room for arguments it does not declare (the registry refuses those,
    ToolRegistry.check_args), unless it says otherwise."""
    if params.get("type", "object") == "object" and "properties" in params and "additionalProperties" not in params:
        return {**params, "additionalProperties": False}
    return params


def forced_call(ctx: WorkflowContext, sampling, schemas: list[dict]):
    """`sampling` constrained to one call of an offered tool (rollout.tool_agent.tool_choice: required), as the
    endpoint constrains tool_choice 'required' (agents/constrain.py); ValueError when the engine cannot."""
    from dataclasses import replace

    from rollout_service.agents.constrain import turn_constraint

    closed = [{**t, "function": {**t["function"], "parameters": closed_object(t["function"].get("parameters") or {})}}
              for t in schemas]
    sp = replace(sampling, constraint=turn_constraint(closed, closed, None, several=False))
    ctx.engine.check_support(sp)
    return sp


class ToolAgentWorkflow(Workflow):
    name = "tool_agent"

    def __init__(self, max_turns: int | None = None):
        self.max_turns = max_turns

    async def run(self, ctx: WorkflowContext, task: PromptTask) -> list[Sample]:
        return await self.run_group(ctx, task, self.one)

    async def one(self, ctx: WorkflowContext, task: PromptTask, index: int) -> Sample:
        async with ctx.tools.episode() as tools:  # episode-scoped MCP servers start (and end) here
            return await self._one(ctx, task, index, tools)

    async def _one(self, ctx: WorkflowContext, task: PromptTask, index: int, tools) -> Sample:
        cfg = ctx.cfg.rollout.tool_agent
        max_turns = self.max_turns or cfg.max_turns
        schemas = tools.schemas()
        if ctx.has_chat_template:
            messages = prompt_messages(task.payload, cfg.system_prompt)
            prompt = ctx.encode(ctx.apply_template(messages, schemas or None, add_generation_prompt=True))
        else:
            messages = prompt_messages(task.payload)
            head = cfg.system_prompt or (plain_preamble(schemas) if schemas else "")
            prompt = ctx.encode((head + "\n" if head else "") + ctx.render_prompt_text(task.payload))
        trace = Trace(prompt)
        sampling = ctx.sampling(task, index, extra_stop=[CALL_CLOSE])
        first = forced_call(ctx, sampling, schemas) if cfg.tool_choice == "required" and schemas else sampling
        calls = errors = 0
        answer, finish, turn = "", None, 0
        for turn in range(max_turns):
            res = await ctx.generate(trace.tokens, first if turn == 0 else sampling)
            trace.add_policy(res)
            answer = ctx.decode(res.output_ids)
            items = parse_tool_calls(answer)
            if not items or res.finish_reason == "abort":
                break
            if turn == max_turns - 1:
                finish = "tool_limit"
                break
            texts = []
            t0 = time.monotonic()
            for item in items:
                if isinstance(item, str):
                    texts.append(item)
                    errors += 1
                    continue
                outcome = await tools.call(item)
                calls += 1
                errors += not outcome.ok
                texts.append(outcome.text)
            trace.timings["tools"] += time.monotonic() - t0
            new = [{"role": "tool", "content": t} for t in texts]
            trace.add_env(ctx.continuation_ids(messages, answer, ctx.decode(res.output_ids, False), new,
                                               plain_text=plain_response(texts), tools=schemas or None))
            messages = messages + [{"role": "assistant", "content": answer}] + new
        ctx.stats.tool_calls += calls
        ctx.stats.tool_errors += errors
        t0 = time.monotonic()
        rr = await ctx.score(task, [answer])
        trace.timings["reward"] = time.monotonic() - t0
        trace.metrics.update(reward_metrics(rr, 0))
        trace.metrics.update({"tool_calls": calls, "tool_errors": errors, "turns": turn + 1})
        return trace.to_sample(rr.rewards[0], finish)
