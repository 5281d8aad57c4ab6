"""Held-out evaluation of an agent workflow (`rollout.workflow: agent`): each row is `eval.samples` episodes
of the configured agent (entry function, external command or agent service) through an OpenAI-compatible
endpoint served by the evaluating process, on its engine at the evaluated version. The endpoint's default
sampling is the eval's (greedy unless `eval.greedy: false`; an agent that sets temperature itself
overrides it). An episode's reward is what the agent returned or POSTed, else the reward service's score of
its final answer, as in training (rollout_service/workflows/agent.py). Beside the reward it counts the
episodes in which the model made at least one tool call (`tool_call_rate`), the model calls per episode and
the tool calls per episode.
An episode that fails scores 0 and counts as an error; its reason is logged (warning, logger jetrl.eval)."""

from __future__ import annotations

import logging

from rollout_service.agents.session import EpisodeError
from rollout_service.tools import ToolRegistry
from rollout_service.workflows.agent import AgentWorkflow, score_unscored
from rollout_service.workflows.base import WorkflowContext
from shared.config import JetrlConfig
from shared.config.eval import EvalConfig
from shared.contract.messages import PromptTask

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


def tool_calls(calls) -> int:
    """The tool calls in the recorded calls' replies."""
    return sum(len(c.reply.get("tool_calls") or ()) for c in calls if c.reply is not None)


class AgentEpisodes:
    """The agent side of the Evaluator: start() serves the endpoint, one(payload, index) runs a row's
    episodes (AgentWorkflow.play, as in training), close() stops it. `tool_use()` sums the rows run since
    `reset()`."""

    def __init__(self, cfg: JetrlConfig, ecfg: EvalConfig, engine, tokenizer, reward):
        from rollout_service.agents.server import AgentServer

        self.cfg = eval_sampling_config(cfg, ecfg)
        self.ecfg = ecfg
        self.ctx = WorkflowContext(engine=engine, tokenizer=tokenizer, reward=reward, tools=ToolRegistry(),
                                   cfg=self.cfg)
        self.workflow = AgentWorkflow(**dict(cfg.rollout.workflow_args))
        self.server = self.ctx.agents = AgentServer(self.ctx)
        self.reset()

    def reset(self) -> None:
        self.episodes = self.tool_episodes = self.calls = self.tool_calls = 0

    def tool_use(self) -> tuple[float, float, float] | None:
        """(share of episodes with a tool call, model calls per episode, tool calls per episode) since reset();
        None before any."""
        if not self.episodes:
            return None
        return self.tool_episodes / self.episodes, self.calls / self.episodes, self.tool_calls / self.episodes

    async def start(self, nc=None) -> None:
        self.server.nc = nc  # an agent service (workflow_args.service) takes episodes over NATS
        await self.server.start()

    async def close(self) -> None:
        await self.workflow.close()
        await self.server.close()

    async def one(self, payload: dict, index: int) -> tuple[list[float], int, list[str]]:
        """(rewards, failed episodes and failed scores, final answers) of one row's `eval.samples` episodes."""
        task = PromptTask(run=self.cfg.run, prompt_id=f"eval-{index}", epoch=0, payload=payload,
                          group_size=self.ecfg.samples)
        sessions, outcomes = await self.workflow.play(self.ctx, task)
        rewards: list[float | None] = []
        for i, o in enumerate(outcomes):
            if isinstance(o, BaseException) and not isinstance(o, EpisodeError):
                raise o
            if isinstance(o, EpisodeError):  # scored 0 and counted as an error; the reason goes to the log
                log.warning("row %d, episode %d failed: %s", index, i, o)
            rewards.append(0.0 if isinstance(o, EpisodeError) else o)
        metrics = await score_unscored(self.ctx, task, sessions, rewards)
        errors = sum(isinstance(o, EpisodeError) for o in outcomes) + sum("reward_error" in m for m in metrics)
        self.episodes += len(sessions)
        used = [tool_calls(s.calls) for s in sessions]
        self.tool_episodes += sum(n > 0 for n in used)
        self.tool_calls += sum(used)
        self.calls += sum(len(s.calls) for s in sessions)
        return [float(r) for r in rewards], errors, [s.final_answer() for s in sessions]
