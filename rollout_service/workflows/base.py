"""The workflow API: what a workflow gets (WorkflowContext) and the pieces it builds samples from.

A workflow turns one PromptTask into the samples of one group:

    class MyWorkflow(Workflow):
        async def run(self, ctx: WorkflowContext, task: PromptTask) -> list[Sample]:
            prompt = ctx.render_prompt(task.payload)
            ...

`Trace` accumulates one sample token by token: prompt and environment tokens are masked out of the loss
(mask 0, logprob 0, version -1); policy tokens carry the engine's logprobs and per-token versions.
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rollout_service.engines.base import (
    Engine,
    GenerateRequest,
    GenerateResult,
    PromptTooLong,
    SamplingParams,
)
from rollout_service.tools.base import ToolRegistry
from shared.config import JetrlConfig
from shared.contract.consumer import Transient
from shared.contract.messages import PromptTask, RewardResult, Sample


class WorkflowLoadError(ValueError):
    """rollout.workflow (or an agent's entry, command or service) names nothing loadable; the message says why
    and what was tried."""


@dataclass
class WorkflowStats:
    """Counters the service turns into metrics (summed over every workflow call of one worker)."""

    generated_tokens: int = 0
    tool_calls: int = 0
    tool_errors: int = 0


@dataclass
class WorkflowContext:
    """Everything a workflow may use. One context per worker, shared by concurrent tasks."""

    engine: Engine
    tokenizer: Any
    reward: Any  # reward_service.client.RewardClient (or anything with the same `score`)
    tools: ToolRegistry
    cfg: JetrlConfig
    stats: WorkflowStats = field(default_factory=WorkflowStats)
    agents: Any = None  # rollout_service.agents.server.AgentServer: the OpenAI-compatible endpoint, when served
    _chars_per_token: int | None = field(default=None, repr=False)

    # --- text <-> tokens ------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`. A text longer than the engine's prompt limit could possibly tokenize to
        (limit x the tokenizer's longest token, in characters) raises PromptTooLong unread, so a huge
        message costs a length check, not a tokenization."""
        self.check_prompt_chars(len(text))
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def check_prompt_chars(self, chars: int) -> None:
        limit = getattr(self.engine, "max_prompt_tokens", None)
        if limit is not None and chars > limit * self.chars_per_token_ceiling:
            raise PromptTooLong(f"prompt of {chars} characters is over the limit of {limit} tokens (at most "
                                f"{self.chars_per_token_ceiling} characters per token with this tokenizer; the "
                                "model's context, rollout.service.max_prompt_tokens)")

    @property
    def chars_per_token_ceiling(self) -> int:
        """The most characters one token of this tokenizer stands for (its longest vocabulary entry): a text
        of c characters is at least c / this many tokens."""
        if self._chars_per_token is None:
            try:
                vocab = self.tokenizer.get_vocab()
                self._chars_per_token = max(8, max(len(t) for t in vocab))
            except Exception:  # no vocabulary to look at: a generous bound
                self._chars_per_token = 64
        return self._chars_per_token

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_prompt(self, payload: dict, tools: list[dict] | None = None, system: str = "") -> list[int]:
        """Prompt token ids: the chat template when the tokenizer has one, else the plain prompt text."""
        return self.encode(self.render_prompt_text(payload, tools, system))

    def render_prompt_text(self, payload: dict, tools: list[dict] | None = None, system: str = "") -> str:
        messages = prompt_messages(payload, system)
        if self.has_chat_template:
            return self.apply_template(messages, tools=tools, add_generation_prompt=True)
        return "\n".join(m["content"] for m in messages)

    def apply_template(self, messages: list[dict], tools: list[dict] | None = None,
                       add_generation_prompt: bool = False) -> str:
        kw: dict[str, Any] = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **kw)

    def continuation_ids(self, messages: list[dict], assistant_text: str, raw_output: str,
                         new_messages: list[dict], plain_text: str, tools: list[dict] | None = None) -> list[int]:
        """Tokens that follow a model turn to add `new_messages` (feedback, tool results) and open the
        next assistant turn. With a chat template: the rendered difference (closing the assistant turn
        where the model's output did not); without one: `plain_text`."""
        if not self.has_chat_template:
            return self.encode(plain_text)
        head = self.apply_template(messages, tools, add_generation_prompt=True)
        with_answer = messages + [{"role": "assistant", "content": assistant_text}]
        closed = self.apply_template(with_answer, tools)
        full = self.apply_template(with_answer + new_messages, tools, add_generation_prompt=True)
        if closed.startswith(head + assistant_text) and full.startswith(closed):
            closing = closed[len(head) + len(assistant_text):]
            # The model usually generated the first part of the closing itself (e.g. <|im_end|>).
            for k in range(len(closing), 0, -1):
                if raw_output.endswith(closing[:k]):
                    closing = closing[k:]
                    break
            return self.encode(closing + full[len(closed):])
        return self.encode(self.apply_template(new_messages, tools, add_generation_prompt=True))

    # --- engine and reward --------------------------------------------------------------------
    def sampling(self, task: PromptTask, index: int = 0, extra_stop: list[str] | None = None) -> SamplingParams:
        """Run defaults overridden by the task's sampling; sample `index` of a group gets seed + index."""
        sp = SamplingParams.from_config(self.cfg.rollout.sampling, task.sampling)
        if sp.seed is not None:
            sp = replace(sp, seed=sp.seed + index)
        if extra_stop:
            sp = replace(sp, stop=list(sp.stop) + [s for s in extra_stop if s not in sp.stop])
        return sp

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        t0 = time.monotonic()
        res = await self.engine.generate(GenerateRequest(prompt_ids=list(prompt_ids), sampling=sampling))
        res.timings.setdefault("total", time.monotonic() - t0)
        self.stats.generated_tokens += len(res.output_ids)
        return res

    async def score(self, task: PromptTask, completions: list[str],
                    completion_ids: list[list[int]] | None = None) -> RewardResult:
        """Score through the reward service (task = cfg.reward.task). A failed request (service down,
        timeout after retries) raises Transient, so the prompt is retried instead of published with
        made-up rewards; per-completion scoring errors stay in the result."""
        rr = await self.reward.score(self.cfg.reward.task, completions, task.payload.get("reference"),
                                     payload=task.payload, completion_ids=completion_ids)
        if rr.error:
            raise Transient(f"reward task {self.cfg.reward.task!r}: {rr.error}")
        if len(rr.rewards) != len(completions):
            raise Transient(f"reward task {self.cfg.reward.task!r}: {len(rr.rewards)} rewards for "
                            f"{len(completions)} completions")
        return rr


