"""The online endpoint (`jetrl serve-policy`): outside traffic talks to the current policy in sessions whose
rewards arrive later (docs/environments.md, "Online training").

    POST /v1/sessions                         {"group"?: str, "metadata"?: {}} -> 201 {"id", "base_url", ...}
    GET  /sessions/<id>                       the session: calls, reward, group, times
    POST /sessions/<id>/v1/chat/completions   (and responses, completions, messages: the rollout endpoint's)
    POST /sessions/<id>/reward                {"reward": float}: once; later ones are 409
    GET  /health

Every request carries an application's key (`Authorization: Bearer` or `x-api-key`, keys.py). A session
belongs to the application that created it: to any other key it does not exist (404). Each application
has request, token and open-session limits (limits.py), and every request the rollout endpoint's bounds
(body size, prompt and generation lengths, calls per session). Each call is written to the session's
record on NATS before its answer is sent (records.py), so a worker restarted between a conversation and
its reward loses nothing. A rewarded session joins its group (groups.py); a full group, or an ungrouped
session, is published as a trajectory group. A session idle past rollout.online.session_ttl_s is dropped
and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
import uuid
from collections import Counter
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from rollout_service.agents.api import BadRequest, error_body
from rollout_service.agents.app import build_routes, wrap
from rollout_service.agents.server import AgentServer
from rollout_service.agents.session import SessionStore
from rollout_service.online.groups import MovingBaseline, build_group
from rollout_service.online.keys import ClientKeys
from rollout_service.online.limits import AppLimits
from rollout_service.online.records import OnlineSession, RecordTooLarge, SessionRecords
from shared.contract import bus, subjects

log = logging.getLogger("jetrl.online")

SESSION_ID = re.compile(r"[0-9a-f]{32}")
OUTCOMES = ("opened", "rewarded", "published", "expired", "empty", "duplicate_reward", "unknown_session",
            "refused_limit", "refused_size")


class NewSession(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str = Field("", max_length=256, description="Sessions of one application with the same key form a group.")
    metadata: dict = Field(default_factory=dict, description="Kept with the session's record (at most 4 KiB as JSON).")


class RewardIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # a number, not "1"
    reward: float


class OnlineStore(SessionStore):
    """The open online sessions of this worker; each recorded call is written to the session's record."""

    def __init__(self, server: OnlineServer, max_calls: int, max_sequences: int):
        super().__init__(max_calls, max_sequences)
        self.server = server

    async def recorded(self, session: OnlineSession, n: int) -> None:
        new = session.calls[-n:] if n else []
        self.server.limits.charge_tokens(session.app, sum(len(c.prompt_ids) + len(c.result.output_ids) for c in new))
        session.updated = time.time()
        try:
            await self.server.records.save(session)
        except RecordTooLarge as exc:
            del session.calls[-n:]
            self.server.count("refused_size")
            raise BadRequest(str(exc), None, 400, "session_record_full") from None


