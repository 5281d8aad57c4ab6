"""Chat completions with `stream: true` and the Responses API (`/v1/responses`, streamed or not), driven by the
official `openai` client over loopback HTTP: each records exactly the Call the plain chat request records,
the streamed pieces concatenate to the unstreamed answer, and a Responses conversation merges into one
masked sample exactly as the chat-completions one does."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import openai
import pytest
from agent_helpers import client_for, endpoint, task, tiny_endpoint
from rollout_doubles import QWEN_LIKE_TEMPLATE, ScriptedEngine, char_tokenizer

from rollout_service.agents.streaming import TOKENS_PER_DELTA, content_segments, group_segments, token_pieces
from rollout_service.agents.trajectory import episode_samples

USER = [{"role": "user", "content": "max 3 8 1 ="}]


@pytest.fixture
async def tiny():
    async with tiny_endpoint() as (server, _, tok):
        yield server, tok


def same_call(a, b) -> None:
    """Two recorded calls with the same tokens, logprobs and versions."""
    assert a.prompt_ids == b.prompt_ids and a.result.output_ids == b.result.output_ids
    assert a.result.logprobs == b.result.logprobs and a.result.versions == b.result.versions
    assert a.text == b.text and a.reply["content"] == b.reply["content"]


async def test_streamed_chat_records_the_unstreamed_call_and_its_chunks_spell_the_answer(tiny):
    server, tok = tiny
    plain_s, stream_s = server.store.open(task(), 0), server.store.open(task(), 0)
    kw = dict(model="m", messages=USER, max_tokens=20, temperature=1.0, seed=5, logprobs=True)
    plain = await client_for(server, plain_s).chat.completions.create(**kw)
    stream = await client_for(server, stream_s).chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    same_call(plain_s.calls[0], stream_s.calls[0])
    assert len(stream_s.calls) == 1
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    body, last = chunks[:-1], chunks[-1]
    assert body[0].choices[0].delta.role == "assistant" and body[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in body)
    assert text == plain.choices[0].message.content
    sizes = [len(c.choices[0].logprobs.content) for c in body if c.choices[0].delta.content]
    assert len(sizes) >= 2 and all(k >= TOKENS_PER_DELTA for k in sizes[:-1])  # deltas along the tokens
    assert [c.choices[0].finish_reason for c in body] == [None] * (len(body) - 1) + [plain.choices[0].finish_reason]
    lps = [e.logprob for c in body if c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert lps == [e.logprob for e in plain.choices[0].logprobs.content] == pytest.approx(plain_s.calls[0].result.logprobs)
    assert last.choices == [] and last.usage.model_dump() == plain.usage.model_dump()  # include_usage
    assert all(c.usage is None for c in body)
    # without include_usage no usage chunk; the wire ends with [DONE]
    async with httpx.AsyncClient() as http:
        r = await http.post(server.store.url(stream_s) + "/chat/completions", json={**kw, "stream": True},
                            headers={"authorization": f"Bearer {stream_s.key}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = r.text.strip().split("\n\n")
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: {") for e in events[:-1])
    assert all("usage" not in json.loads(e[6:]) for e in events[:-1])
    same_call(plain_s.calls[0], stream_s.calls[1])


def test_the_deltas_follow_the_tokens_and_always_spell_the_content():
    tok = char_tokenizer()
    ids = tok.encode("ab cd<|im_end|>", add_special_tokens=False)
    pieces = token_pieces(lambda x: tok.decode(x, skip_special_tokens=True), ids)
    assert pieces == ["a", "b", " ", "c", "d", ""]
    assert content_segments("ab cd", pieces) == ([("a", 1), ("b", 1), (" ", 1), ("c", 1), ("d", 1)], 1)
    assert content_segments("ab c", pieces) == ([("a", 1), ("b", 1), (" ", 1), ("c", 1)], 2)  # a cut stop string
    segs, left = content_segments("cd", pieces)  # text the tokens do not start with: one delta, all tokens left
    assert segs == [("cd", 0)] and left == 6
    assert content_segments("", pieces) == ([], 6)
    batch = lambda seqs: tok.backend_tokenizer.decode_batch(seqs, skip_special_tokens=True)  # noqa: E731
    assert token_pieces(tok.decode, ids, decode_batch=batch) == pieces  # the fast path: one Rust call
    # byte-level tokens: a character split over two tokens comes whole with the second (the slow path)
    by_bytes = lambda x: bytes(x).decode("utf-8", errors="replace")  # noqa: E731
    utf8 = list("aé b".encode())
    want = ["a", "", "é", " ", "b"]
    assert token_pieces(by_bytes, utf8) == want
    assert token_pieces(by_bytes, utf8, decode_batch=lambda seqs: [by_bytes(x) for x in seqs]) == want
    assert content_segments("aé b", want) == ([("a", 1), ("é", 2), (" ", 1), ("b", 1)], 0)
    assert group_segments([("a", 1), ("é", 2), (" ", 1), ("b", 1)], 2) == [("aé", 3), (" b", 2)]
    assert group_segments([("a", 1), ("é", 2), (" ", 1)], 3) == [("aé", 3), (" ", 1)]


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "maths",
                                           "parameters": {"type": "object", "properties": {"expression": {}}}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "calculator", "description": "maths", "strict": False,
                    "parameters": {"type": "object", "properties": {"expression": {}}}}]

RKW = dict(model="m", instructions="Use the tool.", tools=RESPONSES_TOOLS, max_output_tokens=200)


def tool_script(prompt: str, n: int) -> str:
    return "Let me see. " + CALL + "<|im_end|>" if "<tool_response>" not in prompt else "It is 42.<|im_end|>"


@pytest.fixture
async def scripted():
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    async with endpoint(ScriptedEngine(tok, tool_script), tok) as server:
        yield server, tok


async def test_streamed_tool_calls_come_as_deltas_with_index_id_name_and_arguments(scripted):
    server, _ = scripted
    plain_s, stream_s = server.store.open(task(), 0), server.store.open(task(), 0)
    msgs = [{"role": "user", "content": "what is 6*7?"}]
    kw = dict(model="m", messages=msgs, tools=TOOLS, max_tokens=200)
    plain = await client_for(server, plain_s).chat.completions.create(**kw)
    stream = await client_for(server, stream_s).chat.completions.create(**kw, stream=True)
    chunks = [c async for c in stream]
    same_call(plain_s.calls[0], stream_s.calls[0])
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in c.choices[0].delta.tool_calls or []:
            got = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                assert got["id"] is None and d.type == "function"
                got["id"], got["name"] = d.id, d.function.name
            got["arguments"] += d.function.arguments or ""
    (want,) = plain.choices[0].message.tool_calls
    assert list(calls) == [0] and calls[0]["name"] == "calculator" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == json.loads(want.function.arguments) == {"expression": "6*7"}
    assert sum(1 for c in chunks if c.choices[0].delta.tool_calls) > 2  # the arguments come in pieces
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content == "Let me see."
    assert chunks[-1].choices[0].finish_reason == "tool_calls" == plain.choices[0].finish_reason
    # the agent continues with the streamed call's id: the second call extends the first's tokens
    msgs += [{"role": "assistant", "content": "Let me see.", "tool_calls": [
        {"id": calls[0]["id"], "type": "function", "function": {"name": "calculator",
                                                               "arguments": calls[0]["arguments"]}}]},
             {"role": "tool", "tool_call_id": calls[0]["id"], "content": "42"}]
    again = await client_for(server, stream_s).chat.completions.create(**{**kw, "messages": msgs}, stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in again]) == "It is 42."
    assert len(episode_samples(stream_s.calls, 1.0)) == 1


async def test_responses_streamed_and_not_record_the_same_call_and_the_events_spell_the_output(tiny):
    server, tok = tiny
    plain_s, stream_s = server.store.open(task(), 0), server.store.open(task(), 0)
    kw = dict(model="m", input="max 3 8 1 =", max_output_tokens=20, temperature=1.0, extra_body={"seed": 5},
              include=["message.output_text.logprobs"])
    plain = await client_for(server, plain_s).responses.create(**kw)
    events = [e async for e in await client_for(server, stream_s).responses.create(**kw, stream=True)]
    same_call(plain_s.calls[0], stream_s.calls[0])
    chat_s = server.store.open(task(), 0)  # the same request over chat completions: the same call again
    await client_for(server, chat_s).chat.completions.create(model="m", messages=USER, max_tokens=20,
                                                             temperature=1.0, seed=5)
    same_call(plain_s.calls[0], chat_s.calls[0])
    assert plain.object == "response" and plain.id.startswith("resp_") and plain.model == "agents"
    assert plain.status in ("completed", "incomplete") and plain.output_text == plain_s.calls[0].reply["content"]
    (msg,) = plain.output
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert [x.logprob for x in msg.content[0].logprobs] == pytest.approx(plain_s.calls[0].result.logprobs)
    assert plain.usage.input_tokens == len(plain_s.calls[0].prompt_ids)
    assert plain.usage.output_tokens == len(plain_s.calls[0].result.output_ids)
    assert plain.usage.total_tokens == len(plain_s.calls[0].tokens)
    kinds = [e.type for e in events]
    done = "response.incomplete" if plain.status == "incomplete" else "response.completed"
    n = kinds.count("response.output_text.delta")
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * n + [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", done]
    assert n >= 2 and [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == plain.output_text == events[-4].text
    assert [x.logprob for e in deltas for x in e.logprobs] == pytest.approx(plain_s.calls[0].result.logprobs)
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    assert final.output_text == plain.output_text and final.usage.total_tokens == plain.usage.total_tokens
    assert len({e.item_id for e in deltas} | {events[2].item.id, final.output[0].id}) == 1
    assert (await client_for(server, plain_s).responses.retrieve(plain.id)).output_text == plain.output_text


async def _chat_conversation(server, s):
    client = client_for(server, s)
    msgs = [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "what is 6*7?"}]
    r1 = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=200)
    tc = r1.choices[0].message.tool_calls[0]
    msgs += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": tc.id,
                                                                   "content": "42"}]
    r2 = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=200)
    return r2.choices[0].message.content


async def test_a_responses_conversation_merges_into_one_sample_as_the_chat_one_does(scripted):
    server, tok = scripted
    chat_s, prev_s, full_s = (server.store.open(task(), 0) for _ in range(3))
    assert await _chat_conversation(server, chat_s) == "It is 42."
    # previous_response_id, streamed first turn
    client = client_for(server, prev_s)
    events = [e async for e in await client.responses.create(**RKW, input="what is 6*7?", stream=True)]
    r1 = events[-1].response
    assert [o.type for o in r1.output] == ["message", "function_call"] and r1.output[0].content[0].text == "Let me see."
    fc = r1.output[1]
    assert fc.name == "calculator" and json.loads(fc.arguments) == {"expression": "6*7"}
    kinds = [e.type for e in events]
    assert kinds.count("response.function_call_arguments.delta") > 1
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == fc.arguments
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [fc.arguments]
    assert kinds[-1] == "response.completed" and kinds.count("response.output_item.done") == 2
    r2 = await client.responses.create(**RKW, previous_response_id=r1.id,
                                       input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "42"}])
    assert r2.output_text == "It is 42." and r2.previous_response_id == r1.id
    # the whole conversation sent back as items, no previous_response_id (store=False)
    client = client_for(server, full_s)
    items = [{"role": "user", "content": "what is 6*7?"}]
    f1 = await client.responses.create(**RKW, input=items, store=False, metadata={"who": "t"},
                                       reasoning={"effort": "low"})  # accepted, changing nothing
    items += [o.model_dump(exclude_none=True) for o in f1.output]
    items.append({"type": "function_call_output", "call_id": f1.output[1].call_id, "output": "42"})
    f2 = await client.responses.create(**RKW, input=items, store=False)
    assert f2.output_text == "It is 42."
    (want,) = episode_samples(chat_s.calls, 1.0)
    for s in (prev_s, full_s):
        (got,) = episode_samples(s.calls, 1.0)
        assert got.tokens.tolist() == want.tokens.tolist() and got.loss_mask.tolist() == want.loss_mask.tolist()
        assert np.allclose(got.logprobs, want.logprobs) and got.versions.tolist() == want.versions.tolist()
        assert got.prompt_len == want.prompt_len and (got.loss_mask == 0).sum() > got.prompt_len  # masked tool turn


async def test_a_client_gone_mid_stream_leaves_a_whole_recorded_call_or_none():
    tok = char_tokenizer()
    engine = ScriptedEngine(tok, lambda p, n: "x" * 40, token_delay_s=0.02)
    async with endpoint(engine, tok) as server, httpx.AsyncClient() as http:
        gone, read = server.store.open(task(), 0), server.store.open(task(), 1)
        for route, body in (("/chat/completions", {"messages": USER, "max_tokens": 40, "stream": True}),
                            ("/responses", {"input": "hi", "max_output_tokens": 40, "stream": True})):
            with pytest.raises(httpx.TimeoutException):  # gone while the answer is generated: nothing recorded
                await http.post(server.store.url(gone) + route, json=body,
                                headers={"authorization": f"Bearer {gone.key}"}, timeout=httpx.Timeout(0.2))
            # gone after the first event: the call was recorded whole before any event was sent
            async with http.stream("POST", server.store.url(read) + route, json=body,
                                   headers={"authorization": f"Bearer {read.key}"}) as r:
                async for line in r.aiter_lines():
                    assert line.startswith(("data: {", "event: "))
                    break
        await asyncio.sleep(1.0)  # the cancelled generations would have ended by now
        assert gone.calls == [] and gone.responses == {}
        assert [len(c.result.output_ids) for c in read.calls] == [40, 40] and len(read.responses) == 1
        assert read.calls[0].text == "x" * 40


async def test_refusals_name_the_field_in_openai_shape(tiny):
    server, _ = tiny
    s = server.store.open(task(), 0)
    client = client_for(server, s)
    cases = [
        (dict(), "input"),
        (dict(input=[{"type": "web_search_call", "id": "x"}]), "input[0].type"),
        (dict(input=[{"role": "wizard", "content": "x"}]), "input[0].role"),
        (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
         "input[0].content[0]"),
        (dict(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]),
         "input[0].arguments"),
        (dict(input=[{"type": "function_call_output", "output": "1"}]), "input[0].call_id"),
        (dict(input="hi", tools=[{"type": "web_search"}]), "tools[0]"),
        (dict(input="hi", tools=[{"type": "function", "parameters": {}}]), "tools[0].name"),
        (dict(input="hi", previous_response_id="resp_nope"), "previous_response_id"),
        (dict(input="hi", temperature=5), "temperature"),
        (dict(input="hi", max_output_tokens=100000), "max_output_tokens"),
        (dict(input="hi", background=True), "background"),
    ]
    for kw, param in cases:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as err:
                await client.responses.create(model="m", stream=stream, **kw)
            assert err.value.status_code == 400 and err.value.body["param"] == param, (kw, err.value.body)
            assert err.value.body["type"] == "invalid_request_error" and err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="m", messages=USER, temperature=7, stream=True)
    assert err.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as err:  # the legacy completions route does not stream
        await client.completions.create(model="m", prompt="x", stream=True)
    assert err.value.body["param"] == "stream"
    with pytest.raises(openai.NotFoundError) as err:
        await client.responses.retrieve("resp_nope")
    assert err.value.body["code"] == "response_not_found"
    assert s.calls == [] and s.responses == {}
