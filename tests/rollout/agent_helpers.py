"""An OpenAI-compatible endpoint on loopback for the agent tests: a context around a real engine (the
tiny policy, or a scripted one), the endpoint served by AgentServer, and sessions with their clients."""

from __future__ import annotations

import contextlib

from rollout_service.agents.server import AgentServer
from rollout_service.engines.base import GenerateRequest
from rollout_service.tools import ToolRegistry
from rollout_service.workflows.base import WorkflowContext
from shared.config import JetrlConfig
from shared.contract.messages import PromptTask


def agent_config(**rollout) -> JetrlConfig:
    ro = {"sampling": {"max_new_tokens": 8}, "service": {"max_new_tokens": 256}, "agent": {"max_calls": 16}}
    for k, v in rollout.items():
        ro[k] = {**ro.get(k, {}), **v} if isinstance(v, dict) else v
    return JetrlConfig.model_validate({"run": "agents", "rollout": ro, "telemetry": {"metrics_port": -1}})


class Recording:
    """Wraps an engine's generate to keep what it returned (the tests compare the session's record to it)."""

    def __init__(self, engine):
        self.engine, self.results = engine, []
        real = engine.generate

        async def generate(req: GenerateRequest):
            res = await real(req)
            self.results.append(res)
            return res

        engine.generate = generate


@contextlib.asynccontextmanager
async def endpoint(engine, tokenizer, cfg: JetrlConfig | None = None):
    cfg = cfg or agent_config()
    ctx = WorkflowContext(engine=engine, tokenizer=tokenizer, reward=None, tools=ToolRegistry(), cfg=cfg)
    server = AgentServer(ctx)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def tiny_endpoint(cfg: JetrlConfig | None = None):
    """The tiny policy in the local engine behind the endpoint, with a Recording: (server, recording, tokenizer)."""
    from rollout_service.engines.local import LocalEngine

    cfg = cfg or agent_config()
    engine = LocalEngine(cfg)
    await engine.start()
    rec = Recording(engine)
    try:
        async with endpoint(engine, engine.tokenizer, cfg) as server:
            yield server, rec, engine.tokenizer
    finally:
        await engine.close()


def task(prompt: str = "max 3 8 1 =", reference="8") -> PromptTask:
    return PromptTask(run="agents", prompt_id="p0", epoch=0, payload={"prompt": prompt, "reference": reference})


def client_for(server: AgentServer, session, key: str | None = None):
    import openai

    return openai.AsyncOpenAI(base_url=server.store.url(session), api_key=key or session.key, max_retries=0)
