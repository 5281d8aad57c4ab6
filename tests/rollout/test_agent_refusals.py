"""An episode that fails because the endpoint refused one of its requests is dead-lettered with that refusal
(route, status, code, message) first in its reason, then the agent's stderr tail: real command agents (Python's
and Node's official openai clients) on a real rollout worker and nats-server, the dead letter read from the
DLQ stream. The session remembers each refusal whatever made it (a route's check, the key check, the body
bound), the last few only, each message cut short."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import openai
import pytest
from agent_helpers import agent_config, client_for, endpoint, task
from ci_gate import node_project
from rollout_doubles import MaxDigitReward, ScriptedEngine, read_groups, wait_for, worker_config

from rollout_service.agents.refusals import error_of, route_of
from rollout_service.agents.session import MAX_REFUSAL_CHARS, MAX_REFUSALS
from rollout_service.service import RolloutWorker
from rollout_service.workflows.agent import AgentWorkflow
from shared.contract import bus, codec, subjects
from shared.contract.messages import DeadLetter, PromptTask
from shared.model.tinymodel import build_tokenizer

RUN = "refused"
HERE = Path(__file__).resolve().parent
NODE_DIR = HERE.parents[1] / "examples" / "agents" / "node"
LIMIT = "n x max_tokens = 4 x 32 = 128 tokens is over this endpoint's limit of 64 per request"


def answer_max(prompt: str, n: int) -> str:
    return " " + max([c for c in prompt.split("=")[0] if c.isdigit()] or ["0"])


async def dead_letter_of(nats_config, nc, js, command: list[str], prompt_id: str, **service) -> str:
    """Run `command` as the agent of one prompt (group of 2) on a real worker; its dead letter's reason."""
    tok = build_tokenizer()
    cfg = worker_config(nats_config.servers[0], RUN, agent={"timeout_s": 60.0, "max_request_tokens": 64},
                        service=service)
    cfg.rollout.service.follow_weights = False
    worker = RolloutWorker(cfg, engine=ScriptedEngine(tok, answer_max), tokenizer=tok, reward=MaxDigitReward(),
                           workflow=AgentWorkflow(command=command), instance="refusal-worker")
    run = asyncio.create_task(worker.run())
    t = PromptTask(run=RUN, prompt_id=prompt_id, epoch=0, payload={"prompt": "max 1 7 3 =", "reference": "7"},
                   group_size=2)
    await bus.publish(js, nc, subjects.prompts(RUN), t, msg_id=t.group_id)
    sub = await js.pull_subscribe(subjects.dlq_all(RUN), stream=subjects.DLQ_STREAM)
    letters: list[DeadLetter] = []

    async def got():
        try:
            letters.extend(codec.decode(m.data, expect=DeadLetter) for m in await sub.fetch(1, timeout=0.5))
        except Exception:
            pass
        return bool(letters)

    try:
        await wait_for(got, timeout=90, what="the dead letter")
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)
    assert codec.decode(letters[0].original, expect=PromptTask).prompt_id == prompt_id
    return letters[0].reason


async def test_a_python_agent_refused_by_the_endpoint_is_dead_lettered_with_the_refusal(nats_config, nc, js):
    reason = await dead_letter_of(nats_config, nc, js, [sys.executable, str(HERE / "agent_refused.py"), "4", "32"],
                                  "py-0")
    head, _, tail = reason.partition("; agent command exited with code 1: ")
    # the refusal first: route, status, code, the endpoint's message naming the option
    assert head.startswith("rejected: agent (command ")
    assert ": endpoint refused: POST .../chat/completions 400 invalid_request_error: " + LIMIT in head
    assert "(rollout.agent.max_request_tokens)" in head
    # then the agent's own stderr tail, which ends in the client's exception
    assert "openai.BadRequestError: Error code: 400" in tail
    assert len(reason) <= 4096


