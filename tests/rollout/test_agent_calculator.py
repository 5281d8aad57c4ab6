"""The calculator agent example (examples/agents/calculator): its data, its reward and tool replies on
hand-made cases, one episode end to end through the endpoint (a scripted policy that calls the calculator
and then answers with its result) merged into one sample, and `jetrl eval`'s agent path on it: greedy by
default, accuracy as pass@1, the tool-call rate and calls per episode."""

from __future__ import annotations

import re

import pytest
from agent_helpers import agent_config, client_for, endpoint
from rollout_doubles import ScriptedEngine, char_tokenizer

from examples.agents.calculator import agent
from examples.agents.calculator.data import split
from rollout_service.agents.trajectory import episode_samples
from rollout_service.evaluation.evaluator import Evaluator
from shared.config.eval import EvalConfig
from shared.contract.messages import PromptTask

# SmolLM2-135M-Instruct's chat template: it ignores tools= (the endpoint then puts the tool preamble in the
# system message) and renders a tool message as its own turn.
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_data_split_is_fixed_and_distinct():
    train, heldout = split()
    assert (len(train), len(heldout)) == (2000, 200)
    prompts = [r["prompt"] for r in train + heldout]
    assert len(set(prompts)) == 2200
    for r in train + heldout:
        a, b = map(int, re.fullmatch(r"What is (\d+) \* (\d+)\?", r["prompt"]).groups())
        assert 100 <= a <= 999 and 100 <= b <= 999 and r["reference"] == str(a * b)
    assert split() == (train, heldout)


@pytest.mark.parametrize(("final", "calculated", "reward"), [
    ("77686", True, 1.0),
    ("The answer is 77686.", False, 1.0),  # right without the tool still counts
    ("217 * 358 = 77686", True, agent.TOOL_CREDIT),  # its first integer is 217
    ("77000", True, agent.TOOL_CREDIT),  # a working call, then a wrong answer
    ("77000", False, 0.0),
    ("", False, 0.0),  # ran out of turns
])
def test_reward_on_hand_made_answers(final, calculated, reward):
    assert agent.reward(final, "77686", calculated) == reward


async def test_tool_replies():
    assert await agent.calculate("calculator", '{"expression": "217 * 358"}') == "77686"
    assert (await agent.calculate("math", '{"expression": "1"}')).startswith("error: there is no tool 'math'")
    assert (await agent.calculate("calculator", '{"number": 3}')).startswith("error: call calculator with")
    assert (await agent.calculate("calculator", "not json")).startswith("error: call calculator with")
    assert (await agent.calculate("calculator", '{"expression": "import os"}')).startswith("error:")


def scripted_policy(prompt: str, n: int) -> str:
    """For the last question A * B: answers with the tool's result when there is one, else calls the
    calculator when A is even and answers a wrong number without it when A is odd."""
    tail = prompt.rsplit("What is ", 1)[1]
    a, b = map(int, re.match(r"(\d+) \* (\d+)\?", tail).groups())
    results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", tail)
    if results:
        return results[-1] + "<|im_end|>"
    if a % 2 == 0:
        return agent._call_text(f"{a} * {b}") + "<|im_end|>"
    return "12<|im_end|>"


def calculator_config():
    return agent_config(workflow="agent", workflow_args={"entry": "examples.agents.calculator.agent:run"},
                        sampling={"max_new_tokens": 120, "temperature": 1.0})


async def test_one_calculator_episode_end_to_end_through_the_endpoint():
    tok = char_tokenizer(SMOL_TEMPLATE)
    row = {"prompt": "What is 124 * 301?", "reference": str(124 * 301)}
    async with endpoint(ScriptedEngine(tok, scripted_policy), tok, calculator_config()) as server:
        session = server.store.open(PromptTask(run="agents", prompt_id="q0", epoch=0, payload=row), 0)
        reward = await agent.run(client_for(server, session), {"prompt_id": "q0", **row})
    assert reward == 1.0, [c.text for c in session.calls]
    assert len(session.calls) == 2 and session.calls[0].reply["tool_calls"][0]["function"]["name"] == "calculator"
    first_prompt = tok.decode(session.calls[0].prompt_ids, skip_special_tokens=False)
    assert "You can use tools:\n- calculator(expression)" in first_prompt  # the preamble, for a template without tools
    assert first_prompt.count("What is 217 * 358?") == 1  # the worked example, once
    (sample,) = episode_samples(session.calls, reward)  # the second prompt extends the first call's tokens
    masked = tok.decode(sample.tokens[sample.loss_mask == 0].tolist(), skip_special_tokens=False)
    assert f"<|im_start|>tool\n{124 * 301}<|im_end|>" in masked  # the tool's reply is not trained on
    policy = tok.decode(sample.tokens[sample.loss_mask == 1].tolist(), skip_special_tokens=False)
    assert policy.startswith("<tool_call>") and policy.endswith(f"{124 * 301}<|im_end|>")


async def test_eval_runs_agent_episodes_greedily_and_reports_tool_use():
    tok = char_tokenizer(SMOL_TEMPLATE)
    engine = ScriptedEngine(tok, scripted_policy)
    temperatures = []
    real = engine.generate

    async def generate(req):
        temperatures.append(req.sampling.temperature)
        return await real(req)

    engine.generate = generate
    rows = [{"prompt": f"What is {a} * 111?", "reference": str(a * 111)} for a in (200, 301, 402, 503)]
    cfg = calculator_config()
    ev = Evaluator(cfg, EvalConfig(), engine, tok, reward=None)
    await ev.start()
    try:
        result = await ev.evaluate(rows, dataset="hand-made")
    finally:
        await ev.close()
    assert (result.pass_at_1, result.reward, result.errors) == (0.5, 0.5, 0)  # even A: tool, then right
    assert (result.tool_call_rate, result.calls_per_episode, result.tool_calls_per_episode) == (0.5, 1.5, 0.5)
    assert temperatures == [0.0] * 6  # greedy by default, though the run samples at 1.0
    assert result.completions == [[str(200 * 111)], ["12"], [str(402 * 111)], ["12"]]
    assert "tool calls in 0.500 of episodes, 1.50 model calls and 0.50 tool calls each" in result.line()
