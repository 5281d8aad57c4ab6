"""The messages services exchange (docs/protocol.md). Encoding lives in shared/contract/codec.py.

Each message is a dataclass; `metadata={"wire": code}` gives its msgpack type:
str, int, float, bool, bytes, map, list, any, i32/f32/u8 (packed little-endian arrays), list[X],
a nested structure name (Sample), and a trailing `?` for "may be nil". Unknown fields read from the
wire are kept in `extra` and written back on encode.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shared.contract.codec import register_message, register_nested


def wire(code: str, **kw: Any) -> Any:
    return field(metadata={"wire": code}, **kw)


# A sample's weight is at most (max draws / kept) x (kept / group size) <= max draws; far above any real budget.
MAX_SAMPLE_WEIGHT = 1e4


def _empty_i32() -> np.ndarray:
    return np.zeros(0, dtype=np.int32)


# --- prompts --------------------------------------------------------------------------------------


@register_message
@dataclass
class PromptTask:
    """One prompt to roll out `group_size` times. Subject `jetrl.<run>.prompts`, Nats-Msg-Id = group id."""

    SCHEMA = "PromptTask"
    V = 1
    run: str = wire("str")
    prompt_id: str = wire("str")
    epoch: int = wire("int")
    # payload: {"prompt": str} or {"messages": [{"role","content"}...]}, plus "reference" and "metadata".
    payload: dict = wire("map")
    dataset: str = wire("str", default="")
    workflow: str = wire("str", default="single_turn")
    group_size: int = wire("int", default=1)
    # sampling: temperature, top_p, top_k, max_new_tokens, stop, stop_token_ids, seed (all optional).
    sampling: dict = wire("map", default_factory=dict)
    released_at_version: int = wire("int", default=0)
    released_at: float = wire("float", default_factory=time.time)  # unix seconds
    extra: dict = field(default_factory=dict)

    @property
    def group_id(self) -> str:
        return f"{self.run}:{self.epoch}:{self.prompt_id}"

    def validate(self) -> tuple[str, str] | None:
        if self.group_size < 1:
            return ".group_size", f"must be >= 1, got {self.group_size}"
        return None


# --- trajectories ---------------------------------------------------------------------------------


@register_nested
@dataclass
class Sample:
    """One generated sequence: prompt tokens followed by policy and environment (tool) tokens.

    All four arrays have one entry per token of `tokens`. For prompt and environment tokens
    loss_mask = 0, logprobs = 0 and versions = -1; for policy tokens loss_mask = 1, logprobs is the
    behaviour log-probability and versions the policy version that produced the token.
    """

    tokens: np.ndarray = wire("i32")
    loss_mask: np.ndarray = wire("u8")
    logprobs: np.ndarray = wire("f32")
    versions: np.ndarray = wire("i32")
    prompt_len: int = wire("int", default=0)
    reward: float = wire("float", default=0.0)
    finish_reason: str = wire("str", default="stop")  # stop | length | abort | error | tool_limit
    turns: np.ndarray = wire("i32", default_factory=_empty_i32)  # token offset where each turn starts
    timings: dict = wire("map", default_factory=dict)  # seconds: generate, reward, tools, ...
    metrics: dict = wire("map", default_factory=dict)  # scorer metrics, tool calls, ...
    # multiplies the sample's advantage: the inverse of its chance to be kept when adaptive sampling drew more
    # samples than the group holds (rollout_service/adaptive.py); 1.0 otherwise
    weight: float = wire("float", default=1.0)
    extra: dict = field(default_factory=dict)

    def validate(self) -> tuple[str, str] | None:
        n = len(self.tokens)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                return f".{name}", f"has {len(getattr(self, name))} entries, tokens has {n}"
        if not 0 <= self.prompt_len <= n:
            return ".prompt_len", f"{self.prompt_len} is outside 0..{n}"
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 < w <= MAX_SAMPLE_WEIGHT:
            return ".weight", f"{w!r} is outside (0, {MAX_SAMPLE_WEIGHT}]"
        return None

    @property
    def num_generated(self) -> int:
        return int(np.count_nonzero(self.loss_mask))

    def oldest_version(self) -> int:
        """Oldest policy version among generated tokens (-1 when the sample has none)."""
        v = self.versions[self.loss_mask.astype(bool)]
        return int(v.min()) if len(v) else -1


@register_message
@dataclass
class TrajectoryGroup:
    """The scored samples of one prompt task. Subject `jetrl.<run>.trajectories`, Nats-Msg-Id = group_id."""

    SCHEMA = "TrajectoryGroup"
    V = 1
    run: str = wire("str")
    prompt_id: str = wire("str")
    epoch: int = wire("int")
    samples: list = wire("list[Sample]")
    workflow: str = wire("str", default="")
    worker: str = wire("str", default="")
    released_at_version: int = wire("int", default=0)
    created_at: float = wire("float", default_factory=time.time)
    metrics: dict = wire("map", default_factory=dict)
    # adaptive sampling's account of every draw for this prompt ({} when it was off): drawn (samples
    # generated), successes, mean and std of all drawn rewards (the advantage baseline), signal (the draws had
    # a reward spread), rounds. See rollout_service/adaptive.py.
    adaptive: dict = wire("map", default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def group_id(self) -> str:
        return f"{self.run}:{self.epoch}:{self.prompt_id}"

    def validate(self) -> tuple[str, str] | None:
        a = self.adaptive
        if not a:
            return None
        drawn, mean, std = a.get("drawn"), a.get("mean"), a.get("std")
        if isinstance(drawn, bool) or not isinstance(drawn, int) or drawn < len(self.samples):
            return ".adaptive.drawn", f"{drawn!r} is not a count of at least the group's {len(self.samples)} samples"
        for name, v in (("mean", mean), ("std", std)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > 1e12:
                return f".adaptive.{name}", f"{v!r} is not a finite number"
        if std < 0:
            return ".adaptive.std", f"{std!r} is negative"
        return None


# --- reward ---------------------------------------------------------------------------------------


@register_message
@dataclass
class RewardRequest:
    """Score the completions of one prompt. Request/reply on `jetrl.reward.<task>`.

    A whole group is one request: `completions` holds N texts that share the prompt and reference.
    """

    SCHEMA = "RewardRequest"
    V = 1
    task: str = wire("str")
    completions: list = wire("list[str]")
    reference: Any = wire("any", default=None)
    payload: dict = wire("map", default_factory=dict)  # the PromptTask payload (prompt, metadata)
    request_id: str = wire("str", default="")
    completion_ids: list | None = wire("list[i32]?", default=None)  # token ids per completion, optional
    timeout_s: float | None = wire("float?", default=None)  # scorer time limit the caller wants
    extra: dict = field(default_factory=dict)


@register_message
@dataclass
class RewardResult:
    """Answer to a RewardRequest: one reward, metrics map and error (nil or text) per completion.

    `error` (top level) is set when the request itself was unusable; then `rewards` are all 0.
    """

    SCHEMA = "RewardResult"
    V = 1
    task: str = wire("str")
    rewards: list = wire("list[float]")
    request_id: str = wire("str", default="")
    metrics: list = wire("list[map]", default_factory=list)
    errors: list = wire("list[str?]", default_factory=list)
    error: str | None = wire("str?", default=None)
    elapsed_s: float = wire("float", default=0.0)
    extra: dict = field(default_factory=dict)


# --- weights --------------------------------------------------------------------------------------


@register_message
@dataclass
class WeightVersion:
    """Latest committed weights of a run: value of KV key `<run>` in bucket `jetrl_weights`."""

    SCHEMA = "WeightVersion"
    V = 1
    run: str = wire("str")
    version: int = wire("int")
    step: int = wire("int", default=0)
    manifest_url: str = wire("str", default="")
    # files: [{"name": str, "size": int, "sha256": str}]
    files: list = wire("list[map]", default_factory=list)
    sha256: str = wire("str", default="")  # sha256 of the manifest (manifest_sha256); readers check it (weight_store/verify.py)
    created_at: float = wire("float", default_factory=time.time)
    # groups the steps behind this version trained short of full batches (drained last batches, schedule.batch_wait_s): the
    # controller's admission bound takes them off (controller/ledger.py:admission_bound)
    short: int = wire("int", default=0)
    extra: dict = field(default_factory=dict)


# --- events and dead letters ----------------------------------------------------------------------


# Stage names of the trainer's "step" event (`timings`, `rollout_timings`) and the rollout "weights" event
# (docs/protocol.md, "Stage timings"): the trainer, controller and tracker read them by these names.
TRAINER_STAGES = ("wait", "prepare", "forward", "backward", "optimizer", "train_other", "publish", "events",
                  "checkpoint")
ROLLOUT_STAGES = ("generate", "reward", "tools", "queue_wait")
WEIGHT_STAGES = ("fetch", "swap")
# Keys of an LLM judge's per-completion scores in Sample.metrics (the reward service's `criterion/<name>` and
# `pairwise/...` metrics, prefixed `reward_` by the rollout worker): the trainer's "step" event carries their
# batch means under the same keys, and the tracker and the dashboard plot them.
JUDGE_METRIC_PREFIXES = ("reward_criterion/", "reward_pairwise/")


@register_message
@dataclass
class Event:
    """Metrics and lifecycle events. Subject `jetrl.<run>.events.<service>`.

    Kinds (docs/protocol.md, "Event kinds"): "health" (every service), "step" and "groups" (trainer),
    "published" and "metrics" (rollout); readers ignore kinds they do not know.
    """

    SCHEMA = "Event"
    V = 1
    run: str = wire("str")
    service: str = wire("str")
    kind: str = wire("str")
    data: dict = wire("map", default_factory=dict)
    instance: str = wire("str", default="")
    time: float = wire("float", default_factory=time.time)
    extra: dict = field(default_factory=dict)


@register_message
@dataclass
class DeadLetter:
    """A message that could not be processed. Subject `jetrl.<run>.dlq.<source>`; nothing is silently dropped."""

    SCHEMA = "DeadLetter"
    V = 1
    run: str = wire("str")
    source: str = wire("str")  # consumer (or service) that gave up on the message
    subject: str = wire("str")  # subject the original was published on
    reason: str = wire("str")
    original: bytes = wire("bytes")  # the original payload, byte for byte (b"" when it would not fit, see below)
    delivery_count: int = wire("int", default=1)
    stream: str = wire("str", default="")
    stream_seq: int = wire("int", default=0)
    headers: dict = wire("map", default_factory=dict)
    time: float = wire("float", default_factory=time.time)
    # Size and sha256 of the original payload; when the dead letter with the payload would exceed the
    # server's max_payload, `original` is empty and these two (with reason and headers) are what is kept.
    original_size: int = wire("int", default=-1)
    original_sha256: str = wire("str", default="")
    extra: dict = field(default_factory=dict)


ALL_MESSAGES = (PromptTask, TrajectoryGroup, RewardRequest, RewardResult, WeightVersion, Event, DeadLetter)
