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


class Engine(abc.ABC):
    """Async inference engine. All methods are safe to call concurrently from many workflow tasks."""

    name: str = "engine"

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Policy version of the weights now loaded (tokens generated from now on carry it)."""

    async def start(self) -> None:  # noqa: B027 (optional hook)
        """Load the model / connect to the server. Called once before the first generate."""

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release resources; in-flight generations end with finish_reason "abort"."""

    @abc.abstractmethod
    async def generate(self, req: GenerateRequest) -> GenerateResult: ...

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