class OnlineServer:
    """Sessions, their records and rewards, and the HTTP endpoint. `publish(group)` sends a trajectory group
    (the worker's NATS publish); `emit(kind, data)` an event."""

    def __init__(self, ctx, js, run: str, worker: str, publish, emit=None):
        self.ctx, self.js, self.run, self.worker = ctx, js, run, worker
        self.cfg = ctx.cfg.rollout.online
        agent = ctx.cfg.rollout.agent
        if not self.cfg.keys_dir:
            raise ValueError("jetrl serve-policy needs rollout.online.keys_dir: a directory of <app>.key files "
                             "(mode 0600, one key per line)")
        self.keys = ClientKeys(self.cfg.keys_dir)
        self.limits = AppLimits(self.cfg.requests_per_min, self.cfg.tokens_per_min)
        self.records = SessionRecords(js, run, self.cfg.max_record_bytes, agent.max_calls, agent.max_session_sequences)
        self.store = OnlineStore(self, agent.max_calls, agent.max_session_sequences)
        self.baseline = MovingBaseline(self.cfg.baseline_window)
        self.publish, self.emit = publish, emit
        self.counts: Counter = Counter()
        self.on_count = None  # (outcome, n) -> None: the worker's Prometheus counter
        self._lock = asyncio.Lock()  # rewards, grouping and expiry one at a time
        # rollout.agent's host, port and public_url, served as the episode endpoint is (agents/server.py)
        self.http = AgentServer(ctx, self.store, lambda store: self.build_app())
        self.base_url = ""

    # --- bookkeeping -----------------------------------------------------------------------------
    def count(self, outcome: str, n: int = 1) -> None:
        self.counts[outcome] += n
        if self.on_count is not None:
            self.on_count(outcome, n)

    def open_sessions(self, app: str) -> int:
        """The application's sessions not yet published or expired (rewarded ones waiting for their group too)."""
        return sum(1 for s in self.store.sessions.values() if s.app == app)

    async def session_for(self, sid: str, app: str) -> OnlineSession | None:
        """The session if it exists and is `app`'s; loaded from its record when this worker does not hold it
        (it was opened before a restart, or by another worker of the run)."""
        if not SESSION_ID.fullmatch(sid):
            return None
        s = self.store.get(sid)
        if s is None:
            s = await self.records.load(sid)
            if s is None:
                return None
            self.store.sessions.setdefault(sid, s)
            s = self.store.sessions[sid]
        return s if s.app == app else None

    # --- sessions and rewards --------------------------------------------------------------------
    async def create(self, app: str, body: NewSession) -> dict[str, Any]:
        if len(json.dumps(body.metadata)) > 4096:
            raise BadRequest("metadata is over 4 KiB as JSON", "metadata")
        if self.open_sessions(app) >= self.cfg.max_open_sessions:
            self.count("refused_limit")
            raise BadRequest(f"application {app} holds rollout.online.max_open_sessions = "
                             f"{self.cfg.max_open_sessions} open sessions: reward some first", None, 429,
                             "too_many_sessions")
        agent = self.ctx.cfg.rollout.agent
        s = OnlineSession(id=uuid.uuid4().hex, key=secrets.token_urlsafe(8), task=None, index=0,
                          max_calls=agent.max_calls, max_sequences=agent.max_session_sequences, app=app,
                          group=body.group, metadata=body.metadata)
        await self.records.save(s)
        self.store.sessions[s.id] = s
        self.count("opened")
        return {"id": s.id, "base_url": f"{self.base_url}/sessions/{s.id}/v1",
                "reward_url": f"{self.base_url}/sessions/{s.id}/reward", "group": s.group,
                "expires_after_idle_s": self.cfg.session_ttl_s}

    def describe(self, s: OnlineSession) -> dict[str, Any]:
        return {"id": s.id, "group": s.group, "metadata": s.metadata, "created": s.created, "updated": s.updated,
                "reward": s.reward, "calls": len(s.calls),
                "versions": sorted({v for c in s.calls for v in c.result.versions if v >= 0})}

    async def reward(self, s: OnlineSession, value: float) -> dict[str, Any]:
        if value != value or abs(value) == float("inf"):
            raise BadRequest("reward must be a finite number", "reward")
        async with self._lock:
            if s.reward is not None:
                self.count("duplicate_reward")
                raise BadRequest(f"session {s.id} was already rewarded ({s.reward:g}); a reward is given once",
                                 "reward", 409, "already_rewarded")
            if not s.calls:
                self.count("empty")
                await self.forget([s])
                return {"session": s.id, "reward": value, "trained": False,
                        "reason": "the session made no model calls: nothing to train on (it is dropped)"}
            s.reward, s.rewarded_at, s.updated = float(value), time.time(), time.time()
            await self.records.save(s)
            self.count("rewarded")
            pending = False
            try:
                published = await self.assemble(s)
            except Exception as exc:  # the reward is kept (in the record): the next sweep publishes it
                log.warning("online: publishing after session %s's reward failed (%s: %s); the sweep retries",
                            s.id, type(exc).__name__, exc)
                published, pending = None, True
        out = {"session": s.id, "reward": s.reward, "trained": True, "published": published}
        if pending:
            out["publish_pending"] = "the reward is kept; publishing failed and is retried every sweep_interval_s"
        elif published is None and s.group:
            waiting = sum(1 for x in self.store.sessions.values() if x.app == s.app and x.group == s.group
                          and x.reward is not None)
            out["group_waiting"] = f"{waiting} of {self.cfg.group_size} sessions of group {s.group!r} rewarded"
        return out

    async def assemble(self, s: OnlineSession) -> str | None:
        """Publish what `s`'s reward completes (its group, or itself against the baseline); the group id, or
        None while its group waits for more rewards. Records are deleted only after JetStream took the group
        (a failed publish leaves them for the next sweep, and the same Nats-Msg-Id dedupes a repeat)."""
        if s.group:
            members = sorted((x for x in self.store.sessions.values() if x.app == s.app and x.group == s.group
                              and x.reward is not None), key=lambda x: (x.rewarded_at or 0, x.id))
            if len(members) < self.cfg.group_size:
                return None
            sessions, adaptive = members[: self.cfg.group_size], None
        else:
            sessions, adaptive = [s], self.baseline.account(s.reward)
        group = build_group(self.run, sessions, self.worker, adaptive)
        await self.publish(group)
        self.count("published", len(sessions))
        await self.forget(sessions)
        if self.emit is not None:
            await self.emit("online_published", {"group_id": group.group_id, "sessions": [x.id for x in sessions],
                                                 "samples": len(group.samples)})
        return group.group_id

    async def forget(self, sessions: list[OnlineSession]) -> None:
        for s in sessions:
            with contextlib.suppress(Exception):
                await self.records.delete(s.id)
            self.store.close(s)

    async def sweep(self, now: float | None = None) -> int:
        """Drop sessions idle past session_ttl_s (counted `expired`), and publish what rewarded sessions
        complete whose publish failed before (or that a restart took over); how many expired."""
        now = time.time() if now is None else now
        async with self._lock:
            expired = [s for s in list(self.store.sessions.values()) if now - s.updated > self.cfg.session_ttl_s]
            if expired:
                await self.forget(expired)
                self.count("expired", len(expired))
                log.info("online: %d session(s) expired after %.0f s idle", len(expired), self.cfg.session_ttl_s)
                if self.emit is not None:
                    await self.emit("online_expired", {"sessions": [s.id for s in expired],
                                                       "rewarded": sum(s.reward is not None for s in expired)})
            groups: dict[tuple[str, str], OnlineSession] = {}
            for s in self.store.sessions.values():
                if s.reward is not None:  # a publish that failed before (or a record taken over at start)
                    groups.setdefault((s.app, s.group) if s.group else (s.app, s.id), s)
            for s in groups.values():
                if s.id in self.store.sessions:
                    try:
                        await self.assemble(s)
                    except Exception as exc:  # NATS down for a moment: the next sweep tries again
                        log.warning("online: publishing session %s failed: %s: %s", s.id, type(exc).__name__, exc)
        return len(expired)

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> str:
        await self.records.open()
        for s in await self.records.load_all():
            self.store.sessions[s.id] = s
        if self.store.sessions:
            log.info("online: took over %d session record(s) of run %s", len(self.store.sessions), self.run)
        await self.sweep()
        self.base_url = await self.http.start()
        log.info("online endpoint on %s (applications: %s)", self.base_url, ", ".join(self.keys.apps) or "none yet")
        return self.base_url

    async def serve(self, stopped: asyncio.Event) -> None:
        """Sweep every sweep_interval_s until `stopped`."""
        while not stopped.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopped.wait(), self.cfg.sweep_interval_s)
            if not stopped.is_set():
                try:
                    await self.sweep()
                except Exception as exc:  # NATS down for a moment: the next sweep tries again
                    log.warning("online: sweep failed: %s: %s", type(exc).__name__, exc)

    async def close(self) -> None:
        await self.http.close()

    # --- HTTP ------------------------------------------------------------------------------------
    def build_app(self):
        app, _ = build_routes(self.ctx, self.store, reward_route=False)

        @app.post("/v1/sessions", status_code=201)
        async def create(body: NewSession, request: Request) -> dict:
            return await self.create(request.scope["jetrl_app"], body)

        @app.get("/sessions/{sid}")
        async def get(sid: str) -> dict:
            return self.describe(self.store.sessions[sid])

        @app.post("/sessions/{sid}/reward")
        async def reward(sid: str, body: RewardIn) -> dict:
            return await self.reward(self.store.sessions[sid], body.reward)

        return wrap(app, self.ctx, self.store, check_keys=False, gate=lambda inner: OnlineGate(inner, self))


