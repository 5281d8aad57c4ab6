"""Adaptive sampling (rollout_service/adaptive.py): the round rule, the balanced subset and its weights
against hand-computed values, and the unbiasedness claim checked exactly over every possible subset."""

import asyncio
import itertools
import random
from fractions import Fraction

import numpy as np
import pytest

from rollout_service.adaptive import RoundYield, balanced_subset, has_spread, reward_stats, sample_adaptively
from shared.config.rollout import AdaptiveConfig
from shared.contract import codec
from shared.contract.messages import Sample, TrajectoryGroup
from trainer_service.algorithms.advantages import DrawStats, from_draws, group_advantages


def sample(reward: float) -> Sample:
    return Sample(tokens=np.array([1, 2, 3], np.int32), loss_mask=np.array([0, 1, 1], np.uint8),
                  logprobs=np.zeros(3, np.float32), versions=np.array([-1, 0, 0], np.int32), prompt_len=1,
                  reward=reward)


def test_spread_and_stats_by_hand():
    assert not has_spread([0.0, 0.0, 0.0]) and not has_spread([])
    assert has_spread([0.0, 1.0])
    assert reward_stats([1.0, 0.0, 0.0, 0.0]) == (0.25, pytest.approx((0.25 * 0.75) ** 0.5))


def test_one_success_in_sixteen_keeps_it_and_seven_failures_with_inclusion_weights():
    rewards = [0.0] * 16
    rewards[11] = 1.0
    kept = balanced_subset(rewards, 8, random.Random(0), weights="inclusion")
    assert len(kept) == 8 and kept == sorted(kept)
    by_index = dict(kept)
    assert by_index[11] == pytest.approx(0.5)  # (8 / 16) x (1 / 1)
    assert all(w == pytest.approx(15 / 14) for i, w in kept if i != 11)  # (8 / 16) x (15 / 7)
    assert all(w == 1.0 for _, w in balanced_subset(rewards, 8, random.Random(0), weights="none"))


def test_sides_share_half_each_and_make_up_for_a_short_side():
    # 10 draws, 3 successes, group of 4: two above the mean, two below
    rewards = [1.0, 0, 0, 1.0, 0, 0, 0, 1.0, 0, 0]
    kept = balanced_subset(rewards, 4, random.Random(1))
    assert sum(rewards[i] for i, _ in kept) == 2
    # 9 successes, 1 failure, group of 4: the lower side has one, the upper gives three
    rewards = [1.0] * 9 + [0.0]
    kept = balanced_subset(rewards, 4, random.Random(2), weights="inclusion")
    assert sorted(rewards[i] for i, _ in kept) == [0.0, 1.0, 1.0, 1.0]
    assert dict(kept)[9] == pytest.approx(4 / 10 * 1 / 1)
    # as many draws as the group: everything, weight 1
    assert balanced_subset([0.0, 1.0, 0.0], 3, random.Random(0)) == [(0, 1.0), (1, 1.0), (2, 1.0)]