def prompt_messages(payload: dict, system: str = "") -> list[dict]:
    """Chat messages of a task payload: {"messages": [...]} or {"prompt": "..."}."""
    if "messages" in payload:
        msgs = [dict(m) for m in payload["messages"]]
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
            raise ValueError("payload.messages: every message needs 'role' and 'content'")
    elif "prompt" in payload:
        msgs = [{"role": "user", "content": str(payload["prompt"])}]
    else:
        raise ValueError(f"payload has neither 'prompt' nor 'messages' (keys: {sorted(payload)})")
    if system and not any(m["role"] == "system" for m in msgs):
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


class Trace:
    """One sample under construction: prompt, then alternating policy and environment segments."""

    def __init__(self, prompt_ids: list[int]):
        self.tokens: list[int] = list(prompt_ids)
        self.loss_mask: list[int] = [0] * len(prompt_ids)
        self.logprobs: list[float] = [0.0] * len(prompt_ids)
        self.versions: list[int] = [-1] * len(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.turns: list[int] = []  # token offset where each policy or environment segment starts
        self.timings: dict[str, float] = {"generate": 0.0, "reward": 0.0, "tools": 0.0}
        self.metrics: dict[str, Any] = {}
        self.finish_reason = "stop"
        self._t0 = time.monotonic()

    def add_policy(self, res: GenerateResult) -> None:
        n = len(res.output_ids)
        if len(res.logprobs) != n or len(res.versions) != n:
            raise ValueError(f"engine returned {n} tokens, {len(res.logprobs)} logprobs, {len(res.versions)} versions")
        self.turns.append(len(self.tokens))
        self.tokens += list(res.output_ids)
        self.loss_mask += [1] * n
        self.logprobs += [float(x) for x in res.logprobs]
        self.versions += [int(v) for v in res.versions]
        self.timings["generate"] += float(res.timings.get("total", 0.0))
        self.finish_reason = res.finish_reason

    def add_env(self, ids: list[int]) -> None:
        if not ids:
            return
        self.turns.append(len(self.tokens))
        self.tokens += list(ids)
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def to_sample(self, reward: float, finish_reason: str | None = None) -> Sample:
        self.timings["total"] = time.monotonic() - self._t0
        return Sample(
            tokens=np.asarray(self.tokens, dtype=np.int32),
            loss_mask=np.asarray(self.loss_mask, dtype=np.uint8),
            logprobs=np.asarray(self.logprobs, dtype=np.float32),
            versions=np.asarray(self.versions, dtype=np.int32),
            prompt_len=self.prompt_len,
            reward=float(reward),
            finish_reason=finish_reason or self.finish_reason,
            turns=np.asarray(self.turns, dtype=np.int32),
            timings=dict(self.timings),
            metrics=dict(self.metrics),
        )


def reward_metrics(rr: RewardResult, i: int) -> dict[str, Any]:
    """Scorer metrics and error of completion `i`, for Sample.metrics."""
    out: dict[str, Any] = {}
    if i < len(rr.metrics) and rr.metrics[i]:
        out.update({f"reward_{k}": v for k, v in rr.metrics[i].items()})
    if i < len(rr.errors) and rr.errors[i]:
        out["reward_error"] = rr.errors[i]
    return out


class Workflow(abc.ABC):
    """Turns one PromptTask into the samples of one group. Subclasses implement `run`.

    Constructed once per worker with the keyword arguments of `rollout.workflow_args`; `run` is called
    concurrently for many tasks, so keep per-task state in locals.
    """

    name: str = "workflow"

    def __init__(self, **kwargs: Any):
        if kwargs:
            raise TypeError(f"{type(self).__name__} takes no workflow_args (got {sorted(kwargs)})")

    @abc.abstractmethod
    async def run(self, ctx: WorkflowContext, task: PromptTask) -> list[Sample]: ...

    async def run_group(self, ctx: WorkflowContext, task: PromptTask, one) -> list[Sample]:
        """Helper: `await one(ctx, task, i)` for i in range(group_size), concurrently."""
        return list(await asyncio.gather(*(one(ctx, task, i) for i in range(task.group_size))))
