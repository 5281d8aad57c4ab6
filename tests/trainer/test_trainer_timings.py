"""Per-stage timing of a training step: the stages of the trainer's "step" event add up to the step's wall
time, and the rollout side (generate, reward, tools, queue wait) is averaged from Sample.timings."""

from __future__ import annotations

import time

import pytest
from trainer_testlib import make_group, publish_groups, start_trainer, steps, trainer_overrides, wait_for

from shared.contract.messages import TRAINER_STAGES
from trainer_service.timings import rollout_stages, step_stages

RUN = "tim"


def test_step_stages_split_the_train_step_and_carry_the_previous_steps_bookkeeping():
    got = step_stages(2.0, {"forward": 0.5, "backward": 0.9, "optimizer": 0.1},
                      {"wait": 3.0, "prepare": 0.25, "publish": 0.75}, {"events": 0.05, "checkpoint": 1.0})
    assert got == {"wait": 3.0, "prepare": 0.25, "forward": 0.5, "backward": 0.9, "optimizer": 0.1,
                   "train_other": pytest.approx(0.5), "publish": 0.75, "events": 0.05, "checkpoint": 1.0}
    # a backend without an inner clock (sim): the whole train_step is train_other; nothing goes negative
    got = step_stages(1.5, {}, {"wait": -0.001, "prepare": 0.0, "publish": 0.0}, {})
    assert got["train_other"] == 1.5 and got["wait"] == 0.0 and got["checkpoint"] == 0.0


def test_rollout_stages_are_sample_means_and_queue_wait_is_per_group():
    g1, g2 = make_group(RUN, 1), make_group(RUN, 2)
    for s, (gen, rew, tools) in zip(g1.samples + g2.samples, [(1, 0.1, 0), (3, 0.3, 2), (2, 0.2, 0), (2, 0.2, 2)],
                                    strict=True):
        s.timings = {"generate": gen, "reward": rew, "tools": tools, "total": 99}
    g1.created_at, g2.created_at = 100.0, 104.0
    got = rollout_stages([g1, g2], now=110.0)
    assert got == {"generate": 2.0, "reward": pytest.approx(0.2), "tools": 1.0, "queue_wait": 8.0}
    assert rollout_stages([], now=1.0) == {"generate": 0.0, "reward": 0.0, "tools": 0.0, "queue_wait": 0.0}


async def test_stage_timings_add_up_to_the_steps_wall_time(nats_server, js, nc, tmp_path):
    ov = trainer_overrides(nats_server.url, tmp_path, RUN, **{"trainer.checkpoint_every": 1,
                                                             "schedule.total_steps": 3})
    groups = [make_group(RUN, i) for i in range(6)]
    for g in groups:
        g.created_at = time.time()
        for s in g.samples:
            s.timings = {"generate": 0.5, "reward": 0.25, "tools": 0.0}
    await publish_groups(js, nc, groups)
    p = start_trainer(ov, tmp_path / "trainer.log")
    try:
        evs = await wait_for(js, RUN, lambda e: len(steps(e)) >= 3, proc=p, what="three steps")
    finally:
        p.terminate()
        p.wait(60)
    step_events = [e for e in evs if e.kind == "step"]
    for e in step_events:
        d = e.data
        t = d["timings"]
        assert set(t) == set(TRAINER_STAGES) and all(v >= 0 for v in t.values())
        assert t["forward"] > 0 and t["backward"] > 0 and t["optimizer"] > 0 and t["publish"] > 0
        assert sum(t.values()) == pytest.approx(d["wall_s"], rel=0.10), t
        assert t["forward"] + t["backward"] + t["optimizer"] <= d["step_time_s"] * 1.001
        r = d["rollout_timings"]
        assert r["generate"] == 0.5 and r["reward"] == 0.25 and r["tools"] == 0.0 and r["queue_wait"] > 0
    # the wall time is the time between consecutive step events, measured independently of the stages
    for prev, cur in zip(step_events, step_events[1:], strict=False):
        assert cur.data["wall_s"] == pytest.approx(cur.time - prev.time, rel=0.10, abs=0.05)
        assert cur.data["timings"]["checkpoint"] > 0  # the previous step's checkpoint (checkpoint_every 1)