def test_the_kept_groups_gradient_is_unbiased_for_all_draws_exactly():
    """E over the subset choice of sum_kept w_i A_i x_i = (g / n) sum_all A_i x_i, with A_i = r_i - mean of
    all draws and x_i any per-sample vector (a stand-in for grad log pi_i): enumerated, in fractions."""
    rewards = [Fraction(0), Fraction(0), Fraction(1), Fraction(0), Fraction(0), Fraction(0)]
    x = [Fraction(p) for p in (2, 3, 5, 7, 11, 13)]
    n, g = len(rewards), 3
    mean = sum(rewards) / n  # 1/6
    high = [i for i in range(n) if rewards[i] > mean]  # [2]: keep 1 of 1
    low = [i for i in range(n) if rewards[i] <= mean]  # [0, 1, 3, 4, 5]: keep 2 of 5
    w_high, w_low = Fraction(g, n) * Fraction(1, 1), Fraction(g, n) * Fraction(5, 2)  # 1/2, 5/4
    # the function's own weights are these
    kept = dict(balanced_subset([float(r) for r in rewards], g, random.Random(0), weights="inclusion"))
    assert sorted(kept.values()) == pytest.approx(sorted([float(w_high)] + [float(w_low)] * 2))
    total, count = Fraction(0), 0
    for h in itertools.combinations(high, 1):
        for lo in itertools.combinations(low, 2):
            total += sum(w_high * (rewards[i] - mean) * x[i] for i in h)
            total += sum(w_low * (rewards[i] - mean) * x[i] for i in lo)
            count += 1
    expected = Fraction(g, n) * sum((rewards[i] - mean) * x[i] for i in range(n))
    assert total / count == expected
    # weights: draws, (n_side / k_side) = 1 and 5/2: unbiased for training on all n draws, unscaled
    drawn = dict(balanced_subset([float(r) for r in rewards], g, random.Random(0), weights="draws"))
    assert drawn[2] == 1.0 and sorted(drawn.values()) == [1.0, 2.5, 2.5]
    total = Fraction(0)
    for h in itertools.combinations(high, 1):
        for lo in itertools.combinations(low, 2):
            total += sum((rewards[i] - mean) * x[i] for i in h) + sum(Fraction(5, 2) * (rewards[i] - mean) * x[i]
                                                                      for i in lo)
    assert total / count == sum((rewards[i] - mean) * x[i] for i in range(n))
    # and the same without the weights is biased: the balanced subset over-weights the rare side
    biased = Fraction(0)
    for h in itertools.combinations(high, 1):
        for lo in itertools.combinations(low, 2):
            biased += sum((rewards[i] - mean) * x[i] for i in h + lo)
    assert biased / count != expected


def test_advantages_against_all_draws_by_hand():
    # 64 draws, one success: mean 1/64, std sqrt(63)/64
    d = DrawStats(n=64, mean=1 / 64, std=63 ** 0.5 / 64)
    a = from_draws([1.0, 0.0], d, "grpo", eps=0.0)
    assert a[0] == pytest.approx((63 / 64) / (63 ** 0.5 / 64)) and a[1] == pytest.approx(-(1 / 64) / (63 ** 0.5 / 64))
    assert from_draws([1.0, 0.0], d, "grpo_nostd") == pytest.approx([63 / 64, -1 / 64])
    # rloo over every draw: r - (n mean - r) / (n - 1) = 1 - 0/63, 0 - 1/63
    assert from_draws([1.0, 0.0], d, "rloo") == pytest.approx([1.0, -1 / 63])
    # the weights multiply; a group without draws is its own baseline
    out = group_advantages([[1.0, 0.0], [1.0, 0.0]], "grpo_nostd", draws=[d, None], weights=[[0.5, 2.0], [1.0, 1.0]])
    assert out == [pytest.approx([0.5 * 63 / 64, -2 / 64]), pytest.approx([0.5, -0.5])]


def run_rounds(success_at: int | None, cfg: AdaptiveConfig, group_size: int = 4, record: RoundYield | None = None):
    """Scripted draws: the sample with overall index `success_at` succeeds, all others fail."""
    calls = []

    async def draw(count: int, offset: int):
        calls.append((count, offset))
        return [sample(1.0 if offset + i == success_at else 0.0) for i in range(count)]

    return asyncio.run(sample_adaptively(draw, group_size, cfg, random.Random(0), record)), calls


def test_rounds_stop_at_the_first_spread_and_at_the_budget():
    cfg = AdaptiveConfig(max_samples=16)
    got, calls = run_rounds(9, cfg)  # the success is in the third round
    assert calls == [(4, 0), (4, 4), (4, 8)]
    assert (got.drawn, got.rounds, got.successes, got.signal) == (12, 3, 1, True)
    assert len(got.samples) == 4 and sum(s.reward for s in got.samples) == 1.0
    assert got.mean == pytest.approx(1 / 12)
    # never: the whole budget, the first group_size go out without signal and weight 1
    got, calls = run_rounds(None, cfg)
    assert calls == [(4, 0), (4, 4), (4, 8), (4, 12)]
    assert (got.drawn, got.rounds, got.successes, got.signal) == (16, 4, 0, False)
    assert [s.weight for s in got.samples] == [1.0] * 4
    # a spread in the first round: exactly one ordinary group
    got, calls = run_rounds(0, cfg)
    assert calls == [(4, 0)] and got.drawn == 4 and all(s.weight == 1.0 for s in got.samples)
    # round_size and a last round cut to the budget
    got, calls = run_rounds(None, AdaptiveConfig(max_samples=10, round_size=3))
    assert calls == [(4, 0), (3, 4), (3, 7)] and got.drawn == 10


