"""The endpoint's refusals, remembered in their sessions: an agent that fails after the endpoint refused one
of its requests is dead-lettered with that refusal (route, status, code, message) first in the reason,
before its stderr tail (workflows/agent.py), which often ends in a stack frame or `Node.js v20...`.

`RefusalRecorder` wraps the whole app (outside the key check, so a wrong key's 401 and an oversized body's
413 count too): every response with an error status (>= 400, but 499 for a client that went) to a request
under `/sessions/<id>/` is read as it is sent, whatever route or wire format made it: OpenAI's error shape
{"error": {"message", "type", "code"}}, Anthropic's {"type": "error", "error": {"type", "message"}}, or a
plain body. At most MAX_BODY bytes of it are looked at; the session keeps its last few (session.py).
"""

from __future__ import annotations

import json

from rollout_service.agents.session import SessionStore

MAX_BODY = 8192  # bytes of an error body read for its message


def route_of(method: str, path: str) -> tuple[str, str] | None:
    """(session id, "METHOD .../rest") of a path under /sessions/<id>/ (the /v1 after the id left out);
    None for any other path."""
    parts = path.split("/", 3)
    if len(parts) < 3 or parts[0] != "" or parts[1] != "sessions" or not parts[2]:
        return None
    rest = parts[3] if len(parts) > 3 else ""
    rest = rest[3:] if rest.startswith("v1/") else rest
    return parts[2], f"{method} .../{rest}"


def error_of(body: bytes) -> tuple[str | None, str]:
    """(code, message) of an error body in OpenAI's or Anthropic's shape, else (None, the text)."""
    text = body.decode(errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        return None, text.strip() or "(no message)"
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        code = err.get("code") or err.get("type")
        return (str(code) if code else None), str(err.get("message") or text)
    if isinstance(err, str):
        return None, err
    if isinstance(data, dict) and isinstance(data.get("detail"), str):
        return None, data["detail"]
    return None, text.strip()


class RefusalRecorder:
    """ASGI middleware: records each error response of a session's request on that session."""

    def __init__(self, app, store: SessionStore):
        self.app, self.store = app, store

    async def __call__(self, scope, receive, send) -> None:
        where = route_of(scope.get("method", ""), scope.get("path", "")) if scope["type"] == "http" else None
        if where is None:
            await self.app(scope, receive, send)
            return
        sid, route = where
        state = {"status": 0, "body": bytearray(), "done": False}

        async def watch(msg) -> None:
            if msg["type"] == "http.response.start":
                state["status"] = int(msg.get("status", 0))
            elif msg["type"] == "http.response.body" and state["status"] >= 400 and state["status"] != 499:
                body = state["body"]
                body += msg.get("body", b"")[: MAX_BODY - len(body)]
                if not msg.get("more_body") and not state["done"]:
                    state["done"] = True
                    session = self.store.get(sid)
                    if session is not None:
                        code, message = error_of(bytes(body))
                        session.refuse(route, state["status"], code, message)
            await send(msg)

        await self.app(scope, receive, watch)
