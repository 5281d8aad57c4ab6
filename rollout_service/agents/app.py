"""The rollout worker's OpenAI-compatible endpoint as one ASGI app: the routes, the error handlers and the
wrappers around them (docs/agents.md).

    GET  /sessions/<id>/v1/models
    POST /sessions/<id>/v1/chat/completions       api.py (AgentAPI), streamed by streaming.py
    POST /sessions/<id>/v1/responses              responses.py
    GET  /sessions/<id>/v1/responses/<response id>
    POST /sessions/<id>/v1/completions            api.py
    POST /sessions/<id>/v1/messages               messages.py (Anthropic's Messages API)
    POST /sessions/<id>/reward                    {"reward": float}: the agent sets its episode's reward
    GET  /health                                  {"ok": true}: the one route open without a key
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rollout_service.agents import messages
from rollout_service.agents.api import (
    AgentAPI,
    BadRequest,
    ChatRequest,
    CompletionRequest,
    RewardBody,
    SessionAuth,
    error_body,
    until_disconnect,
)
from rollout_service.agents.refusals import RefusalRecorder
from rollout_service.agents.responses import ResponsesAPI, ResponsesRequest
from rollout_service.agents.session import SessionStore
from rollout_service.agents.streaming import chat_stream_body, stream_response
from rollout_service.engines.base import PromptTooLong
from rollout_service.workflows.base import WorkflowContext


def build_app(ctx: WorkflowContext, store: SessionStore, max_request_bytes: int | None = None):
    """The ASGI app (FastAPI behind SessionAuth)."""
    app, _ = build_routes(ctx, store)
    return wrap(app, ctx, store, max_request_bytes)


def wrap(app, ctx: WorkflowContext, store: SessionStore, max_request_bytes: int | None = None, check_keys: bool = True,
         gate=None):
    """The routes behind the body bound and (with `check_keys`) the session key check, and the refusal
    recorder outermost: every error answer to a session's request (the key check's too) is remembered in the
    session. `gate(inner)` wraps the inner app in one more check (the online endpoint's keys and limits)."""
    max_bytes = max_request_bytes or ctx.cfg.rollout.agent.max_request_bytes
    inner = SessionAuth(app, store, max_bytes, {messages.PATH_SUFFIX: messages.auth_refusal}, check_keys=check_keys)
    return RefusalRecorder(gate(inner) if gate is not None else inner, store)


def build_routes(ctx: WorkflowContext, store: SessionStore, reward_route: bool = True) -> tuple[FastAPI, AgentAPI]:
    """The FastAPI app of the routes above (the reward route only with `reward_route`) and its AgentAPI."""
    api = AgentAPI(ctx, store)
    responses_api = ResponsesAPI(api, ChatRequest)  # responses.py: a translation of complete_chat
    # No /openapi.json nor docs: the API is OpenAI's (docs/agents.md), and nothing is served without a key
    # but /health.
    app = FastAPI(title="jetrl rollout worker: OpenAI-compatible endpoint", docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(PromptTooLong)
    async def _too_long(_: Request, exc: PromptTooLong):
        return JSONResponse(error_body(400, str(exc), "messages", "context_length_exceeded"), status_code=400)


    @app.exception_handler(UnicodeError)
    async def _unicode(_: Request, exc: UnicodeError):  # a lone surrogate (\ud800) the tokenizer cannot take
        return JSONResponse(error_body(400, f"the request holds text that is not valid Unicode: {exc}"),
                            status_code=400)

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest):
        return JSONResponse(error_body(exc.status, str(exc), exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        msg = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
                        for e in errs[:5])
        return JSONResponse(error_body(400, msg, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=exc.headers)

    @app.get("/health")
    async def health() -> dict:  # open (liveness probes): says it answers, and nothing about the worker
        return {"ok": True}

    @app.get("/sessions/{sid}/v1/models")
    async def models(sid: str) -> dict:
        return api.models(sid)

    @app.post("/sessions/{sid}/v1/chat/completions")
    async def chat(sid: str, req: ChatRequest, request: Request) -> Any:
        if req.stream:  # generated and recorded whole first, then sent as events (streaming.py)
            return stream_response(chat_stream_body(api, req, await until_disconnect(request, api.complete_chat(
                sid, req))))
        return await until_disconnect(request, api.chat(sid, req))

    @app.post("/sessions/{sid}/v1/responses")
    async def responses(sid: str, req: ResponsesRequest, request: Request) -> Any:
        return await responses_api.create(sid, req, lambda work: until_disconnect(request, work))

    @app.get("/sessions/{sid}/v1/responses/{rid}")
    async def response(sid: str, rid: str) -> dict:
        return responses_api.get(sid, rid)

    @app.post("/sessions/{sid}/v1/completions")
    async def completions(sid: str, req: CompletionRequest, request: Request) -> dict:
        return await until_disconnect(request, api.completions(sid, req))

    @app.post("/sessions/{sid}/v1/messages")  # Anthropic's Messages API (messages.py); base_url .../sessions/<id>
    async def anthropic_messages(sid: str, request: Request) -> Any:
        return await messages.create_message(api, sid, request)

    if reward_route:
        @app.post("/sessions/{sid}/reward")
        async def reward(sid: str, body: RewardBody) -> dict:
            return api.reward(sid, body)

    return app, api
