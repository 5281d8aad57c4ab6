"""The one interface every inference engine implements (local, vllm, sglang, sim).

Workflows only see this: they send token-id prompts and get back, per generated token, its id, the
behaviour log-probability and the policy version that produced it. A weight swap may happen in the
middle of a generation; `versions` then switches value at that token.
"""

from __future__ import annotations

import abc
import uuid
from dataclasses import dataclass, field
from typing import Any

from shared.config import SamplingConfig


class EngineDead(RuntimeError):
    """The engine can serve no more requests (e.g. the inference server it started exited). A rollout
    worker stops on it, so its supervisor restarts it with a fresh engine, instead of failing every task."""


class PromptTooLong(ValueError):
    """A prompt over the engine's limit (the model's context, rollout.service.max_prompt_tokens). The agent
    endpoint answers it with HTTP 400; a rollout worker dead-letters the prompt's group with the message."""


def prompt_limit(configured: int, context: int | None) -> int | None:
    """Longest prompt in tokens: rollout.service.max_prompt_tokens (0 = none) and the model's context less
    one token (room for one generated token); None when neither is known."""
    limits = [x for x in (configured or None, context - 1 if context else None) if x]
    return min(limits) if limits else None


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)  # stop strings (the stop string is kept in the output)
    stop_token_ids: list[int] = field(default_factory=list)  # in addition to the tokenizer's EOS
    seed: int | None = None
    ignore_eos: bool = False  # keep generating past EOS (benchmarks with fixed lengths)
    allowed_token_ids: list[int] = field(default_factory=list)  # sample only these ids ([] = any)
    # constrained decoding (engines/constraint.py): a JSON schema or grammar the output must match; an
    # engine whose constraint_kinds lack its kind refuses it (Engine.check_support), none ignores it
    constraint: Any = None
    top_logprobs: int = 0  # also return this many most likely tokens (and their logprobs) per position

    @classmethod
    def from_config(cls, cfg: SamplingConfig, overrides: dict[str, Any] | None = None) -> SamplingParams:
        """Defaults from the run config, overridden per task (PromptTask.sampling). Unknown keys are errors."""
        values = cfg.model_dump()
        for k, v in (overrides or {}).items():
            if k not in values:
                raise ValueError(f"sampling.{k}: unknown sampling parameter (known: {', '.join(values)})")
            if k == "allowed_token_ids" and list(v) != list(values[k]):
                # The trainer masks its logprobs with the run's list; a per-task list would train on
                # logprobs of a different distribution than the one sampled.
                raise ValueError("sampling.allowed_token_ids: set it in the run config "
                                 "(rollout.sampling.allowed_token_ids), not per task")
            values[k] = v
        return cls(**values)


def check_sampling(p: SamplingParams) -> None:
    """Raise ValueError naming the field of an impossible sampling setting."""
    if p.temperature < 0:
        raise ValueError(f"sampling.temperature: must be >= 0, got {p.temperature}")
    if not 0 < p.top_p <= 1:
        raise ValueError(f"sampling.top_p: must be in (0, 1], got {p.top_p}")
    if p.top_k < 0:
        raise ValueError(f"sampling.top_k: must be >= 0 (0 = off), got {p.top_k}")
    if p.max_new_tokens < 1:
        raise ValueError(f"sampling.max_new_tokens: must be >= 1, got {p.max_new_tokens}")
    if any(not s for s in p.stop):
        raise ValueError("sampling.stop: empty stop string")


@dataclass
class GenerateRequest:
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class GenerateResult:
    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]  # behaviour log-probability of each output token
    versions: list[int]  # policy version that produced each output token
    finish_reason: str  # "stop" | "length" | "abort"
    timings: dict[str, float] = field(default_factory=dict)  # seconds: queue, prefill, decode, total
    # with sampling.top_logprobs k: per output token, the k most likely (token id, logprob) of the
    # distribution it was drawn from (the same one its `logprobs` entry comes from)
    top_logprobs: list[list[tuple[int, float]]] | None = None


