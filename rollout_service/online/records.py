"""An online session's record on NATS: the KV bucket jetrl_sessions, key `<run>.<session id>`.

The record holds what training needs and nothing the worker could not rebuild: the application and group
key, its times, its reward, and every recorded call (prompt ids, output ids, behaviour logprobs, versions,
and the chat messages the endpoint rendered). It is written before a completion's answer is sent, so a
worker that dies after answering loses nothing: any worker of the run loads the record again (`load`,
`load_all`) and the conversation continues or is rewarded there. It is deleted once its group is published
or it expired.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import nats.js.errors

from rollout_service.agents.session import Call, Session
from rollout_service.engines.base import GenerateResult
from shared.contract import subjects

VERSION = 1


class RecordTooLarge(ValueError):
    """A session's record would be over rollout.online.max_record_bytes."""


def call_to_dict(c: Call) -> dict[str, Any]:
    r = c.result
    return {"p": list(c.prompt_ids), "o": list(r.output_ids), "l": [float(x) for x in r.logprobs],
            "v": list(r.versions), "f": r.finish_reason, "t": c.text, "raw": c.raw, "i": c.index,
            "m": c.messages, "reply": c.reply, "tools": c.tools}


def call_from_dict(d: dict[str, Any]) -> Call:
    res = GenerateResult(request_id="", prompt_ids=list(d["p"]), output_ids=list(d["o"]), logprobs=list(d["l"]),
                         versions=list(d["v"]), finish_reason=d["f"])
    return Call(prompt_ids=list(d["p"]), result=res, text=d["t"], messages=d.get("m"), reply=d.get("reply"),
                tools=d.get("tools"), raw=d.get("raw", ""), index=d.get("i", 0))


@dataclass
class OnlineSession(Session):
    """A session of the online endpoint: owned by an application, maybe in a group, rewarded later."""

    app: str = ""
    group: str = ""  # the caller's group key ('' = trained against the moving baseline)
    metadata: dict = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    rewarded_at: float | None = None

    @property
    def open_for_calls(self) -> bool:
        return self.reward is None

    def to_record(self) -> dict[str, Any]:
        return {"v": VERSION, "id": self.id, "app": self.app, "group": self.group, "metadata": self.metadata,
                "created": self.created, "updated": self.updated, "reward": self.reward,
                "rewarded_at": self.rewarded_at, "calls": [call_to_dict(c) for c in self.calls]}

    @classmethod
    def from_record(cls, rec: dict[str, Any], max_calls: int, max_sequences: int) -> OnlineSession:
        if rec.get("v") != VERSION:
            raise ValueError(f"session record version {rec.get('v')!r} is not {VERSION}")
        s = cls(id=rec["id"], key="", task=None, index=0, max_calls=max_calls, max_sequences=max_sequences,
                app=rec["app"], group=rec.get("group", ""), metadata=rec.get("metadata") or {},
                created=rec["created"], updated=rec["updated"], rewarded_at=rec.get("rewarded_at"))
        s.reward = rec.get("reward")
        s.calls = [call_from_dict(c) for c in rec["calls"]]
        return s


class SessionRecords:
    """The run's session records in the KV bucket (shared/contract/bus.ensure_sessions_kv creates it); sessions
    loaded from them get `max_calls` and `max_sequences` (rollout.agent's)."""

    def __init__(self, js, run: str, max_bytes: int, max_calls: int, max_sequences: int):
        self.js, self.run, self.max_bytes = js, run, max_bytes
        self.max_calls, self.max_sequences = max_calls, max_sequences
        self.kv = None

    async def open(self) -> None:
        self.kv = await self.js.key_value(subjects.SESSIONS_KV_BUCKET)

    def encode(self, s: OnlineSession) -> bytes:
        data = msgpack.packb(s.to_record(), use_bin_type=True)
        if len(data) > self.max_bytes:
            raise RecordTooLarge(f"session {s.id}'s record would be {len(data)} bytes, over "
                                 f"rollout.online.max_record_bytes = {self.max_bytes}: reward the session and "
                                 "start another")
        return data

    async def save(self, s: OnlineSession) -> None:
        await self.kv.put(subjects.session_key(self.run, s.id), self.encode(s))

    async def delete(self, sid: str) -> None:
        await self.kv.delete(subjects.session_key(self.run, sid))

    def decode(self, value: bytes) -> OnlineSession:
        return OnlineSession.from_record(msgpack.unpackb(value, raw=False), self.max_calls, self.max_sequences)

    async def load(self, sid: str) -> OnlineSession | None:
        try:
            entry = await self.kv.get(subjects.session_key(self.run, sid))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        return self.decode(entry.value) if entry.value else None

    async def load_all(self) -> list[OnlineSession]:
        """Every record of the run (a worker starting up takes over the sessions a dead one left)."""
        out = []
        watcher = await self.kv.watch(f"{self.run}.*", ignore_deletes=True)
        try:
            async for entry in watcher:
                if entry is None:  # the initial values are all delivered
                    break
                if entry.value:
                    out.append(self.decode(entry.value))
        finally:
            await watcher.stop()
        return out
