"""The rollout service on a real nats-server with the real reward service: groups published once per prompt
and acked after, weights followed mid-flight, the staleness gate, workers joining and leaving."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from rollout_doubles import (
    KVWeights,
    ScriptedEngine,
    publish_prompts,
    read_groups,
    wait_for,
    worker_config,
)

from rollout_service.engines.base import EngineDead
from rollout_service.service import RolloutWorker
from shared.contract import bus, codec, subjects
from shared.contract.messages import Event
from shared.model.tinymodel import build_tokenizer

RUN = "r1"


def answer_max(prompt: str, n: int) -> str:
    """Scripted policy: right on even calls (the largest digit), wrong on odd ones."""
    digits = [c for c in prompt.split("=")[0] if c.isdigit()]
    return " " + (max(digits) if n % 2 == 0 else "x") + " done"


def make_worker(nats_config, tok=None, delay=0.0, weights=None, name="w", **rollout) -> RolloutWorker:
    tok = tok or build_tokenizer()
    cfg = worker_config(nats_config.servers[0], RUN, **rollout)
    if weights is None:
        cfg.rollout.service.follow_weights = False
    return RolloutWorker(cfg, engine=ScriptedEngine(tok, answer_max, token_delay_s=delay), tokenizer=tok,
                         weights=weights, instance=name)


async def prompts_left(js) -> int:
    return (await js.stream_info(subjects.PROMPTS_STREAM)).state.messages


async def test_each_prompt_becomes_one_scored_group_and_is_acked_after_it(nats_config, nc, js, reward_service):
    ids = await publish_prompts(js, nc, RUN, 6)
    events = await nc.subscribe(subjects.events(RUN, "rollout"))
    await bus.flush(nc)
    worker = make_worker(nats_config)
    task = asyncio.create_task(worker.run())
    groups = await wait_for(lambda: _n_groups(js, 6), what="6 trajectory groups")
    await wait_for(lambda: _zero(prompts_left(js)), what="prompts acked (work queue empty)")
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert sorted(g.group_id for g in groups) == sorted(ids)
    tok = build_tokenizer()
    for g in groups:
        assert g.worker == "w" and g.workflow == "single_turn" and len(g.samples) == 2
        for s in g.samples:
            assert s.validate() is None
            gen = s.tokens[s.prompt_len:].tolist()
            assert s.loss_mask.tolist() == [0] * s.prompt_len + [1] * len(gen)
            assert (s.logprobs[s.prompt_len:] == -0.25).all() and (s.logprobs[: s.prompt_len] == 0).all()
            assert (s.versions[s.prompt_len:] == 0).all() and (s.versions[: s.prompt_len] == -1).all()
            text = tok.decode(gen)
            assert s.reward == (1.0 if not text.startswith(" x") else 0.0)  # scored by the reward service
    assert reward_service.handled == 6
    kinds = Counter()
    published = []
    while True:
        try:
            m = await events.next_msg(timeout=0.5)
        except Exception:
            break
        ev = codec.decode(m.data, Event)
        kinds[ev.kind] += 1
        if ev.kind == "published":
            published += ev.data["group_ids"]
    assert kinds["health"] >= 1 and sorted(published) == sorted(ids)
    assert worker.snapshot()["published"] == 6


async def _n_groups(js, n):
    groups = await read_groups(js, RUN)
    return groups if len(groups) >= n else None


async def _zero(coro):
    return (await coro) == 0


async def test_version_announced_while_a_group_generates_shows_up_in_its_versions(nats_config, nc, js,
                                                                                 reward_service):
    weights = KVWeights(js, RUN)
    await weights.announce(0)
    worker = make_worker(nats_config, delay=0.03, weights=weights.source(),
                         sampling={"max_new_tokens": 32})
    task = asyncio.create_task(worker.run())
    await publish_prompts(js, nc, RUN, 1)
    await wait_for(lambda: worker.engine.calls >= 2, what="generation started")
    await asyncio.sleep(0.1)
    await weights.announce(1)
    groups = await wait_for(lambda: _n_groups(js, 1), what="the group")
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert weights.fetched == [1] and worker.engine.loaded == [(1, f"/weights/{RUN}/v1")]
    for s in groups[0].samples:
        v = s.versions[s.loss_mask == 1].tolist()
        assert v[0] == 0 and v[-1] == 1 and v == sorted(v)  # switches once, at one token


async def test_no_new_prompts_while_the_engine_lags_more_than_max_staleness(nats_config, nc, js, reward_service):
    gate = asyncio.Event()
    weights = KVWeights(js, RUN, gate=gate)
    await weights.announce(3)  # engine is on 0; max_staleness 1: too stale to start work
    worker = make_worker(nats_config, weights=weights.source())
    worker.cfg.schedule.max_staleness = 1
    task = asyncio.create_task(worker.run())
    await publish_prompts(js, nc, RUN, 3)
    await wait_for(lambda: worker.follower is not None and worker.follower.latest == 3, what="announcement seen")
    await asyncio.sleep(1.5)
    assert worker.engine.calls == 0 and await prompts_left(js) == 3 and not worker.can_fetch()
    gate.set()  # the weight store answers: engine catches up to 3
    groups = await wait_for(lambda: _n_groups(js, 3), what="groups after catching up")
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert all((s.versions[s.loss_mask == 1] == 3).all() for g in groups for s in g.samples)


@pytest.mark.parametrize("max_staleness", [0, 4])
async def test_a_task_released_at_a_version_the_watch_has_not_shown_waits_for_those_weights(nats_config, nc, js,
                                                                                           reward_service,
                                                                                           max_staleness):
    # The controller saw version 2 and released the task at it; this worker's watch has not delivered 2
    # yet. Generated with version 0, the task would be stale when trained: with max_staleness 0 at once,
    # with 4 if it is the last of its admission window (trained 4 versions after its release).
    weights = KVWeights(js, RUN)
    await weights.announce(0)
    worker = make_worker(nats_config, weights=weights.source(watch=False))
    worker.cfg.schedule.max_staleness = max_staleness
    task = asyncio.create_task(worker.run())
    await wait_for(lambda: worker.follower is not None, what="worker started")
    await weights.announce(2)
    await publish_prompts(js, nc, RUN, 1, released_at_version=2)
    groups = await wait_for(lambda: _n_groups(js, 1), what="the group")
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert weights.fetched == [2] and worker.engine.version == 2
    assert all((s.versions[s.loss_mask == 1] == 2).all() for s in groups[0].samples)


async def test_second_worker_joining_takes_a_share_and_one_leaving_loses_nothing(nats_config, nc, js,
                                                                                reward_service):
    n = 24
    ids = await publish_prompts(js, nc, RUN, n)
    a = make_worker(nats_config, delay=0.01, name="a", max_in_flight=2)
    ta = asyncio.create_task(a.run())
    await wait_for(lambda: a.published >= 2, what="worker a started")
    b = make_worker(nats_config, delay=0.01, name="b", max_in_flight=2)
    tb = asyncio.create_task(b.run())
    await wait_for(lambda: b.published >= 2, what="worker b took a share")
    a.stop()  # a leaves mid-run: its tasks in flight finish and are acked, nothing is lost
    await asyncio.wait_for(ta, 60)
    groups = await wait_for(lambda: _n_groups(js, n), timeout=120, what=f"{n} groups")
    await wait_for(lambda: _zero(prompts_left(js)), what="all prompts acked")
    b.stop()
    await asyncio.wait_for(tb, 60)
    per_worker = Counter(g.worker for g in groups)
    assert sorted(g.group_id for g in groups) == sorted(ids)  # each exactly once
    assert per_worker["a"] >= 2 and per_worker["b"] >= 2
    assert a.published + b.published == n


async def test_a_failing_reward_service_means_retry_not_a_published_group(nats_config, nc, js):
    # No reward service at all: the prompt is nak'ed and redelivered, no group with fake rewards appears.
    worker = make_worker(nats_config)
    worker.cfg.reward.retries = 0
    worker.cfg.reward.timeout_s = 0.5
    task = asyncio.create_task(worker.run())
    await publish_prompts(js, nc, RUN, 1)
    await wait_for(lambda: worker.errors >= 2, timeout=60, what="two failed attempts")
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert await read_groups(js, RUN) == [] and await prompts_left(js) == 1


class DeadEngine(ScriptedEngine):
    async def generate(self, req):
        raise EngineDead("the server exited")


async def test_a_worker_whose_engine_died_stops_and_leaves_its_prompts_in_the_stream(nats_config, nc, js):
    worker = RolloutWorker(worker_config(nats_config.servers[0], RUN), engine=DeadEngine(build_tokenizer(), answer_max),
                           tokenizer=build_tokenizer(), instance="w")
    worker.cfg.rollout.service.follow_weights = False
    await publish_prompts(js, nc, RUN, 3)
    with pytest.raises(EngineDead):
        await asyncio.wait_for(worker.run(), 60)
    assert await prompts_left(js) == 3  # none acked, none dead-lettered: redelivered to a live worker
