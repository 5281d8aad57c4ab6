"""The two-step chain agent (examples/agents/chain, OpenAI Agents SDK): its data and reward on hand-made
cases, and one episode end to end through the endpoint under a scripted policy that calls multiply, then
add (whose output ends the episode as its answer), given the SDK's own tool-call items as a worked example:
the example's calls reach a template without tool support as the <tool_call> text the model writes, and
the two calls merge into one sample."""

from __future__ import annotations

import re

import pytest
from agent_helpers import agent_config, client_for, endpoint
from ci_gate import need_module
from rollout_doubles import ScriptedEngine, char_tokenizer
from test_agent_calculator import SMOL_TEMPLATE

from examples.agents.chain.data import split
from rollout_service.agents.trajectory import episode_samples
from shared.contract.messages import PromptTask

need_module("agents", 'pip install -e ".[frameworks]"')
from examples.agents.chain import agent  # noqa: E402  (imports the Agents SDK)


def test_data_split_is_fixed_and_distinct():
    train, heldout = split()
    assert (len(train), len(heldout)) == (2000, 100)
    assert len({r["prompt"] for r in train + heldout}) == 2100
    for r in train + heldout:
        a, b, c = map(int, re.fullmatch(r"What is (\d+) \* (\d+) \+ (\d+)\?", r["prompt"]).groups())
        assert r["operands"] == [a, b, c] and r["reference"] == str(a * b + c)
    assert split() == (train, heldout)


@pytest.mark.parametrize(("final", "products", "sums", "calls", "reward"), [
    ("78095", set(), set(), 0, 1.0),  # right, with or without the tools
    ("x", {(217, 358)}, set(), 1, 0.3),  # a right multiply, then an answer
    ("x", {(358, 217)}, {(1, 2)}, 2, 0.4),  # a right multiply, then some add
    ("x", {(217, 358)}, {(409, 77686)}, 2, 0.6),  # both steps right, the answer wrong
    ("x", {(1, 2)}, set(), 5, 0.2),  # calls count two at most
    ("", set(), set(), 0, 0.0),
])
def test_reward_on_hand_made_episodes(final, products, sums, calls, reward):
    assert agent.reward(final, [217, 358, 409], agent.Steps(products, sums, calls)) == reward


def call(name: str, a: int, b: int) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def scripted_policy(prompt: str, n: int) -> str:
    """For the last question A * B + C: multiply(A, B), then add(product, C) (then the sum, never asked:
    the agent stops at the add call)."""
    tail = prompt.rsplit("What is ", 1)[1]
    a, b, c = map(int, re.match(r"(\d+) \* (\d+) \+ (\d+)\?", tail).groups())
    results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", tail)
    if not results:
        return call("multiply", a, b) + "<|im_end|>"
    if len(results) == 1:
        return call("add", int(results[0]), c) + "<|im_end|>"
    return results[-1] + "<|im_end|>"


async def test_one_chain_episode_end_to_end_through_the_endpoint():
    tok = char_tokenizer(SMOL_TEMPLATE)
    row = {"prompt": "What is 124 * 301 + 555?", "reference": str(124 * 301 + 555),
           "metadata": {"operands": [124, 301, 555]}}
    cfg = agent_config(workflow="agent", workflow_args={"entry": "examples.agents.chain.agent:run"},
                       sampling={"max_new_tokens": 120, "temperature": 1.0})
    async with endpoint(ScriptedEngine(tok, scripted_policy), tok, cfg) as server:
        session = server.store.open(PromptTask(run="agents", prompt_id="q0", epoch=0, payload=row), 0)
        reward = await agent.run(client_for(server, session), row)
    assert reward == 1.0, [c.text for c in session.calls]
    assert [c.reply["tool_calls"][0]["function"]["name"] for c in session.calls[:2]] == ["multiply", "add"]
    assert len(session.calls) == 2  # the add call's output is the answer
    first = tok.decode(session.calls[0].prompt_ids, skip_special_tokens=False)
    assert "You can use tools:\n- multiply(a, b)" in first and "- add(a, b)" in first
    # the worked example's function-call items, as the model writes a call
    assert f"<|im_start|>assistant\n{call('multiply', 217, 358)}<|im_end|>" in first
    assert f"<|im_start|>assistant\n{call('add', 77686, 409)}<|im_end|>" in first
    (sample,) = episode_samples(session.calls, reward)  # each prompt extends the call before it
    policy = tok.decode(sample.tokens[sample.loss_mask == 1].tolist(), skip_special_tokens=False)
    # generation stops at </tool_call>: the turn's <|im_end|> after a call is the template's (masked)
    assert policy == call("multiply", 124, 301) + call("add", 124 * 301, 555)