async def test_a_node_agent_refused_by_the_endpoint_is_dead_lettered_with_the_refusal(nats_config, nc, js):
    node = node_project(NODE_DIR, "openai")
    module = (NODE_DIR / "node_modules" / "openai" / "index.mjs").as_uri()
    reason = await dead_letter_of(nats_config, nc, js, [node, str(HERE / "agent_refused.mjs"), module, "4", "32"],
                                  "node-0")
    head, _, tail = reason.partition("; agent command exited with code 1: ")
    assert ": endpoint refused: POST .../chat/completions 400 invalid_request_error: " + LIMIT in head
    # a crashed Node agent's stderr ends in its version line: the reason says why before it
    assert "Node.js v" in tail and reason.index("endpoint refused") < reason.index("Node.js v")


async def test_a_group_with_a_sample_over_max_sample_tokens_is_refused_at_admission(nats_config, nc, js):
    """rollout.service.max_sample_tokens: the group is dead-lettered by the worker, naming the option, and
    never reaches the trainer."""
    reason = await dead_letter_of(nats_config, nc, js, [sys.executable, str(HERE / "agent_command.py")], "long-0",
                                  max_sample_tokens=8)
    assert reason.startswith("rejected: sample 0 of the group has ")
    assert reason.endswith(" tokens, over rollout.service.max_sample_tokens 8")
    assert not await read_groups(js, RUN)


async def test_the_session_remembers_the_last_refusals_of_every_kind():
    tok = build_tokenizer()
    cfg = agent_config(agent={"max_calls": 16, "max_request_bytes": 2048})
    async with endpoint(ScriptedEngine(tok, answer_max), tok, cfg) as server:
        s = server.store.open(task(), 0)
        client = client_for(server, s)
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=100_000)
        r = s.refusals[-1]
        assert (r.route, r.status, r.code) == ("POST .../chat/completions", 400, "invalid_request_error")
        assert "over this worker's limit 256 (rollout.service.max_new_tokens)" in r.message
        with pytest.raises(openai.AuthenticationError):  # the key check's 401, before any route
            await client_for(server, s, key="wrong").models.list()
        assert (s.refusals[-1].route, s.refusals[-1].status) == ("GET .../models", 401)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {s.key}"}) as http:
            base = server.store.url(s)[: -len("/v1")]
            big = await http.post(f"{base}/v1/completions", json={"prompt": "x" * 4096})
            assert big.status_code == 413 and s.refusals[-1].status == 413
            assert "rollout.agent.max_request_bytes" in s.refusals[-1].message
            bad = await http.post(f"{base}/reward", json={"reward": "lots"})
            assert bad.status_code == 400 and s.refusals[-1].route == "POST .../reward"
        assert s.refused == 4 and len(s.refusals) == 4
        ok = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "max 2 5 ="}])
        assert ok.choices[0].message.content and s.refused == 4  # an answer is no refusal
        for _ in range(3):  # only the last MAX_REFUSALS are kept; the count goes on
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                     stop=["a", "b", "c", "d", "e"])
        assert s.refused == 7 and len(s.refusals) == MAX_REFUSALS == 4
        assert [r.route for r in s.refusals][0] == "POST .../reward"
        assert s.refusal_reason() == ("endpoint refused: POST .../chat/completions 400 invalid_request_error: "
                                      "stop takes up to 4 non-empty strings (the last of 7 refused requests)")
        server.store.close(s)


def test_refusal_messages_are_cut_and_read_in_each_api_shape():
    s = task()
    from rollout_service.agents.session import Session

    session = Session(id="s", key="k", task=s, index=0, max_calls=4)
    session.refuse("POST .../chat/completions", 400, None, "word " * 1000)
    assert len(session.refusals[-1].message) == MAX_REFUSAL_CHARS and session.refusals[-1].message.endswith("...")
    assert len(session.refusal_reason()) < MAX_REFUSAL_CHARS + 100
    assert error_of(b'{"error": {"message": "no", "type": "invalid_request_error", "param": "n", "code": null}}') \
        == ("invalid_request_error", "no")
    assert error_of(b'{"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}') \
        == ("invalid_request_error", "bad")
    assert error_of(b"Internal Server Error") == (None, "Internal Server Error")
    assert route_of("POST", "/sessions/abc/v1/chat/completions") == ("abc", "POST .../chat/completions")
    assert route_of("POST", "/sessions/abc/reward") == ("abc", "POST .../reward")
    assert route_of("GET", "/health") is None
