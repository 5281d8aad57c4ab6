"""A multi-hop search agent written against the openai client only (docs/agents.md).

    rollout:
      workflow: agent
      workflow_args: {entry: "examples.agents.search.agent:run"}

The model gets one tool, `search` (BM25 over the task's corpus: the project's own search tool,
rollout_service/tools/search.py); it searches until it answers with "Answer: <country>" or runs out of
turns. The agent returns its own reward (reward.py), so no reward service task is needed.
"""

from __future__ import annotations

import json
from functools import lru_cache

from examples.agents.search.reward import score_answer
from rollout_service.tools.base import ToolError
from rollout_service.tools.search import CorpusSearch

MAX_TURNS = 4
SYSTEM = ("Answer the question with the search tool. Search for the person first, then for their town "
          "with the word town. "
          "Finish with one line: Answer: <country>")
TOOLS = [{"type": "function", "function": {"name": CorpusSearch.name, "description": CorpusSearch.description,
                                           "parameters": CorpusSearch.parameters}}]


@lru_cache(maxsize=4)
def corpus(path: str) -> CorpusSearch:
    return CorpusSearch(path, top_k=3)


async def search(path: str, arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
        return await corpus(path).run(args)
    except (json.JSONDecodeError, KeyError, TypeError):
        return 'error: call search with {"query": "<words>"}'
    except ToolError as exc:
        return f"error: {exc}"


async def run(client, task) -> float:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["prompt"]}]
    path = task["metadata"]["corpus"]
    final = ""
    for _ in range(MAX_TURNS):
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        if not m.tool_calls:
            final = m.content or ""
            break
        msgs.append(m.model_dump(exclude_none=True))
        for tc in m.tool_calls:
            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": await search(path, tc.function.arguments)})
    reward, _ = score_answer(final, task["reference"])
    return reward
