"""A calculator agent written against the openai client only (docs/agents.md): "What is A * B?" for two
3-digit numbers, which SmolLM2-135M cannot multiply in its head, with a `calculator` tool it can call.

    rollout:
      workflow: agent
      workflow_args: {entry: "examples.agents.calculator.agent:run"}

The conversation starts with one worked example (a question, the assistant's tool call, the tool's result,
the assistant's answer), then the question. The agent executes the model's tool calls with the project's
calculator (rollout_service/tools/calculator.py) and asks again, until the model answers without a tool
call or MAX_TURNS calls are made.

The agent returns its own reward (`reward`): 1.0 when the first integer of the final answer is A*B (the
rule of the `addition` scorer); otherwise TOOL_CREDIT (0.2) when the model made at least one calculator
call that returned a number, else 0. The partial credit is there because the untrained model answers right
in about 1 of 60 sampled episodes: most groups would carry no signal. Held-out accuracy is the share of
episodes with reward 1.0 (`jetrl eval`'s pass@1, eval.success_reward 1.0), not the mean reward.
"""

from __future__ import annotations

import json
import re

from rollout_service.tools.base import ToolError
from rollout_service.tools.calculator import Calculator

MAX_TURNS = 3
TOOL_CREDIT = 0.2
_INT = re.compile(r"-?\d+")
SYSTEM = "You are a helpful assistant with a calculator."
TOOLS = [{"type": "function", "function": {"name": Calculator.name, "description": Calculator.description,
                                           "parameters": Calculator.parameters}}]


def _call_text(expression: str) -> str:
    """A tool call as the model writes it (Hermes <tool_call> JSON, which the endpoint parses)."""
    call = {"name": Calculator.name, "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


# One worked example. The assistant turn is written as text because SmolLM2's chat template renders only
# a message's content (a `tool_calls` field would vanish from the prompt).
EXAMPLE = [
    {"role": "user", "content": "What is 217 * 358?"},
    {"role": "assistant", "content": _call_text("217 * 358")},
    {"role": "tool", "content": "77686"},
    {"role": "assistant", "content": "77686"},
]


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": question}]


async def calculate(name: str, arguments: str) -> str:
    """The tool's reply to a call: the value, or an error the model can read."""
    if name != Calculator.name:
        return f"error: there is no tool {name!r}; call {Calculator.name}"
    try:
        args = json.loads(arguments or "{}")
        return await Calculator().run(args)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return 'error: call calculator with {"expression": "<arithmetic>"}'
    except ToolError as exc:
        return f"error: {exc}"


def reward(final: str, reference: str, calculated: bool) -> float:
    """1.0 for the right answer (first integer == reference), TOOL_CREDIT for a working calculator call, else 0."""
    m = _INT.search(final or "")
    if m is not None and int(m.group()) == int(reference):
        return 1.0
    return TOOL_CREDIT if calculated else 0.0


async def run(client, task) -> float:
    msgs = messages(task["prompt"])
    final, calculated = "", False
    for _ in range(MAX_TURNS):
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        if not m.tool_calls:
            final = m.content or ""
            break
        msgs.append(m.model_dump(exclude_none=True))
        for tc in m.tool_calls:
            result = await calculate(tc.function.name, tc.function.arguments)
            calculated = calculated or not result.startswith("error")
            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    return reward(final, task["reference"], calculated)
