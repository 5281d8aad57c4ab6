"""Serve GuessEnvironment with OpenEnv's own app factory (openenv.core.env_server.create_app) under uvicorn,
as an OpenEnv environment's server/app.py does:

    python -m examples.openenv_env.server --port 8765 [--host 127.0.0.1] [--max-sessions 64]

Routes (openenv-core 0.3.0): WS /ws (one session, with its own GuessEnvironment, per connection: what
jetrl's adapter uses), POST /reset and /step (stateless: each request builds a fresh environment), GET
/state, /schema, /metadata, /health. `--max-sessions` is create_app's max_concurrent_envs: WebSocket
sessions beyond it are refused with CAPACITY_REACHED (the adapter waits for a free one).

openenv-core 0.3.0's /ws handler closes the WebSocket again after the client closed it (OpenEnv's own client
sends {"type": "close"} and then closes); under uvicorn's default WebSocket implementation that raises
WebSocketDisconnect, which uvicorn logs as "Exception in ASGI application" with a traceback at the end of
every session. It changes nothing (the session is already gone); `quiet_closed_sockets` drops exactly those
records (an exception that is a WebSocketDisconnect), nothing else.
"""

from __future__ import annotations

import argparse
import logging

from openenv.core.env_server import create_app

from .environment import GuessEnvironment
from .models import GuessAction, GuessObservation


def make_app(max_sessions: int = 64):
    return create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                      max_concurrent_envs=max_sessions)


class _ClosedSocketFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return type(exc).__name__ != "WebSocketDisconnect"


def quiet_closed_sockets() -> None:
    logging.getLogger("uvicorn.error").addFilter(_ClosedSocketFilter())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Serve the guessing game as an OpenEnv environment server.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--max-sessions", type=int, default=64,
                   help="WebSocket sessions at once (create_app's max_concurrent_envs); at least the rollout "
                        "workers' episodes at once (max_in_flight x group_size each)")
    a = p.parse_args(argv)
    import uvicorn

    quiet_closed_sockets()
    uvicorn.run(make_app(a.max_sessions), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
