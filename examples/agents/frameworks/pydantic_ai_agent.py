"""The calculator task with pydantic-ai, as its docs write an agent with a tool.

    command: python examples/agents/frameworks/pydantic_ai_agent.py

`Agent("openai:...")` is pydantic-ai's OpenAIResponsesModel (the Responses API, POST /v1/responses);
`"openai-chat:..."` would be chat completions. Its OpenAI provider reads OPENAI_BASE_URL and OPENAI_API_KEY.
"""

from __future__ import annotations

from calc import INSTRUCTIONS, MAX_TURNS, MODEL, calculate, gave_up, read_task
from pydantic_ai import Agent, UsageLimits
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded

agent = Agent(f"openai:{MODEL}", instructions=INSTRUCTIONS)


@agent.tool_plain
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. (3 + 4) * 2."""
    return calculate(expression)


def main() -> None:
    task = read_task()
    try:
        result = agent.run_sync(task["prompt"], usage_limits=UsageLimits(request_limit=MAX_TURNS))
        print(result.output)
    except (UnexpectedModelBehavior, UsageLimitExceeded) as exc:
        gave_up("pydantic-ai", exc)


if __name__ == "__main__":
    main()
