"""A two-tool, two-step agent written with the OpenAI Agents SDK (`openai-agents`) as its docs write one:
"What is A * B + C?" for 3-digit numbers, with a `multiply` and an `add` tool. The model has to call
multiply(A, B), read the product from the tool's reply and call add(product, C): two tool calls, two model
calls an episode. The episode ends at the add call, whose output is the answer (the SDK's
`tool_use_behavior=StopAtTools(["add"])`): a first version that let the model answer after the add call
learned both calls but not to stop calling tools (docs/benchmarks.md). SmolLM2-135M cannot do either sum
in its head.

    rollout:
      workflow: agent
      workflow_args: {entry: "examples.agents.chain.agent:run"}

The entry gets the worker's `openai.AsyncOpenAI` client (pointed at the endpoint) and hands it to the SDK's
chat-completions model; nothing else about the SDK changes. The conversation starts with one worked example, given as
the SDK's input items (the endpoint renders its tool calls as the model writes them, for a chat template
like SmolLM2's that knows no tools).

Reward (returned by the agent): 1.0 when the first integer of the final answer is A*B+C; otherwise 0.1 for
each tool call that ran (two at most) plus 0.2 for each right step (multiply of A and B; add of A*B and C).
So "multiply right, then answer" (0.3) ranks below "multiply right, then add anything" (0.4): with credit
for the right product alone, a first run settled on multiplying and answering the product, every episode
scoring the same 0.3, and GRPO had no signal left to find the second call. Held-out
accuracy is the share of episodes with reward 1.0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    Runner,
    StopAtTools,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)  # the SDK would otherwise upload traces to OpenAI's platform

MAX_TURNS = 3  # model calls an episode may take: multiply, add, and one spare
CALL_CREDIT, STEP_CREDIT = 0.1, 0.2  # partial credit: the untrained model rarely makes a right step
_INT = re.compile(r"-?\d+")
INSTRUCTIONS = "You are a helpful assistant. Use the tools for arithmetic, one call at a time, then answer with the number only."
# One worked example, given as earlier turns of the conversation in the SDK's own input items (what
# `result.to_input_list()` returns): the question, the two calls with their outputs, the answer.
EXAMPLE = [
    {"role": "user", "content": "What is 217 * 358 + 409?"},
    {"type": "function_call", "call_id": "example_1", "name": "multiply", "arguments": '{"a": 217, "b": 358}'},
    {"type": "function_call_output", "call_id": "example_1", "output": "77686"},
    {"type": "function_call", "call_id": "example_2", "name": "add", "arguments": '{"a": 77686, "b": 409}'},
    {"type": "function_call_output", "call_id": "example_2", "output": "78095"},
    {"role": "assistant", "content": "78095"},
]


@dataclass
class Steps:
    """The tool calls an episode made: (a, b) of each multiply and each add, and how many ran."""
    products: set = field(default_factory=set)
    sums: set = field(default_factory=set)
    calls: int = 0


@function_tool
def multiply(ctx: RunContextWrapper[Steps], a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    ctx.context.products.add((a, b))
    ctx.context.calls += 1
    return str(a * b)


@function_tool
def add(ctx: RunContextWrapper[Steps], a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    ctx.context.sums.add((a, b))
    ctx.context.calls += 1
    return str(a + b)


def reward(final: str, operands: list[int], steps: Steps) -> float:
    """1.0 for the right answer; else CALL_CREDIT for each tool call that ran (two at most), plus STEP_CREDIT
    for each right step (multiply of A and B; add of A*B and C)."""
    a, b, c = operands
    m = _INT.search(final or "")
    if m is not None and int(m.group()) == a * b + c:
        return 1.0
    right = ({(a, b), (b, a)} & steps.products, {(a * b, c), (c, a * b)} & steps.sums)
    calls = min(steps.calls, 2)
    return round(CALL_CREDIT * calls + STEP_CREDIT * sum(bool(r) for r in right), 6)


async def run(client, task) -> float:
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    # the episode's answer is the add call's output (the SDK's StopAtTools): two tool calls, no answer turn
    agent = Agent[Steps](name="Arithmetic", instructions=INSTRUCTIONS, tools=[multiply, add], model=model,
                         tool_use_behavior=StopAtTools(stop_at_tool_names=["add"]))
    steps, final = Steps(), ""
    try:
        result = await Runner.run(agent, [*EXAMPLE, {"role": "user", "content": task["prompt"]}], context=steps, max_turns=MAX_TURNS)
        final = str(result.final_output)
    except (MaxTurnsExceeded, ModelBehaviorError):  # no answer within the turns, or output the SDK cannot parse
        pass
    return reward(final, task["metadata"]["operands"], steps)
