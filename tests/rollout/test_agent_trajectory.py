"""The merge rule (rollout_service/agents/trajectory.py) on hand-made calls: which calls chain, what is
masked, and that every completion token lands in exactly one sample with its own logprob and version."""

from __future__ import annotations

import pytest

from rollout_service.agents.session import Call
from rollout_service.agents.trajectory import chain_calls, episode_samples
from rollout_service.engines.base import GenerateResult


def call(prompt, out, lp=-0.5, version=0, index=0) -> Call:
    res = GenerateResult("r", list(prompt), list(out), [lp] * len(out), [version] * len(out), "stop")
    return Call(prompt_ids=list(prompt), result=res, text="", index=index)


def test_a_call_whose_prompt_extends_the_previous_tokens_merges_with_the_gap_masked():
    a = call([1, 2, 3], [10, 11], lp=-0.1, version=4)
    b = call([1, 2, 3, 10, 11, 7, 8], [12], lp=-0.2, version=5)  # 7, 8: a tool result, the next turn's tags
    (s,) = episode_samples([a, b], 0.75)
    assert s.tokens.tolist() == [1, 2, 3, 10, 11, 7, 8, 12]
    assert s.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert s.logprobs.tolist() == pytest.approx([0, 0, 0, -0.1, -0.1, 0, 0, -0.2])
    assert s.versions.tolist() == [-1, -1, -1, 4, 4, -1, -1, 5]
    assert s.prompt_len == 3 and s.reward == 0.75 and s.turns.tolist() == [3, 5, 7]
    assert s.metrics["calls"] == 2 and s.validate() is None


def test_a_prompt_that_does_not_extend_starts_its_own_sample_sharing_the_reward():
    a = call([1, 2], [3])
    b = call([1, 2, 4], [5])  # the agent rewrote history: 4 is not the model's 3
    c = call([9], [6])  # a fresh conversation (a sub-agent, a summariser)
    samples = episode_samples([a, b, c], 1.0)
    assert [s.tokens.tolist() for s in samples] == [[1, 2, 3], [1, 2, 4, 5], [9, 6]]
    assert [s.loss_mask.tolist() for s in samples] == [[0, 0, 1], [0, 0, 0, 1], [0, 1]]
    assert all(s.reward == 1.0 for s in samples)


def test_siblings_of_an_n_request_each_train_once_and_the_one_continued_keeps_its_chain():
    a = call([1], [2])
    s0, s1 = call([1, 2, 5], [6], index=0), call([1, 2, 5], [7], index=1)  # n = 2 on the second turn
    d = call([1, 2, 5, 7, 8], [9])  # the agent continued choice 1
    chains = chain_calls([a, s0, s1, d])
    assert [[c.result.output_ids for c in ch] for ch in chains] == [[[2], [6]], [[7], [9]]]
    samples = episode_samples([a, s0, s1, d], 0.0)
    policy = sorted(t for s in samples for t in s.tokens[s.loss_mask == 1].tolist())
    assert policy == [2, 6, 7, 9]  # every completion token exactly once
    assert samples[1].tokens.tolist() == [1, 2, 5, 7, 8, 9] and samples[1].loss_mask.tolist() == [0, 0, 0, 1, 0, 1]


def test_the_longest_extended_chain_wins():
    a = call([1], [2])
    b = call([1, 2], [3])
    c = call([1, 2, 3, 4], [5])  # extends a's tokens too, but b's chain is longer: it joins b
    (s,) = episode_samples([a, b, c], 1.0)
    assert s.tokens.tolist() == [1, 2, 3, 4, 5] and s.loss_mask.tolist() == [0, 1, 1, 0, 1]