def history(first: tuple[int, int], second: tuple[int, int], size: int = 4) -> RoundYield:
    """A record where round 1 found a spread first[0] times in first[1] prompts, round 2 second[0] in second[1]."""
    rec = RoundYield()
    for k, (found, tries) in ((1, first), (2, second)):
        for i in range(tries):
            rec.record(k, size, i < found)
    return rec


def test_yield_stops_a_prompt_whose_next_round_finds_less_per_draw_than_a_fresh_prompt():
    cfg = AdaptiveConfig(max_samples=16)
    assert cfg.stop == "yield"
    # round 1 found a spread in 50 of 100 fresh prompts, round 2 in 0 of 100: the failed prompt stops
    got, calls = run_rounds(None, cfg, record=history((50, 100), (0, 100)))
    assert calls == [(4, 0)] and (got.drawn, got.rounds, got.signal) == (4, 1, False)
    # round 2 as good as round 1: it goes on (and round 3, with no record yet, is explored as often as not)
    rec = history((10, 100), (30, 100))
    got, calls = run_rounds(5, cfg, record=rec)
    assert calls == [(4, 0), (4, 4)] and got.signal
    # the outcomes are recorded: round 1 missed, round 2 found
    assert list(rec.outcomes[1])[-1] == (False, 4) and list(rec.outcomes[2])[-1] == (True, 4)
    # stop: spread ignores the record and spends the budget
    got, calls = run_rounds(None, AdaptiveConfig(max_samples=16, stop="spread"), record=history((50, 100), (0, 100)))
    assert got.drawn == 16


def test_yield_rates_are_per_draw_and_explore_an_empty_record():
    rng = random.Random(0)
    # the same chance per round, but round 2 draws twice as many: half the rate per draw
    rec = RoundYield()
    for i in range(1000):
        rec.record(1, 4, i % 2 == 0)
        rec.record(2, 8, i % 2 == 0)
    assert np.mean([rec.rate(1, rng) for _ in range(200)]) == pytest.approx(0.5 / 4, rel=0.05)
    assert np.mean([rec.rate(2, rng) for _ in range(200)]) == pytest.approx(0.5 / 8, rel=0.05)
    assert not any(rec.worth(2, rng) for _ in range(50))
    # nothing recorded: Beta(1, 1) against Beta(1, 1), tried about half the time
    empty = RoundYield()
    assert 60 < sum(empty.worth(2, rng) for _ in range(200)) < 140
    # the window forgets: the 8 most recent outcomes are kept, older finds drop out
    win = RoundYield(window=8)
    for found in [True] * 8 + [False] * 8:
        win.record(2, 4, found)
    assert all(f is False for f, _ in win.outcomes[2])


def test_the_group_carries_its_account_over_the_wire_and_a_forged_one_is_refused():
    got, _ = run_rounds(5, AdaptiveConfig(max_samples=8))
    g = TrajectoryGroup(run="r", prompt_id="p", epoch=0, samples=got.samples, adaptive=got.account())
    back = codec.decode(codec.encode(g), expect=TrajectoryGroup)
    assert back.adaptive == got.account() and [s.weight for s in back.samples] == [s.weight for s in got.samples]
    for bad in ({"drawn": 2, "mean": 0.1, "std": 0.1}, {"drawn": 8, "mean": float("nan"), "std": 0.1},
                {"drawn": 8, "mean": 0.1, "std": -1.0}, {"drawn": True, "mean": 0.1, "std": 0.1}):
        g.adaptive = bad
        with pytest.raises(codec.DecodeError):
            codec.decode(codec.encode(g), expect=TrajectoryGroup)
    g.adaptive = {}
    g.samples[0].weight = 1e9
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.encode(g), expect=TrajectoryGroup)


def test_max_samples_below_the_group_size_is_refused():
    from shared.config import JetrlConfig

    with pytest.raises(ValueError, match="rollout.adaptive.max_samples"):
        JetrlConfig.model_validate({"rollout": {"group_size": 8, "adaptive": {"max_samples": 4}}})
