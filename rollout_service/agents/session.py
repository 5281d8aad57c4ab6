"""One episode of an agent: a session with its own API key, the model calls recorded in it, and its reward.

Every completion the endpoint returns is recorded as a `Call`: the prompt token ids it was generated
from, and the engine's `GenerateResult` (output ids, behaviour logprobs, per-token versions), exactly as
the engine produced them. `SessionStore` is the worker's table of open sessions.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rollout_service.engines.base import GenerateResult


@dataclass
class Call:
    """One recorded completion (a request with n > 1 records n calls with the same prompt)."""

    prompt_ids: list[int]
    result: GenerateResult
    text: str  # the decoded output (special tokens kept out), as the agent received it
    messages: list[dict] | None = None  # chat calls: the request's normalised messages
    reply: dict | None = None  # chat calls: the assistant message returned
    tools: list[dict] | None = None  # chat calls: the tools offered
    raw: str = ""  # the decoded output with special tokens (for closing the turn in later prompts)
    index: int = 0  # choice index within its request

    @property
    def tokens(self) -> list[int]:
        """Prompt then completion: what a later call's prompt must start with to extend this one."""
        return list(self.prompt_ids) + list(self.result.output_ids)


class EpisodeError(Exception):
    """The agent of an episode failed (crashed, hung, never ended); the message is the reason."""


@dataclass(frozen=True)
class Refusal:
    """A request of the session that the endpoint answered with an error (4xx, or 5xx)."""

    route: str  # "POST .../chat/completions": the method and the path after the session's id
    status: int
    code: str | None
    message: str

    def __str__(self) -> str:
        code = f" {self.code}" if self.code else ""
        return f"{self.route} {self.status}{code}: {self.message}"


MAX_REFUSALS = 4  # refusals a session keeps (the last ones)
MAX_REFUSAL_CHARS = 400  # of each refusal's message


@dataclass
class Session:
    id: str
    key: str
    task: Any  # the PromptTask
    index: int  # episode index within the group
    max_calls: int
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None
    open: bool = True
    refused_calls: int = 0  # calls refused for being past max_calls
    responses: dict[str, Any] = field(default_factory=dict)  # /v1/responses by id: conversation, object
    max_sequences: int = 8  # rollout.agent.max_session_sequences
    slots: asyncio.Semaphore = field(init=False, repr=False)  # one per sequence of this session in the engine
    refusals: deque = field(default_factory=lambda: deque(maxlen=MAX_REFUSALS))  # the last Refusals
    refused: int = 0  # requests the endpoint refused in all

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.max_sequences)

    def record(self, call: Call) -> None:
        self.calls.append(call)

    def refuse(self, route: str, status: int, code: str | None, message: str) -> None:
        """Remember that the endpoint refused a request of this session (the last MAX_REFUSALS are kept, each
        message cut to MAX_REFUSAL_CHARS): a failed episode's reason names them (refusal_reason)."""
        msg = " ".join(str(message).split())
        if len(msg) > MAX_REFUSAL_CHARS:
            msg = msg[: MAX_REFUSAL_CHARS - 3] + "..."
        self.refusals.append(Refusal(route, int(status), code or None, msg))
        self.refused += 1

    def refusal_reason(self) -> str:
        """'endpoint refused: <route> <status> <code>: <message>' for the last refusal (and how many more
        there were), '' when the endpoint refused nothing. Bounded: one message of MAX_REFUSAL_CHARS."""
        if not self.refusals:
            return ""
        more = f" (the last of {self.refused} refused requests)" if self.refused > 1 else ""
        return f"endpoint refused: {self.refusals[-1]}{more}"

    def final_answer(self) -> str:
        """The episode's answer: the text of the last recorded completion ('' when there was none)."""
        if not self.calls:
            return ""
        last = self.calls[-1]
        if last.reply is not None:
            return str(last.reply.get("content") or "")
        return last.text


class SessionStore:
    """The open sessions of one worker, by id. Session ids and keys are random (uuid4, 32 bytes)."""

    def __init__(self, max_calls: int, max_sequences: int = 8):
        self.max_calls, self.max_sequences = max_calls, max_sequences
        self.sessions: dict[str, Session] = {}
        self.base_url = ""  # set once the server listens
        self.app = None  # the endpoint's ASGI app when entry agents call it in-process (rollout.agent.entry_transport)

    def open(self, task: Any, index: int) -> Session:
        s = Session(id=uuid.uuid4().hex, key=secrets.token_urlsafe(32), task=task, index=index,
                    max_calls=self.max_calls, max_sequences=self.max_sequences)
        self.sessions[s.id] = s
        return s

    def close(self, session: Session) -> None:
        """No call is accepted after this; the session is forgotten."""
        session.open = False
        self.sessions.pop(session.id, None)

    def get(self, sid: str) -> Session | None:
        return self.sessions.get(sid)

    async def recorded(self, session: Session, n: int) -> None:
        """Called after a request recorded its `n` calls, before its answer is sent: a store that keeps
        sessions elsewhere writes them here (the online endpoint's, rollout_service/online/server.py)."""

    def url(self, session: Session) -> str:
        """The OpenAI base URL of a session (what an agent passes as base_url)."""
        return f"{self.base_url}/sessions/{session.id}/v1"
