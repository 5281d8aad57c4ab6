"""A multi-hop search agent written against the openai client only (docs/agents.md).

    rollout:
      workflow: agent
      workflow_args: {entry: "examples.agents.search.agent:run"}

The model gets one tool, `search` (BM25 over the task's corpus: the project's own search tool,
rollout_service/tools/search.py); it searches until it answers with "Answer: <country>" or runs out of
turns. The conversation starts with one worked example (a question about a made-up person outside the
corpus: a search for the person, one for the town, the answer), written as the model writes tool calls.

The agent returns its own reward (reward.py `episode_reward`), so no reward service task is needed: 1.0
for the right country; otherwise SEARCH_CREDIT (0.1) for each search that found passages, up to two.
The partial credit is there because the untrained SmolLM2-135M almost never answers right on its own:
most groups would carry no signal. Held-out accuracy is the share of episodes with reward 1.0.
"""

from __future__ import annotations

import json
from functools import lru_cache

from examples.agents.search.reward import episode_reward
from rollout_service.tools.base import ToolError
from rollout_service.tools.search import CorpusSearch

MAX_TURNS = 4
SYSTEM = ("Answer the question with the search tool. Search for the person first, then for their town "
          "with the word town. "
          "Finish with one line: Answer: <country>")
TOOLS = [{"type": "function", "function": {"name": CorpusSearch.name, "description": CorpusSearch.description,
                                           "parameters": CorpusSearch.parameters}}]


def _call_text(query: str) -> str:
    """A search call as the model writes it (Hermes <tool_call> JSON, which the endpoint parses)."""
    return "<tool_call>" + json.dumps({"name": CorpusSearch.name, "arguments": {"query": query}}) + "</tool_call>"


# One worked example, about a person, town and country that are not in the generated data. The assistant
# turns are text because SmolLM2's chat template renders only a message's content.
EXAMPLE = [
    {"role": "user", "content": "In which country was Hana Voss born?"},
    {"role": "assistant", "content": _call_text("Hana Voss")},
    {"role": "tool", "content": "[1] Hana Voss: Hana Voss was born in Zembury.\n"
                                "[2] Hana Voss: Hana Voss works as a baker in Yarrowick."},
    {"role": "assistant", "content": _call_text("Zembury town")},
    {"role": "tool", "content": "[1] Zembury: Zembury is a town in Wexland.\n[2] Zembury: Zembury lies on the river Aule."},
    {"role": "assistant", "content": "Answer: Wexland"},
]


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": question}]


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
    msgs = messages(task["prompt"])
    path = task["metadata"]["corpus"]
    final, found = "", 0
    for _ in range(MAX_TURNS):
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        if not m.tool_calls:
            final = m.content or ""
            break
        msgs.append(m.model_dump(exclude_none=True))
        for tc in m.tool_calls:
            result = await search(path, tc.function.arguments)
            found += not (result.startswith("error") or result == "no results")
            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    return episode_reward(final, task["reference"], found)
