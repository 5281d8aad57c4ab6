"""Whether the run is learning from anything: a streak of groups without a reward spread.

A group whose rewards are all equal has zero group-relative advantage: trained, it moves nothing but the
KL and entropy terms; filtered (dynamic_filter, adaptive sampling without signal), it is not trained at
all. A run in that state steps (or waits) on nothing while the clock runs. SignalWatch counts such groups
in the order the trainer decides them; when trainer.no_signal_groups of them come in a row it returns a
`no_signal` event's data (active: true, with the step where the streak began and a hint), and when a group
with a spread comes after that, the event that ends it (active: false). The controller shows the latest one
in GET /v1/runs/{run}, `jetrl status` and the dashboard.
"""

from __future__ import annotations

from collections.abc import Iterable

HINT = ("every recent group had equal rewards (zero advantage): the policy almost never or always succeeds. "
        "Try rollout.adaptive.max_samples (sample such prompts more), launch.sampling: learnable-first, a larger "
        "rollout.group_size, or an easier curriculum; GET /v1/runs/{run}/prompts/stats shows the solve rates")


def default_threshold(batch_size: int, adaptive: bool) -> int:
    """trainer.no_signal_groups when 0: three batches' worth of groups; ten with adaptive sampling on, where
    most prompts are expected to be filtered without signal (only those that found a spread train, and
    `stop: yield` gives up on a prompt after one round where extra rounds do not pay): a streak of three
    batches there is a normal minute of a run that is learning."""
    return (10 if adaptive else 3) * batch_size


class SignalWatch:
    def __init__(self, threshold: int):
        self.threshold = threshold
        self.streak = 0  # groups without a spread, in a row
        self.since_step: int | None = None  # the step when the streak began
        self.active = False

    def observe(self, step: int, spreads: Iterable[bool]) -> list[dict]:
        """Feed groups decided at `step` (True: the group had a reward spread). Returns the data of a
        `no_signal` event for each change of state (usually none)."""
        events = []
        for spread in spreads:
            if spread:
                if self.active:
                    events.append({"active": False, "step": step, "since_step": self.since_step,
                                   "groups": self.streak,
                                   "message": f"reward spread again at step {step} after {self.streak} groups "
                                              "without"})
                self.streak, self.since_step, self.active = 0, None, False
                continue
            if self.streak == 0:
                self.since_step = step
            self.streak += 1
            if not self.active and self.streak >= self.threshold:
                self.active = True
                events.append({"active": True, "step": step, "since_step": self.since_step, "groups": self.streak,
                               "message": f"no learning signal: the last {self.streak} groups (since step "
                                          f"{self.since_step}) had no reward spread; {HINT}"})
        return events