class Engine(abc.ABC):
    """Async inference engine. All methods are safe to call concurrently from many workflow tasks."""

    name: str = "engine"
    context_tokens: int | None = None  # the model's context in tokens, where the engine knows it (after start)
    configured_max_prompt: int = 0  # rollout.service.max_prompt_tokens (0 = the context's)
    # what this engine honours beyond plain sampling: the SamplingParams.constraint kinds it enforces and
    # how many top_logprobs it returns; check_support refuses the rest
    constraint_kinds: tuple[str, ...] = ()
    max_top_logprobs: int = 0

    @property
    def max_prompt_tokens(self) -> int | None:
        """The longest prompt `generate` accepts (None = no known limit)."""
        return prompt_limit(self.configured_max_prompt, self.context_tokens)

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """PromptTooLong for a prompt over `max_prompt_tokens` (check_request, which every engine's generate calls)."""
        limit = self.max_prompt_tokens
        if limit is not None and len(prompt_ids) > limit:
            raise PromptTooLong(f"prompt of {len(prompt_ids)} tokens is over the limit of {limit} "
                                f"(the model's context {self.context_tokens}, rollout.service.max_prompt_tokens "
                                f"{self.configured_max_prompt or 'unset'})")

    def check_request(self, req: GenerateRequest) -> None:
        """What every engine's generate checks first, raising before any work: the sampling settings
        (check_sampling), those this engine cannot honour (check_support), an empty prompt, and
        the prompt's length (check_prompt)."""

        check_sampling(req.sampling)
        self.check_support(req.sampling)
        if not req.prompt_ids:
            raise ValueError("generate: prompt_ids is empty")
        self.check_prompt(req.prompt_ids)

    def check_support(self, p: SamplingParams) -> None:
        """ValueError naming the sampling field this engine cannot honour (never silently ignored)."""
        kind = getattr(p.constraint, "kind", None)
        if p.constraint is not None and kind not in self.constraint_kinds:
            raise ValueError(f"sampling.constraint: the {self.name} engine cannot enforce a {kind} constraint "
                             f"(it enforces: {', '.join(self.constraint_kinds) or 'none'})")
        if p.top_logprobs and p.top_logprobs > self.max_top_logprobs:
            raise ValueError(f"sampling.top_logprobs: the {self.name} engine returns at most "
                             f"{self.max_top_logprobs} top logprobs per token, asked for {p.top_logprobs}")

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Policy version of the weights now loaded (tokens generated from now on carry it)."""

    async def start(self) -> None:  # noqa: B027 (optional hook)
        """Load the model / connect to the server. Called once before the first generate."""

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release resources; in-flight generations end with finish_reason "abort"."""

    @abc.abstractmethod
    async def generate(self, req: GenerateRequest) -> GenerateResult:
        """Generate for one request. A prompt over `max_prompt_tokens` raises PromptTooLong; a cancelled
        call aborts its request in the engine (its batch slots are freed, a server is told to abort it)."""

    @abc.abstractmethod
    async def update_weights(
        self, version: int, path: str | None = None, state_dict: dict | None = None
    ) -> None:
        """Swap in new weights (from a model dir or an in-memory state dict) between decode steps;
        in-flight requests continue under the new weights and their next tokens carry `version`."""

    @abc.abstractmethod
    async def pause(self) -> None:
        """Stop starting decode steps (in-flight requests wait, nothing is lost)."""

    @abc.abstractmethod
    async def resume(self) -> None: ...

    @abc.abstractmethod
    async def abort(self, request_id: str | None = None) -> int:
        """Abort one request (or all when None); aborted requests return finish_reason "abort".
        Returns how many were aborted."""

    async def health(self) -> dict[str, Any]:
        return {"ok": True, "engine": self.name, "version": self.version}

    def stats(self) -> dict[str, float]:
        """Counters for metrics: tokens generated, requests running/waiting, tokens/s, ..."""
        return {}
