"""Held-out evaluation of a policy version through the run's own engine and reward service.

    rows (JSONL) --> prompt rendering (as the workflows do) --> engine.generate (greedy or k samples)
        --> reward client .score (one request per prompt) --> mean reward, pass@1, pass@k
    (agent workflows: each row's episodes through an OpenAI-compatible endpoint served here; + tool_call_rate)

`jetrl eval` runs it once; `jetrl eval --follow` (started by `jetrl up` when eval.dataset and
eval.eval_every are set) evaluates the newest version every `eval_every` versions and publishes each
result as an Event (service "eval", kind "eval": {version, reward, pass_at_k, pass_at_1, k, n, ...}).
`jetrl eval --local-reward` needs no running services: it scores in this process
(reward_service.local_client.LocalRewardClient) and reads versions from the weight store's directory.

    rows.py       read_rows(): the held-out JSONL file -> task payloads
    passk.py      pass_at_k(), summarise(), EvalResult: the maths, pure functions
    evaluator.py  Evaluator: one engine + one reward client; load(version), evaluate(rows)
    agent.py      AgentEpisodes: agent workflows' rows as episodes through an endpoint of this process
    session.py    EvalSession (NATS or local wiring), eval_once(), eval_config(), EvalError
    follow.py     eval_follow(): the `--follow` loop
"""
