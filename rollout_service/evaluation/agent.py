"""Held-out evaluation of an agent workflow (`rollout.workflow: agent`): each row is `eval.samples` episodes
of the configured agent (entry function, external command or agent service) through an OpenAI-compatible
endpoint served by the evaluating process, on its engine at the evaluated version. The endpoint's default
sampling is the eval's (greedy unless `eval.greedy: false`; an agent that sets temperature itself
overrides it). An episode's reward is what the agent returned or POSTed, else the reward service's score of
its final answer, as in training (rollout_service/workflows/agent.py). Beside the reward it counts the
episodes in which the model made at least one tool call (`tool_call_rate`) and the model calls per episode.
An episode that fails scores 0 and counts as an error; its reason is logged (warning, logger jetrl.eval)."""

from __future__ import annotations

import asyncio
import logging

from rollout_service.agents.session import EpisodeError
from rollout_service.tools import ToolRegistry
from rollout_service.workflows.agent import AgentWorkflow
from rollout_service.workflows.base import WorkflowContext
from shared.config import JetrlConfig
from shared.config.eval import EvalConfig
from shared.messages import PromptTask

log = logging.getLogger("jetrl.eval")


def eval_sampling_config(cfg: JetrlConfig, ecfg: EvalConfig) -> JetrlConfig:
    """The run's config with the eval's sampling as the endpoint's defaults."""
    out = cfg.model_copy(deep=True)
    s = out.rollout.sampling
    if ecfg.greedy:
        s.temperature, s.top_p, s.top_k = 0.0, 1.0, 0
    else:
        s.temperature = ecfg.temperature
    if ecfg.max_new_tokens:
        s.max_new_tokens = ecfg.max_new_tokens
    return out


def used_tools(calls) -> bool:
    """Whether any recorded call's reply carried tool calls."""
    return any(c.reply is not None and c.reply.get("tool_calls") for c in calls)


class AgentEpisodes:
    """The agent side of the Evaluator: start() serves the endpoint, one(payload, index) runs a row's
    episodes, close() stops it. Counts tool-using episodes and calls in `tool_episodes`, `calls`, `episodes`."""

    def __init__(self, cfg: JetrlConfig, ecfg: EvalConfig, engine, tokenizer, reward):
        from rollout_service.agents.server import AgentServer

        self.cfg = eval_sampling_config(cfg, ecfg)
        self.ecfg = ecfg
        self.ctx = WorkflowContext(engine=engine, tokenizer=tokenizer, reward=reward, tools=ToolRegistry(),
                                   cfg=self.cfg)
        self.workflow = AgentWorkflow(**dict(cfg.rollout.workflow_args))
        self.server = self.ctx.agents = AgentServer(self.ctx)
        self.episodes = self.tool_episodes = self.calls = 0

    async def start(self, nc=None) -> None:
        self.server.nc = nc  # an agent service (workflow_args.service) takes episodes over NATS
        await self.server.start()

    async def close(self) -> None:
        await self.workflow.close()
        await self.server.close()

    async def one(self, payload: dict, index: int) -> tuple[list[float], int, list[str]]:
        """(rewards, failed episodes, final answers) of one row's `eval.samples` episodes."""
        task = PromptTask(run=self.cfg.run, prompt_id=f"eval-{index}", epoch=0, payload=payload,
                          group_size=self.ecfg.samples)
        store = self.server.store
        sessions = [store.open(task, i) for i in range(self.ecfg.samples)]
        try:
            outcomes = await asyncio.gather(*(self.workflow.episode(self.ctx, s) for s in sessions),
                                            return_exceptions=True)
        finally:
            for s in sessions:
                store.close(s)
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, EpisodeError):
                raise o
        for i, o in enumerate(outcomes):
            if isinstance(o, EpisodeError):  # scored 0 and counted as an error; the reason goes to the log
                log.warning("row %d, episode %d failed: %s", index, i, o)
        answers = [s.final_answer() for s in sessions]
        rewards = [0.0 if isinstance(o, BaseException) else o for o in outcomes]
        unscored = [i for i, r in enumerate(rewards) if r is None]
        errors = sum(isinstance(o, BaseException) for o in outcomes)
        if unscored:
            rr = await self.ctx.score(task, [answers[i] for i in unscored])
            for j, i in enumerate(unscored):
                rewards[i] = rr.rewards[j]
            errors += sum(1 for e in (rr.errors or []) if e)
        self.episodes += len(sessions)
        self.tool_episodes += sum(used_tools(s.calls) for s in sessions)
        self.calls += sum(len(s.calls) for s in sessions)
        return [float(r) for r in rewards], errors, answers