class OnlineGate:
    """ASGI middleware before anything is read: the application's key (401), its request rate (429), and for
    `/sessions/<id>/...` that the session is the application's (404 otherwise: no way to learn that another's
    exists), not yet rewarded when it asks for a completion (409), and the application's token budget (429)."""

    def __init__(self, app, server: OnlineServer):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("path") == "/health":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else headers.get(b"x-api-key", b"").decode("latin-1")
        srv = self.server
        app = srv.keys.app_for(token) if token else None
        if app is None:
            msg = "missing key: send 'Authorization: Bearer <application key>'" if not token else "the key is not valid"
            await _refuse(send, 401, msg, "invalid_api_key", {"www-authenticate": 'Bearer realm="jetrl-online"'})
            return
        why = srv.limits.admit_request(app)
        if why:
            srv.count("refused_limit")
            await _refuse(send, 429, why, "rate_limit_exceeded", {"retry-after": str(srv.limits.retry_after(app))})
            return
        path, method = scope.get("path", ""), scope.get("method", "GET")
        parts = path.split("/")
        if len(parts) > 2 and parts[1] == "sessions":
            s = await srv.session_for(parts[2], app)
            if s is None:
                if path.endswith("/reward"):
                    srv.count("unknown_session")
                await _refuse(send, 404, f"no session {parts[2][:64]!r}: it never existed, is not this "
                              "application's, was published or expired", "session_not_found")
                return
            if method == "POST" and not path.endswith("/reward"):
                if s.reward is not None:
                    await _refuse(send, 409, f"session {s.id} is rewarded: it takes no more calls; open another",
                                  "session_rewarded")
                    return
                why = srv.limits.admit_tokens(app)
                if why:
                    srv.count("refused_limit")
                    await _refuse(send, 429, why, "rate_limit_exceeded",
                                  {"retry-after": str(srv.limits.retry_after(app))})
                    return
        await self.app({**scope, "jetrl_app": app}, receive, send)


async def _refuse(send, status: int, message: str, code: str, extra: dict[str, str] | None = None) -> None:
    body = JSONResponse(error_body(status, message, None, code)).body
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *((k.encode(), v.encode()) for k, v in (extra or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def publish_group(js, nc, run: str, timeout_s: float):
    """The worker's publish of an online group: its group id is the Nats-Msg-Id, as for every group."""
    async def publish(group) -> None:
        await bus.publish(js, nc, subjects.trajectories(run), group, msg_id=group.group_id, timeout=timeout_s)
    return publish
