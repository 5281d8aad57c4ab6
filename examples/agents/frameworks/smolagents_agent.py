"""The calculator task with smolagents' ToolCallingAgent on OpenAIServerModel, as its guided tour writes one.

    command: python examples/agents/frameworks/smolagents_agent.py

OpenAIServerModel is given the endpoint's base URL and key. ToolCallingAgent asks for a tool call on every
step (`tool_choice: "required"`) and ends with its `final_answer` tool; after `max_steps` steps without one
it asks the model for a final answer itself.
"""

from __future__ import annotations

import os

from calc import MAX_TURNS, MODEL, calculate, read_task
from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. (3 + 4) * 2.
    """
    return calculate(expression)


def main() -> None:
    task = read_task()
    model = OpenAIServerModel(model_id=MODEL, api_base=os.environ["OPENAI_BASE_URL"],
                              api_key=os.environ["OPENAI_API_KEY"], client_kwargs={"max_retries": 0})
    agent = ToolCallingAgent(tools=[calculator], model=model, max_steps=MAX_TURNS, verbosity_level=0)
    print(agent.run(task["prompt"]))


if __name__ == "__main__":
    main()
