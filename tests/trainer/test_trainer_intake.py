"""Intake against a real nats-server: staleness bound, dynamic filtering, dedup, resume position."""

from __future__ import annotations

import asyncio

from trainer_testlib import make_group, publish_groups

from shared.config import JetrlConfig
from trainer_service.intake import Intake, IntakeState


def _cfg(**trainer_algo) -> JetrlConfig:
    cfg = JetrlConfig(run="it")
    cfg.schedule.batch_size = 2
    cfg.schedule.max_staleness = 2
    for k, v in trainer_algo.items():
        setattr(cfg.trainer.algorithm, k, v)
    return cfg


async def _intake(js, nc, cfg, state=None) -> Intake:
    intake = Intake(cfg, js, nc, state)
    await intake.start()
    return intake


async def test_stale_samples_are_dropped_at_exactly_the_bound(js, nc):
    cfg = _cfg()
    # trainer at version 5, max_staleness 2: token version 3 (staleness 2) is kept, 2 (staleness 3) dropped.
    groups = [
        make_group("it", 0, versions=[3, 2], rewards=(1.0, 0.0)),
        make_group("it", 1, versions=[2, 2], rewards=(1.0, 0.0)),  # all stale: dropped as a group
        make_group("it", 2, versions=[5, 4], rewards=(0.0, 1.0)),
    ]
    await publish_groups(js, nc, groups)
    intake = await _intake(js, nc, cfg)
    try:
        batch = await intake.next_batch(version=5, timeout_s=20)
    finally:
        await intake.stop()
    assert batch is not None
    assert [g.prompt_id for g in batch.groups] == ["p0", "p2"]
    assert [len(f) for f in batch.fresh] == [1, 2]
    assert batch.fresh[0][0].oldest_version() == 3
    assert batch.dropped_stale == ["it:0:p1"]
    assert batch.dropped_stale_samples == 3  # one of p0, both of p1
    assert dict(batch.staleness_hist) == {2: 1, 0: 1, 1: 1}


async def test_dynamic_filter_drops_groups_whose_rewards_are_all_equal(js, nc):
    cfg = _cfg(dynamic_filter=True)
    groups = [make_group("it", 0, rewards=(1.0, 1.0)), make_group("it", 1, rewards=(0.0, 1.0)),
              make_group("it", 2, rewards=(0.0, 0.0)), make_group("it", 3, rewards=(1.0, 0.0))]
    await publish_groups(js, nc, groups)
    intake = await _intake(js, nc, cfg)
    try:
        batch = await intake.next_batch(version=0, timeout_s=20)
    finally:
        await intake.stop()
    assert [g.prompt_id for g in batch.groups] == ["p1", "p3"]
    assert batch.filtered == ["it:0:p0", "it:0:p2"]


async def test_without_the_filter_equal_reward_groups_are_trained(js, nc):
    await publish_groups(js, nc, [make_group("it", 0, rewards=(1.0, 1.0)), make_group("it", 1)])
    intake = await _intake(js, nc, _cfg())
    try:
        batch = await intake.next_batch(version=0, timeout_s=20)
    finally:
        await intake.stop()
    assert [g.prompt_id for g in batch.groups] == ["p0", "p1"]


async def test_a_republished_group_id_is_trained_once(js, nc):
    g = make_group("it", 0)
    from shared.contract import bus, subjects

    # Different Nats-Msg-Id so the stream keeps both copies: the trainer must dedup by group id.
    await bus.publish(js, nc, subjects.trajectories("it"), g, msg_id="a")
    await bus.publish(js, nc, subjects.trajectories("it"), g, msg_id="b")
    await publish_groups(js, nc, [make_group("it", 1), make_group("it", 2)])
    intake = await _intake(js, nc, _cfg())
    try:
        batch = await intake.next_batch(version=0, timeout_s=20)
    finally:
        await intake.stop()
    assert [x.prompt_id for x in batch.groups] == ["p0", "p1"]
    assert intake.duplicates == 1


async def test_resume_position_rereads_buffered_groups_and_skips_finished_ones(js, nc):
    await publish_groups(js, nc, [make_group("it", i) for i in range(5)])
    cfg = _cfg()
    intake = await _intake(js, nc, cfg)
    try:
        first = await intake.next_batch(version=0, timeout_s=20)
        # wait until the rest is buffered, then take the position a checkpoint would record
        for _ in range(100):
            if len(intake.buffer) == 3:
                break
            import asyncio

            await asyncio.sleep(0.1)
        pos = intake.position()
    finally:
        await intake.stop()
    assert [g.prompt_id for g in first.groups] == ["p0", "p1"]
    assert pos.position == 2 and "it:0:p0" in pos.finished
    resumed = await _intake(js, nc, cfg, IntakeState(position=pos.position, finished=pos.finished))
    try:
        again = await resumed.next_batch(version=0, timeout_s=20)
    finally:
        await resumed.stop()
    assert [g.prompt_id for g in again.groups] == ["p2", "p3"]


async def test_a_batch_takes_the_oldest_generations_first_not_the_first_arrivals(js, nc):
    cfg = _cfg()
    cfg.schedule.max_staleness = 4
    # arrival order p0 (v5), p1 (v2), p2 (v4): trainer at 6, batch 2 -> p1 (staleness 4, about to go
    # stale) and p2; p0 waits for the next batch.
    groups = [make_group("it", 0, versions=[5, 5]), make_group("it", 1, versions=[2, 3]),
              make_group("it", 2, versions=[4, 5])]
    await publish_groups(js, nc, groups)
    intake = await _intake(js, nc, cfg)
    try:
        for _ in range(100):
            if len(intake.buffer) == 3:
                break
            await asyncio.sleep(0.05)
        batch = await intake.next_batch(version=6, timeout_s=20)
    finally:
        await intake.stop()
    assert sorted(g.prompt_id for g in batch.groups) == ["p1", "p2"]
    assert [g.prompt_id for _, g in intake.buffer] == ["p0"]


async def test_batch_wait_trains_what_is_held_once_the_oldest_group_has_waited(js, nc):
    """schedule.batch_wait_s: one group of a batch of 2 waits ~1 s, then goes out alone as a partial batch;
    without it the same intake times out holding it."""
    cfg = _cfg()
    cfg.schedule.batch_wait_s = 1.0
    await publish_groups(js, nc, [make_group("it", 0, rewards=(1.0, 0.0))])
    intake = await _intake(js, nc, cfg)
    loop = asyncio.get_running_loop()
    try:
        t0 = loop.time()
        batch = await intake.next_batch(version=0, timeout_s=20)
        waited = loop.time() - t0
        assert batch is not None and batch.partial and [g.prompt_id for g in batch.groups] == ["p0"]
        assert 0.5 <= waited < 10, waited
        assert intake.buffer == [] and intake.arrived_at == {} and intake.wait_left() == float("inf")
        # a full batch is not held back by the wait
        await publish_groups(js, nc, [make_group("it", 1, rewards=(1.0, 0.0)), make_group("it", 2, rewards=(0.0, 1.0))])
        batch = await intake.next_batch(version=0, timeout_s=20)
        assert batch is not None and not batch.partial and len(batch.groups) == 2
    finally:
        await intake.stop()
    cfg.schedule.batch_wait_s = 0.0
    cfg.run = "it2"
    await publish_groups(js, nc, [make_group("it2", 0, rewards=(1.0, 0.0))])
    intake = await _intake(js, nc, cfg)
    try:
        assert await intake.next_batch(version=0, timeout_s=2.0) is None
        assert len(intake.buffer) == 1
    finally:
        await intake.stop()
