"""The calculator task with the OpenAI Agents SDK (`openai-agents`), written as its quickstart writes an agent.

    command: python examples/agents/frameworks/openai_agents_sdk.py                     # Responses API (default)
    command: python examples/agents/frameworks/openai_agents_sdk.py --chat-completions   # OpenAIChatCompletionsModel

The SDK's default model talks to the Responses API (POST /v1/responses) through an `AsyncOpenAI()` client,
which reads OPENAI_BASE_URL and OPENAI_API_KEY; `--chat-completions` uses the SDK's chat-completions model
on the same client. Tracing is off: the SDK would otherwise upload traces to OpenAI's platform.
"""

from __future__ import annotations

import asyncio
import sys

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from calc import INSTRUCTIONS, MAX_TURNS, MODEL, calculate, gave_up, read_task
from openai import AsyncOpenAI

set_tracing_disabled(True)


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. (3 + 4) * 2.

    Args:
        expression: The expression.
    """
    return calculate(expression)


async def main() -> None:
    task = read_task()
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI()) \
        if "--chat-completions" in sys.argv else MODEL
    agent = Agent(name="Calculator", instructions=INSTRUCTIONS, tools=[calculator], model=model)
    try:
        result = await Runner.run(agent, task["prompt"], max_turns=MAX_TURNS)
        print(result.final_output)
    except (MaxTurnsExceeded, ModelBehaviorError) as exc:
        gave_up("openai-agents", exc)


if __name__ == "__main__":
    asyncio.run(main())
