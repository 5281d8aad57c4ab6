"""tool_choice "required" / named, several tool calls per turn, response_format (constrained decoding with
llguidance), top_logprobs and the fields that change nothing, through the endpoint with the official client
and a tiny random policy in the local engine (a character tokenizer that can write JSON). A random policy
is the hard case: whatever it prefers, the grammar must keep every reply parseable."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from agent_helpers import agent_config, client_for, endpoint, task
from ci_gate import skip_without_modules
from rollout_doubles import ScriptedEngine, char_tokenizer

from rollout_service.agents.trajectory import episode_samples
from rollout_service.engines.constraint import GrammarMatcher
from rollout_service.engines.local import LocalEngine
from shared.model.logits_mask import mask_logits

pytestmark = skip_without_modules("llguidance", "jsonschema", install="pip install -e .[dev]")

ADD = {"type": "function", "function": {"name": "add", "description": "add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}
MODE = {"type": "function", "function": {"name": "mode", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}, "unit": {"enum": ["cm", "in"]}},
    "required": ["on", "unit"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "sure": {"type": "boolean"}, "tag": {"enum": ["x", "yz"]}},
          "required": ["answer", "sure", "tag"], "additionalProperties": False}
ASK = [{"role": "user", "content": "add 2 and 3"}]


class Requests:
    """Keeps each engine request beside its result (to replay the constraint the tokens were drawn under)."""

    def __init__(self, engine):
        self.pairs = []
        real = engine.generate

        async def generate(req):
            res = await real(req)
            self.pairs.append((req, res))
            return res

        engine.generate = generate


@pytest.fixture(scope="module")
def policy():
    from transformers import AutoModelForCausalLM

    from shared.model.tinymodel import tiny_config

    tok = char_tokenizer()
    cfg = agent_config()
    torch.manual_seed(0)
    conf = tiny_config(cfg.model, len(tok))
    conf.max_position_embeddings = 1024  # characters: the tool preamble alone is ~200 tokens
    return AutoModelForCausalLM.from_config(conf).eval(), tok


@pytest.fixture
async def tiny(policy):
    model, tok = policy
    cfg = agent_config()
    engine = LocalEngine(cfg, model=model, tokenizer=tok)
    await engine.start()
    reqs = Requests(engine)
    async with endpoint(engine, tok, cfg) as server:
        yield server, reqs, tok, model
    await engine.close()


def replayed_logprobs(model, tok, req, res) -> list[float]:
    """Each output token's logprob recomputed in one forward pass, masked by the request's constraint
    replayed token by token: what the sampler's distribution was."""
    ids = torch.tensor([list(req.prompt_ids) + list(res.output_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(req.prompt_ids) - 1:-1].float()
    if req.sampling.constraint is not None:
        m = GrammarMatcher(req.sampling.constraint, tok, logits.shape[-1])
        rows = []
        for t in res.output_ids:
            rows.append(m.allowed())
            m.consume(t)
        logits = mask_logits(logits, torch.stack(rows))
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(res.output_ids)[:, None])[:, 0].tolist()


async def test_required_and_named_tool_choice_always_parse_as_a_call_of_an_allowed_tool(tiny):
    import jsonschema

    server, reqs, tok, model = tiny
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (ADD, MODE)}
    choices = [("required", {"add", "mode"}), ({"type": "function", "function": {"name": "mode"}}, {"mode"}),
               ({"type": "function", "name": "add"}, {"add"})]  # the last: the Responses API's form
    for choice, allowed in choices:
        for seed in range(5):
            s = server.store.open(task(), seed)
            client = client_for(server, s)
            r = await client.chat.completions.create(model="m", messages=ASK, tools=[ADD, MODE], tool_choice=choice,
                                                     parallel_tool_calls=False, max_tokens=120, seed=seed,
                                                     temperature=1.0, logprobs=True)
            c = r.choices[0]
            assert c.finish_reason == "tool_calls", c.message.content
            (call,) = c.message.tool_calls
            assert call.function.name in allowed
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
            req, res = reqs.pairs[-1]
            assert [t.logprob for t in c.logprobs.content] == pytest.approx(res.logprobs)
            assert s.calls[-1].result is res
    # the recorded logprobs are those of the masked distribution the tokens were drawn from
    for req, res in reqs.pairs[:3] + reqs.pairs[-3:]:
        assert res.logprobs == pytest.approx(replayed_logprobs(model, tok, req, res), abs=2e-4)
        assert max(res.logprobs) <= 0 and any(lp == pytest.approx(0.0, abs=1e-6) for lp in res.logprobs)


