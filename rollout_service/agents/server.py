"""Serving the OpenAI-compatible endpoint inside the rollout worker's event loop (uvicorn, one task)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import uvicorn

from rollout_service.agents.app import build_app
from rollout_service.agents.session import SessionStore
from rollout_service.workflows.base import WorkflowContext

log = logging.getLogger("jetrl.rollout.agents")


class AgentServer:
    """`await start()` binds rollout.agent.host:port (0 = a free port) and sets `store.base_url`. `store` and
    `app_factory` (store -> ASGI app) replace the episode endpoint's: the online endpoint serves its own."""

    def __init__(self, ctx: WorkflowContext, store: SessionStore | None = None, app_factory=None):
        self.ctx = ctx
        self.cfg = ctx.cfg.rollout.agent
        self.store = store or SessionStore(self.cfg.max_calls, self.cfg.max_session_sequences)
        self._app_factory = app_factory
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task | None = None
        self.port = 0
        self.nc = None  # the worker's NATS connection (agent services take episodes over it)

    async def start(self) -> str:
        app = self._app_factory(self.store) if self._app_factory else build_app(self.ctx, self.store)
        config = uvicorn.Config(app, host=self.cfg.host, port=self.cfg.port, log_level="warning", lifespan="off",
                                access_log=False, timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # the worker owns the signals
        self.task = asyncio.create_task(self._serve(), name="jetrl-agent-endpoint")
        while not self.server.started:
            if self.task.done():
                exc = self.task.exception() if not self.task.cancelled() else None
                raise RuntimeError(f"rollout.agent: the endpoint could not listen on {self.cfg.host}:{self.cfg.port}: "
                                   f"{exc or 'the server exited'}")
            await asyncio.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.store.base_url = (self.cfg.public_url or f"http://{self.cfg.host}:{self.port}").rstrip("/")
        self.store.app = app if self.cfg.entry_transport == "in_process" else None
        log.info("OpenAI-compatible endpoint on %s/sessions/<id>/v1", self.store.base_url)
        return self.store.base_url

    async def _serve(self) -> None:
        try:
            await self.server.serve()
        except SystemExit:  # uvicorn exits the process when it cannot bind: make it an error of start()
            raise RuntimeError("uvicorn could not start (see its log line above)") from None

    async def close(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self.task, 10)
