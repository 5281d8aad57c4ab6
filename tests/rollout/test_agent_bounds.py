"""The agent endpoint under a hostile agent: prompts over the model's context refused unread, a
request's n x max_tokens and a session's share of the batch bounded, a request whose client went away
aborted in the engine, chunked bodies counted, malformed bodies 4xx, nothing but liveness without a key.
The tiny policy in the local engine, served by AgentServer over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from agent_helpers import agent_config, endpoint, task

from rollout_service.engines.base import GenerateRequest, PromptTooLong, SamplingParams
from rollout_service.engines.local import LocalEngine


@pytest.fixture
async def served():
    cfg = agent_config(sampling={"ignore_eos": True}, agent={"max_session_sequences": 4, "max_request_tokens": 2048,
                                                                  "max_calls": 64})
    engine = LocalEngine(cfg)
    await engine.start()
    async with endpoint(engine, engine.tokenizer, cfg) as server:
        async with httpx.AsyncClient(timeout=30) as http:
            yield server, engine, http
    await engine.close()


def chat_url(server, s) -> str:
    return server.store.url(s) + "/chat/completions"


def auth(s) -> dict:
    return {"authorization": f"Bearer {s.key}"}


async def until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.02)
    return cond()


async def test_a_prompt_over_the_context_is_refused_before_it_is_tokenized(served):
    server, engine, http = served
    s = server.store.open(task(), 0)
    seen: list[int] = []
    real = engine.tokenizer.encode
    engine.tokenizer.encode = lambda text, **kw: seen.append(len(text)) or real(text, **kw)
    try:
        t0 = time.monotonic()
        r = await http.post(chat_url(server, s), headers=auth(s),
                            json={"messages": [{"role": "user", "content": "x" * (3 << 20)}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert time.monotonic() - t0 < 5 and max(seen, default=0) < 100_000  # never tokenized whole
        # a few hundred tokens: tokenized (bounded work), then refused by the engine's context of 256
        r = await http.post(chat_url(server, s), headers=auth(s),
                            json={"messages": [{"role": "user", "content": "1 + 2 = 3. " * 60}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert "256" in r.json()["error"]["message"]
        r = await http.post(server.store.url(s) + "/completions", headers=auth(s),
                            json={"prompt": list(range(5, 400)), "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    finally:
        engine.tokenizer.encode = real
    assert s.calls == []
    with pytest.raises(PromptTooLong):  # the engine itself, for every caller
        await engine.generate(GenerateRequest(prompt_ids=[5] * 300, sampling=SamplingParams(max_new_tokens=1)))


async def test_n_times_max_tokens_is_bounded_naming_the_option(served):
    server, engine, http = served
    s = server.store.open(task(), 0)
    r = await http.post(chat_url(server, s), headers=auth(s),
                        json={"messages": [{"role": "user", "content": "hi"}], "n": 32, "max_tokens": 32768})
    assert r.status_code == 400 and "rollout.service.max_new_tokens" in r.text  # max_tokens alone is over
    r = await http.post(chat_url(server, s), headers=auth(s),
                        json={"messages": [{"role": "user", "content": "hi"}], "n": 16, "max_tokens": 256})
    assert r.status_code == 400 and "rollout.agent.max_request_tokens" in r.json()["error"]["message"], r.text
    assert engine.stats()["tokens_generated"] == 0


async def test_a_session_holds_at_most_its_share_of_the_batch(served):
    server, engine, http = served
    s = server.store.open(task(), 0)
    peak = 0

    async def watch():
        nonlocal peak
        while True:
            peak = max(peak, int(engine.stats()["running"] + engine.stats()["waiting"]))
            await asyncio.sleep(0.002)

    w = asyncio.create_task(watch())
    r = await http.post(chat_url(server, s), headers=auth(s),
                        json={"messages": [{"role": "user", "content": "hi"}], "n": 12, "max_tokens": 16})
    w.cancel()
    assert r.status_code == 200 and len(r.json()["choices"]) == 12
    assert 1 <= peak <= 4  # rollout.agent.max_session_sequences: the other 8 waited their turn


async def test_a_client_that_disconnects_frees_the_engine_for_other_sessions(served):
    server, engine, http = served
    hog, other = server.store.open(task(), 0), server.store.open(task(), 1)
    decode = engine._decode
    engine._decode = lambda: time.sleep(0.01) or decode()  # a model that takes a while per token (worker thread)
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 4, "max_tokens": 256}
    with pytest.raises(httpx.TimeoutException):
        await http.post(chat_url(server, hog), headers=auth(hog), json=body, timeout=httpx.Timeout(0.5))
    assert await until(lambda: engine.stats()["running"] == 0, 2.0), engine.stats()  # aborted, slots freed
    made = engine.stats()["tokens_generated"]
    assert made < 4 * 240  # the hog's sequences did not run to their end
    t0 = time.monotonic()
    r = await http.post(chat_url(server, other), headers=auth(other),
                        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert r.status_code == 200 and time.monotonic() - t0 < 5
    assert hog.calls == []  # nothing recorded for the request nobody read


async def test_a_cancelled_generate_leaves_the_local_batch():
    cfg = agent_config(sampling={"ignore_eos": True})
    engine = LocalEngine(cfg)
    await engine.start()
    decode = engine._decode
    engine._decode = lambda: time.sleep(0.01) or decode()  # 250 tokens take seconds, not a fraction of one
    try:
        req = GenerateRequest(prompt_ids=[5, 6, 7], sampling=SamplingParams(max_new_tokens=250, ignore_eos=True))
        t = asyncio.create_task(engine.generate(req))
        assert await until(lambda: engine.stats()["running"] == 1)
        t.cancel()
        assert await until(lambda: engine.stats()["running"] == 0, 1.0), engine.stats()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert engine.stats()["tokens_generated"] < 200
    finally:
        await engine.close()


async def test_a_chunked_body_over_the_limit_is_a_413_counted_while_read(served):
    """The endpoint's app with a streamed body of 10 MiB and no Content-Length (an HTTP client over TCP
    cannot read a 413 sent mid-upload reliably: the server's close resets the connection)."""
    server, _, _ = served
    s = server.store.open(task(), 0)
    pulled = 0

    async def chunks():
        nonlocal pulled
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(160):
            pulled += 65536
            yield b"a" * 65536
        yield b'"}]}'

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=server.store.app)) as http:
        r = await http.post(chat_url(server, s), headers=auth(s), content=chunks())
    assert "content-length" not in r.request.headers
    assert r.status_code == 413 and "rollout.agent.max_request_bytes" in r.json()["error"]["message"], r.text
    assert pulled <= 4 * 1024 * 1024 + 65536  # it stopped reading at the limit: 10 MiB never read nor parsed


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": "x"}]},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": 5},
                  {"role": "user", "content": "again"}]},
    '{"messages": [{"role": "user", "content": "a \\ud800 b"}]}',
    '{"prompt": "a \\ud800 b", "max_tokens": 1}',
])
async def test_malformed_bodies_are_4xx_not_500(served, body):
    server, _, http = served
    s = server.store.open(task(), 0)
    raw = body if isinstance(body, str) else json.dumps(body)
    path = "/completions" if '"prompt"' in raw else "/chat/completions"
    r = await http.post(server.store.url(s) + path, headers={**auth(s), "content-type": "application/json"},
                        content=raw.encode())
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.json()["error"]["message"]


async def test_without_a_key_only_liveness_is_served(served):
    server, _, http = served
    server.store.open(task(), 0)
    r = await http.get(server.store.base_url + "/health")
    assert r.status_code == 200 and r.json() == {"ok": True}  # no session count, no version
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert (await http.get(server.store.base_url + path)).status_code == 404, path
