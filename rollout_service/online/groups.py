"""Rewarded online sessions -> trajectory groups (docs/environments.md, "Online training").

With a group key (sessions the caller knows answer the same request: n samples of one prompt, the
variants of an A/B test) the group's rewards are its baseline, exactly as for a dataset prompt: the
trainer's estimator (trainer.algorithm.adv_estimator) over the group.

Without one a session has no siblings to compare with, so it is trained alone against a moving baseline:
the mean and std of the rewards of the last `window` rewarded ungrouped sessions, its own included, given
to the trainer as the group statistics (TrajectoryGroup.adaptive, the form adaptive sampling uses). With
GRPO that is (r - mean) / (std + eps) over the window, REINFORCE with a running baseline: it removes most
of the reward's scale and drift without a second answer to the same request. It is noisier than a group,
because the window mixes requests of different difficulty; give a group key when you can.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque

from rollout_service.agents.trajectory import episode_samples
from rollout_service.online.records import OnlineSession
from shared.contract.messages import TrajectoryGroup


class MovingBaseline:
    """The rewards of the last `window` ungrouped sessions."""

    def __init__(self, window: int):
        self.rewards: deque[float] = deque(maxlen=window)

    def account(self, reward: float, eps: float = 1e-6) -> dict:
        """Add `reward`; the group statistics its session is trained against (TrajectoryGroup.adaptive)."""
        self.rewards.append(float(reward))
        n = len(self.rewards)
        mean = sum(self.rewards) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in self.rewards) / n)
        return {"drawn": n, "mean": mean, "std": std, "signal": std > eps, "rounds": 0, "successes": 0,
                "baseline": "moving"}


def group_prompt_id(app: str, group: str, first_session: str) -> str:
    """The prompt id of a group: the application, a digest of its group key, and its first session (a key
    used again later makes a new group)."""
    digest = hashlib.sha256(f"{app}\0{group}".encode()).hexdigest()[:12]
    return f"online-{app}-{digest}-{first_session[:12]}"


def build_group(run: str, sessions: list[OnlineSession], worker: str, adaptive: dict | None = None) -> TrajectoryGroup:
    """One trajectory group from rewarded sessions (a group's, or one ungrouped session with its baseline).
    Every call of a session becomes samples by the endpoint's merge rule (agents/trajectory.py), each with the
    session's reward; the versions are the ones the engine recorded token by token, so the trainer measures
    staleness on them as for any group."""
    samples = []
    for s in sessions:
        for sample in episode_samples(s.calls, float(s.reward)):
            sample.metrics.update({"session": s.id, "episode_calls": len(s.calls), "reward_source": "online"})
            samples.append(sample)
    first = sessions[0]
    prompt_id = group_prompt_id(first.app, first.group, first.id) if first.group else f"online-{first.app}-{first.id}"
    adaptive = dict(adaptive or {})
    if adaptive and adaptive["drawn"] < len(samples):  # a session of many chains: its own samples are the group
        adaptive = {}
    return TrajectoryGroup(run=run, prompt_id=prompt_id, epoch=0, samples=samples, workflow="online", worker=worker,
                           released_at_version=min((v for s in sessions for c in s.calls for v in c.result.versions
                                                    if v >= 0), default=0),
                           metrics={"sessions": len(sessions), "apps": sorted({s.app for s in sessions})},
                           adaptive=adaptive)
