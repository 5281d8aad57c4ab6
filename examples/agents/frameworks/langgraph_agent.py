"""The calculator task with LangGraph's prebuilt ReAct agent on `langchain-openai`'s ChatOpenAI.

    command: python examples/agents/frameworks/langgraph_agent.py            # ChatOpenAI(streaming=False)
    command: python examples/agents/frameworks/langgraph_agent.py --stream   # ChatOpenAI(streaming=True)

ChatOpenAI's client reads OPENAI_BASE_URL and OPENAI_API_KEY; with streaming=True each model call is a
chat completion with `stream: true` (server-sent events), which LangGraph assembles into the message.
"""

from __future__ import annotations

import sys
import warnings

from calc import INSTRUCTIONS, MAX_TURNS, MODEL, calculate, gave_up, read_task
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError

with warnings.catch_warnings():  # create_react_agent moved to langchain.agents.create_agent in LangGraph 1.0
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. (3 + 4) * 2."""
    return calculate(expression)


def main() -> None:
    task = read_task()
    llm = ChatOpenAI(model=MODEL, streaming="--stream" in sys.argv, max_retries=0)
    agent = create_react_agent(llm, tools=[calculator], prompt=INSTRUCTIONS)
    try:  # each model turn and each tool turn is a graph step
        state = agent.invoke({"messages": [("user", task["prompt"])]}, {"recursion_limit": 2 * MAX_TURNS})
        print(state["messages"][-1].content)
    except GraphRecursionError as exc:
        gave_up("langgraph", exc)


if __name__ == "__main__":
    main()
