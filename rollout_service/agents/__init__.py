"""Agents on the rollout worker's OpenAI-compatible endpoint (docs/agents.md).

session.py     one episode's recorded model calls, and the worker's table of open sessions
chat.py        OpenAI messages -> prompt token ids (reusing the recorded tokens of earlier calls),
               model output -> an OpenAI message with tool_calls
api.py         the FastAPI app: /sessions/<id>/v1/{chat/completions,completions,models}, /sessions/<id>/reward
server.py      serving that app inside the worker's event loop
trajectory.py  recorded calls -> samples (the merge rule)
runners.py     where agents run: an `async run(client, task)` function, or an external command
reaper.py      the wrapper a command runs under, so that it and its children die with the worker
"""
