"""The calculator task with the Anthropic Python SDK: the tool-use loop of Anthropic's docs over
`client.messages.create` (the Messages API, POST /v1/messages).

    command: python examples/agents/frameworks/anthropic_agent.py

The client is pointed at the episode as at any Anthropic-compatible server, by the ANTHROPIC_BASE_URL (the
episode's URL without the trailing /v1, which the SDK adds) and ANTHROPIC_API_KEY (sent as `x-api-key`) the
worker sets; the SDK reads both.
"""

from __future__ import annotations

import anthropic
from calc import DESCRIPTION, INSTRUCTIONS, MAX_TURNS, MODEL, calculate, read_task

TOOLS = [{"name": "calculator", "description": DESCRIPTION,
          "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                           "required": ["expression"]}}]


def main() -> None:
    task = read_task()
    client = anthropic.Anthropic(max_retries=0)  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the worker
    messages = [{"role": "user", "content": task["prompt"]}]
    for _ in range(MAX_TURNS):
        response = client.messages.create(model=MODEL, max_tokens=256, system=INSTRUCTIONS, tools=TOOLS,
                                          messages=messages)
        if response.stop_reason != "tool_use":
            break
        messages.append({"role": "assistant", "content": response.content})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": block.id, "content": calculate(block.input.get("expression", ""))}
            for block in response.content if block.type == "tool_use"]})
    print("".join(block.text for block in response.content if block.type == "text"))


if __name__ == "__main__":
    main()