async def test_several_calls_per_turn_unless_parallel_tool_calls_is_false(tiny):
    server, _, tok, _ = tiny
    counts = {True: [], False: []}
    for parallel in (True, False):
        for seed in range(6):
            s = server.store.open(task(), seed)
            r = await client_for(server, s).chat.completions.create(
                model="m", messages=ASK, tools=[ADD], tool_choice="required", parallel_tool_calls=parallel,
                max_tokens=250, seed=seed)
            c = r.choices[0]
            if c.finish_reason == "length":  # a random policy may chain calls past max_tokens
                assert parallel
                continue
            assert c.finish_reason == "tool_calls"
            assert all(t.function.name == "add" for t in c.message.tool_calls)
            counts[parallel].append(len(c.message.tool_calls))
    assert set(counts[False]) == {1} and len(counts[False]) == 6
    assert max(counts[True]) >= 2  # the model chose to call again in the same turn


async def test_several_scripted_calls_come_back_together_and_parallel_false_stops_at_the_first():
    tok = char_tokenizer()
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    engine = ScriptedEngine(tok, lambda prompt, i: call + "\n" + call.replace("1", "7") + "<tool_response>x")
    await engine.start()
    async with endpoint(engine, tok) as server:
        s = server.store.open(task(), 0)
        client = client_for(server, s)
        r = await client.chat.completions.create(model="m", messages=ASK, tools=[ADD], max_tokens=200)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and [json.loads(t.function.arguments)["a"]
                                                    for t in c.message.tool_calls] == [1, 7]
        assert s.calls[-1].text.endswith("<tool_response>")  # generated, recorded, not shown
        r = await client.chat.completions.create(model="m", messages=ASK, tools=[ADD], max_tokens=200,
                                                 parallel_tool_calls=False)
        assert len(r.choices[0].message.tool_calls) == 1 and s.calls[-1].text == call


async def test_json_schema_output_always_validates_and_json_object_parses(tiny):
    import jsonschema

    server, reqs, tok, model = tiny
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    for seed in range(8):
        s = server.store.open(task(), seed)
        r = await client_for(server, s).chat.completions.create(model="m", messages=ASK, response_format=fmt,
                                                                max_tokens=100, seed=seed)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    req, res = reqs.pairs[-1]
    assert res.logprobs == pytest.approx(replayed_logprobs(model, tok, req, res), abs=2e-4)
    stopped = 0
    for seed in range(4):
        s = server.store.open(task(), seed)
        r = await client_for(server, s).chat.completions.create(
            model="m", messages=ASK, response_format={"type": "json_object"}, max_tokens=200, seed=seed)
        if r.choices[0].finish_reason == "stop":  # else cut by max_tokens, as OpenAI's would be
            assert isinstance(json.loads(r.choices[0].message.content), dict)
            stopped += 1
    assert stopped >= 1


async def test_response_format_with_tools_offered_is_an_answer_or_a_call(tiny):
    import jsonschema

    server, _, tok, _ = tiny
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    kinds = set()
    for seed in range(6):
        s = server.store.open(task(), seed)
        r = await client_for(server, s).chat.completions.create(model="m", messages=ASK, response_format=fmt,
                                                                tools=[ADD], parallel_tool_calls=False,
                                                                max_tokens=120, seed=seed)
        m = r.choices[0].message
        if m.tool_calls:
            kinds.add("call")
            jsonschema.validate(json.loads(m.tool_calls[0].function.arguments), ADD["function"]["parameters"])
        else:
            kinds.add("answer")
            jsonschema.validate(json.loads(m.content), SCHEMA)
    assert kinds == {"call", "answer"}  # each reply was one of the two, and this policy chose both


async def test_a_forced_call_then_its_result_merge_into_one_sample_with_the_sampler_logprobs(tiny):
    server, reqs, tok, _ = tiny
    s = server.store.open(task(), 0)
    client = client_for(server, s)
    msgs = list(ASK)
    r1 = await client.chat.completions.create(model="m", messages=msgs, tools=[ADD], tool_choice="required",
                                              parallel_tool_calls=False, max_tokens=120, seed=4)
    m = r1.choices[0].message
    msgs += [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "5"}]
    await client.chat.completions.create(model="m", messages=msgs, tools=[ADD], max_tokens=6, seed=5)
    first, second = s.calls
    assert second.prompt_ids[:len(first.tokens)] == first.tokens  # the constrained tokens, reused as generated
    (sample,) = episode_samples(s.calls, 1.0)
    p = len(first.prompt_ids)
    gap = len(second.prompt_ids) - len(first.tokens)
    n1, n2 = len(first.result.output_ids), len(second.result.output_ids)
    mask = sample.loss_mask.tolist()
    assert mask == [0] * p + [1] * n1 + [0] * gap + [1] * n2  # every sampled token trains, the gap does not
    lps = [float(x) for x, k in zip(sample.logprobs, mask, strict=True) if k]
    assert lps == pytest.approx(first.result.logprobs + second.result.logprobs, abs=1e-6)


