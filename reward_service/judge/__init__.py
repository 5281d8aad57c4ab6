"""The LLM judge (generative reward model): `jetrl reward serve --task judge` (docs/reward.md, "The judge").

template.py   the judge's prompt: built-in templates, rendering with the completion fenced by a nonce
parse.py      the judge's output -> a score in [0, 1] (score line, JSON field, yes/no logprobs, A/B verdict)
pairwise.py   which pairs of a group are compared, and the win rates their verdicts give
backends.py   where the judge model runs: jetrl's engines in this process, or an OpenAI-compatible endpoint
judge.py      Judge: a group in, one Score per completion out (rubrics, pairwise, cache, batching, errors)
"""
