"""agent: any agent that talks to the worker's OpenAI-compatible endpoint (docs/agents.md).

`rollout.workflow: agent` with `workflow_args` `entry: "pkg.mod:run"` (an `async def run(client, task)`
in the worker; `args: {...}` are passed to it as keyword arguments: an adapter's settings), `command: "node agent.mjs"` (an external command per episode) or `service: NAME` (a
long-running agent service taking episodes on `jetrl.<run>.agents.NAME`). Each of a group's
`group_size` episodes gets a session; its recorded calls become samples (agents/trajectory.py) with the
episode's reward: the one the agent returned or POSTed to `.../sessions/<id>/reward`, else the reward
service's score of its final answer. An agent that fails (raises or exits non-zero, runs past
rollout.agent.timeout_s, or keeps calling past rollout.agent.max_calls) fails its whole group: the prompt
is dead-lettered with the reason (consumer.Reject; the endpoint's last refusal of its requests first, if
any), or retried when rollout.agent.retry_failed is set.
"""

from __future__ import annotations

import asyncio
import time

from rollout_service.agents.runners import CommandRunner, EntryRunner, ServiceRunner
from rollout_service.agents.session import EpisodeError, Session
from rollout_service.agents.trajectory import episode_samples
from rollout_service.workflows.base import Workflow, WorkflowContext, WorkflowLoadError, reward_metrics
from shared.contract import consumer, subjects
from shared.contract.messages import PromptTask, Sample


class AgentFailed(Exception):
    """An episode failed and rollout.agent.retry_failed is set: the prompt is nak'ed and retried."""


class AgentWorkflow(Workflow):
    name = "agent"

    def __init__(self, entry: str = "", command: str | list[str] = "", service: str = "", args: dict | None = None):
        if sum(map(bool, (entry, command, service))) != 1:
            raise WorkflowLoadError("the agent workflow needs exactly one of workflow_args.entry "
                                    "('package.module:run'), workflow_args.command (a command line) and "
                                    "workflow_args.service (the name of an agent service on NATS)")
        if args and not entry:
            raise WorkflowLoadError("rollout.workflow_args.args are keyword arguments of an entry agent "
                                    "(workflow_args.entry); a command or service agent takes none")
        self.service = service
        if entry:
            self.runner, self.what = EntryRunner(entry, args), f"entry {entry}"
        elif command:
            self.runner, self.what = CommandRunner(command), f"command {command!r}"
        else:
            try:
                subjects.check_token(service, "agent service name")
            except ValueError as exc:
                raise WorkflowLoadError(f"rollout.workflow_args.service={service!r}: {exc}") from None
            self.runner, self.what = None, f"service {service}"  # needs the run id: built at the first task

    async def run(self, ctx: WorkflowContext, task: PromptTask) -> list[Sample]:
        sessions, outcomes = await self.play(ctx, task)
        failures = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
        if failures:
            i, exc = failures[0]
            if not isinstance(exc, EpisodeError):
                raise exc
            reason = f"agent ({self.what}) episode {i} of {task.group_id}: {exc}"
            if len(failures) > 1:
                reason += f" (and {len(failures) - 1} more failed episode(s))"
            raise AgentFailed(reason) if ctx.cfg.rollout.agent.retry_failed else consumer.Reject(reason)
        rewards: list[float | None] = list(outcomes)
        metrics = await score_unscored(ctx, task, sessions, rewards)
        samples = []
        for s, r, m in zip(sessions, rewards, metrics, strict=False):
            for sample in episode_samples(s.calls, float(r)):
                sample.metrics.update(m)
                sample.metrics.update({"episode": s.index, "episode_calls": len(s.calls),
                                       "reward_source": "agent" if m == {} else "reward_service"})
                samples.append(sample)
        return samples

    async def play(self, ctx: WorkflowContext, task: PromptTask) -> tuple[list[Session], list]:
        """Run the agent in `task.group_size` sessions of `task` on ctx.agents (the endpoint); the sessions
        (closed, their calls kept) and each one's outcome: its reward, None when the agent gave none, or the
        exception it failed with (EpisodeError for an agent's failure). `run` and `jetrl eval` share it."""
        if ctx.agents is None:
            raise RuntimeError("the agent workflow needs the worker's OpenAI-compatible endpoint (ctx.agents)")
        if self.runner is None:
            self.runner = ServiceRunner(self.service, ctx.cfg.run)
        if isinstance(self.runner, ServiceRunner):
            self.runner.nc = ctx.agents.nc
        store = ctx.agents.store
        sessions = [store.open(task, i) for i in range(task.group_size)]
        try:
            outcomes = await asyncio.gather(*(self.episode(ctx, s) for s in sessions), return_exceptions=True)
        finally:
            for s in sessions:
                store.close(s)
        return sessions, list(outcomes)

    async def close(self) -> None:
        """Release what the runner holds (the entry runner's connection pool); the worker calls it at exit."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            await close()

    async def episode(self, ctx: WorkflowContext, session: Session) -> float | None:
        """Run the agent for one session; its reward (returned, else POSTed, else None). A failure's reason
        starts with the endpoint's last refusal of the session's requests, if any (agents/refusals.py)."""
        try:
            return await self._episode(ctx, session)
        except EpisodeError as exc:
            refused = session.refusal_reason()
            if refused:
                raise EpisodeError(f"{refused}; {exc}") from None
            raise

    async def _episode(self, ctx: WorkflowContext, session: Session) -> float | None:
        limit = ctx.cfg.rollout.agent.timeout_s
        endless = (f"never ended its episode: kept calling past rollout.agent.max_calls = {session.max_calls}")
        try:
            returned = await asyncio.wait_for(self.runner(session, ctx.agents.store), limit)
        except asyncio.TimeoutError:
            if session.refused_calls:
                raise EpisodeError(f"{endless} until rollout.agent.timeout_s = {limit:g} s") from None
            raise EpisodeError(f"still running after rollout.agent.timeout_s = {limit:g} s (stopped; "
                               f"{len(session.calls)} calls made)") from None
        except EpisodeError as exc:
            if session.refused_calls:
                raise EpisodeError(f"{endless} ({exc})") from None
            raise
        if session.refused_calls:
            raise EpisodeError(endless)
        if not session.calls:
            raise EpisodeError("ended without a single model call (nothing to train on)")
        return returned if returned is not None else session.reward


async def score_unscored(ctx: WorkflowContext, task: PromptTask, sessions: list[Session],
                         rewards: list[float | None]) -> list[dict]:
    """Fill in place each None of `rewards` with the reward service's score of its session's final answer;
    each episode's reward metrics (reward_metrics, with `reward_error` where scoring failed, and reward_s;
    {} for a reward the agent gave)."""
    metrics: list[dict] = [{} for _ in sessions]
    unscored = [i for i, r in enumerate(rewards) if r is None]
    if unscored:
        t0 = time.monotonic()
        rr = await ctx.score(task, [sessions[i].final_answer() for i in unscored])
        for j, i in enumerate(unscored):
            rewards[i] = rr.rewards[j]
            metrics[i] = reward_metrics(rr, j) | {"reward_s": time.monotonic() - t0}
    return metrics