async def test_top_logprobs_are_the_sampling_distributions_best(tiny):
    server, reqs, tok, model = tiny
    s = server.store.open(task(), 0)
    r = await client_for(server, s).chat.completions.create(model="m", messages=ASK, max_tokens=8, seed=1,
                                                            logprobs=True, top_logprobs=4)
    req, res = reqs.pairs[-1]
    for entry, lp in zip(r.choices[0].logprobs.content, res.logprobs, strict=True):
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 4 and tops == sorted(tops, reverse=True) and lp <= tops[0] + 1e-6
        assert entry.logprob == pytest.approx(lp)
    ids = torch.tensor([list(req.prompt_ids) + list(res.output_ids)])
    with torch.no_grad():
        first = torch.log_softmax(model(input_ids=ids).logits[0, len(req.prompt_ids) - 1].float(), -1)
    best = torch.topk(first, 4)
    assert [t.token for t in r.choices[0].logprobs.content[0].top_logprobs] == [tok.decode([i]) for i in
                                                                                 best.indices.tolist()]
    assert [t.logprob for t in r.choices[0].logprobs.content[0].top_logprobs] == pytest.approx(
        best.values.tolist(), abs=2e-4)


async def test_fields_that_change_nothing_are_accepted(tiny):
    server, _, _, _ = tiny
    s = server.store.open(task(), 0)
    r = await client_for(server, s).chat.completions.create(
        model="m", messages=ASK, max_tokens=4, user="u1", metadata={"k": "v"}, store=False, service_tier="auto",
        reasoning_effort="low", modalities=["text"], prediction={"type": "content", "content": "x"},
        frequency_penalty=0, presence_penalty=0, logit_bias={}, response_format={"type": "text"},
        extra_body={"some_framework_field": {"a": 1}, "top_k": None})
    assert r.choices[0].message.role == "assistant" and len(s.calls) == 1


async def _refused(client, param: str, **kw) -> str:
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="m", messages=ASK, max_tokens=4, **kw)
    body = err.value.body
    assert body["param"] == param, body
    return body["message"]


async def test_refused_options_name_their_field(tiny):
    server, _, _, _ = tiny
    s = server.store.open(task(), 0)
    c = client_for(server, s)
    assert "logprobs" in await _refused(c, "top_logprobs", top_logprobs=2)
    await _refused(c, "top_logprobs", logprobs=True, top_logprobs=21)
    await _refused(c, "logit_bias", logit_bias={"5": 3})
    await _refused(c, "frequency_penalty", frequency_penalty=0.5)
    await _refused(c, "presence_penalty", presence_penalty=0.5)
    await _refused(c, "response_format.type", response_format={"type": "regex"})
    await _refused(c, "response_format.json_schema.schema", response_format={"type": "json_schema",
                                                                             "json_schema": {"name": "x"}})
    await _refused(c, "response_format", response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}})
    await _refused(c, "tool_choice", tools=[ADD], tool_choice={"type": "function", "function": {"name": "nope"}})
    await _refused(c, "tool_choice", tool_choice="required")
    await _refused(c, "tool_choice", tools=[ADD], tool_choice="sometimes")
    bad_tool = {"type": "function", "function": {"name": "t", "parameters": {"type": "wibble"}}}
    await _refused(c, "tools[0].function.parameters", tools=[bad_tool], tool_choice="required")
    assert s.calls == []


async def test_an_engine_that_cannot_constrain_refuses_instead_of_ignoring():
    tok = char_tokenizer()
    engine = ScriptedEngine(tok, lambda prompt, i: "not json")
    await engine.start()
    async with endpoint(engine, tok) as server:
        s = server.store.open(task(), 0)
        c = client_for(server, s)
        assert "scripted engine cannot enforce" in await _refused(c, "response_format",
                                                                  response_format={"type": "json_object"})
        await _refused(c, "tool_choice", tools=[ADD], tool_choice="required")
        await _refused(c, "top_logprobs", logprobs=True, top_logprobs=2)
        assert s.calls == [] and engine.calls == 0
