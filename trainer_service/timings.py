"""Where a training step's wall time went, and how long its samples took before it (pure functions).

A step's wall time runs from the end of the previous step's accounting to this step's "step" event; it
is cut into consecutive stages, so they add up to it:

    wait         the trainer had no full batch (trajectories still being generated)
    prepare      advantages and train items
    forward / backward / optimizer   inside train_step (rank 0's clock)
    train_other  the rest of the train command: packing, host->device copies, collectives, the hop to the
                 backend's thread
    publish      full state dict, upload to the weight store, announcement; with trainer.publish_overlap
                 the state dict and the wait for the previous version's upload only (the step event's
                 `publish_store_s` has the last upload's own duration)
    events       the previous step's events and metrics
    checkpoint   the previous step's checkpoint (0 when it took none)

The rollout side of a step (means over its groups' samples, from `Sample.timings`): generate, reward,
tools, and queue_wait (a group's time in the TRAJECTORIES stream: created_at -> its batch formed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared.contract.messages import ROLLOUT_STAGES


def step_stages(train_s: float, inner: Mapping[str, float], marks: Mapping[str, float],
                carried: Mapping[str, float]) -> dict[str, float]:
    """The trainer stages of one step. `marks`: wait, prepare, publish (seconds); `inner`: forward,
    backward, optimizer measured inside train_step (absent for a backend without them); `train_s`: the
    train command's wall time seen by the service loop; `carried`: events and checkpoint of the previous step."""
    inner_sum = sum(inner.get(k, 0.0) for k in ("forward", "backward", "optimizer"))
    out = {"wait": marks.get("wait", 0.0), "prepare": marks.get("prepare", 0.0),
           "forward": inner.get("forward", 0.0), "backward": inner.get("backward", 0.0),
           "optimizer": inner.get("optimizer", 0.0), "train_other": max(0.0, train_s - inner_sum),
           "publish": marks.get("publish", 0.0), "events": carried.get("events", 0.0),
           "checkpoint": carried.get("checkpoint", 0.0)}
    return {k: max(0.0, float(v)) for k, v in out.items()}


def rollout_stages(groups: Sequence, now: float) -> dict[str, float]:
    """Means over the batch's samples of generate, reward and tools seconds, and the mean queue wait of
    its groups (`now` - created_at, both unix seconds; 0 when the clocks disagree)."""
    sums = dict.fromkeys(ROLLOUT_STAGES[:3], 0.0)
    n = 0
    for g in groups:
        for s in g.samples:
            n += 1
            for k in sums:
                v = s.timings.get(k, 0.0) if isinstance(s.timings, dict) else 0.0
                sums[k] += float(v) if isinstance(v, (int, float)) else 0.0
    out = {k: v / n if n else 0.0 for k, v in sums.items()}
    out["queue_wait"] = (sum(max(0.0, now - float(g.created_at)) for g in groups) / len(groups)) if groups else 0.0
    return out
