"""Recorded calls -> samples: the merge rule (docs/agents.md, "From calls to samples").

Calls are taken in the order they were recorded. A call whose prompt token ids start with the whole
token sequence (prompt + completion) of the last call of an open chain extends that chain: the tokens
in between (tool results, user turns, the chat template's closing and opening tags) are environment
tokens, masked out of the loss. Any other call starts a new chain. Each chain is one sample; every
sample of an episode gets the episode's reward. Each completion token is in exactly one sample, with the
logprob and version the engine gave it.
"""

from __future__ import annotations

from rollout_service.agents.session import Call
from rollout_service.workflows.base import Trace
from shared.contract.messages import Sample


def chain_calls(calls: list[Call]) -> list[list[Call]]:
    """Group calls into chains: a call joins the chain whose last call's tokens its prompt extends
    (the longest such, when several do), else it starts a chain of its own."""
    chains: list[list[Call]] = []
    for call in calls:
        best, best_len = None, -1
        for chain in chains:
            seq = chain[-1].tokens
            if len(seq) > best_len and len(call.prompt_ids) >= len(seq) and call.prompt_ids[:len(seq)] == seq:
                best, best_len = chain, len(seq)
        if best is None:
            chains.append([call])
        else:
            best.append(call)
    return chains


def chain_to_sample(chain: list[Call], reward: float) -> Sample:
    """One sample from a chain: the first call's prompt, then per call its in-between tokens (masked)
    and its completion (mask 1, the engine's logprobs and versions)."""
    first = chain[0]
    trace = Trace(first.prompt_ids)
    trace.add_policy(first.result)
    for prev, call in zip(chain, chain[1:], strict=False):
        trace.add_env(call.prompt_ids[len(prev.tokens):])
        trace.add_policy(call.result)
    trace.metrics["calls"] = len(chain)
    sample = trace.to_sample(reward)
    problem = sample.validate()
    if problem:  # cannot happen with GenerateResults the engine checked; never publish a bad sample
        raise ValueError(f"merged sample{problem[0]} {problem[1]}")
    return sample


def episode_samples(calls: list[Call], reward: float) -> list[Sample]:
    """The samples of one episode (one per chain), in the order their first calls were made."""
    return [chain_to_sample(c, reward) for c in chain_calls(calls)]
