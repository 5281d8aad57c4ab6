"""Groups without a reward spread: why the intake filters them, and SignalWatch's `no_signal` events."""

import numpy as np

from shared.config import JetrlConfig
from shared.contract.messages import Sample, TrajectoryGroup
from trainer_service.intake import filter_reason
from trainer_service.service import group_has_spread, samples_drawn
from trainer_service.signal_watch import SignalWatch, default_threshold


def group(rewards, adaptive=None) -> TrajectoryGroup:
    samples = [Sample(tokens=np.array([1, 2], np.int32), loss_mask=np.array([0, 1], np.uint8),
                      logprobs=np.zeros(2, np.float32), versions=np.array([-1, 0], np.int32), prompt_len=1, reward=r)
               for r in rewards]
    return TrajectoryGroup(run="r", prompt_id="p", epoch=0, samples=samples, adaptive=adaptive or {})


def test_filter_reasons():
    cfg = JetrlConfig()
    assert filter_reason(group([0.0, 0.0]), cfg) is None  # trained (zero advantage) without dynamic_filter
    assert filter_reason(group([]), cfg) == "no samples"
    no = {"drawn": 64, "mean": 0.0, "std": 0.0, "signal": False, "successes": 0, "rounds": 8}
    assert filter_reason(group([0.0] * 8, no), cfg) == "no signal after 64 samples"
    dyn = JetrlConfig.model_validate({"trainer": {"algorithm": {"dynamic_filter": True}}})
    assert filter_reason(group([1.0, 1.0]), dyn) == "no reward spread (trainer.algorithm.dynamic_filter)"
    assert filter_reason(group([1.0, 0.0]), dyn) is None


def test_spread_and_draws_of_a_group():
    assert group_has_spread(group([0.0, 1.0])) and not group_has_spread(group([0.5, 0.5]))
    a = {"drawn": 24, "mean": 1 / 24, "std": 0.2, "signal": True, "successes": 1, "rounds": 3}
    assert group_has_spread(group([1.0, 0.0], a)) and samples_drawn(group([1.0, 0.0], a)) == 24
    assert samples_drawn(group([1.0, 0.0, 0.0])) == 3


def test_signal_watch_says_it_once_and_says_when_it_ends():
    w = SignalWatch(threshold=4)
    assert w.observe(1, [False, False]) == []
    assert w.observe(2, [True]) == []  # a spread resets the streak
    assert w.observe(3, [False, False, False]) == []
    [ev] = w.observe(4, [False, False])
    assert ev["active"] and ev["since_step"] == 3 and ev["groups"] == 4 and "no learning signal" in ev["message"]
    assert w.observe(5, [False] * 10) == []  # said once
    [end] = w.observe(6, [False, True])
    assert not end["active"] and end["groups"] == 16 and end["since_step"] == 3
    assert w.observe(7, [True]) == []


def test_the_default_streak_is_longer_where_adaptive_sampling_filters_by_design():
    assert default_threshold(4, adaptive=False) == 12
    assert default_threshold(4, adaptive=True) == 40
