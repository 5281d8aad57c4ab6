"""The reward service over a real nats-server: answers, bad input, replicas, retries, pools, events."""

from __future__ import annotations

import asyncio
from collections import Counter

import msgpack
import pytest
from prometheus_client import generate_latest
from reward_fixtures import replicas, run_config

from reward_service.client import RewardClient
from shared.config import RewardConfig
from shared.contract import bus, codec, subjects
from shared.contract.messages import Event, RewardRequest, RewardResult


async def test_a_group_is_scored_in_one_request(nats_config, nc):
    cfg = run_config(nats_config)
    async with replicas(cfg, 1, "gsm8k"):
        client = RewardClient(nc, cfg.reward)
        r = await client.score("gsm8k", ["#### 18", "The answer is 17.", "no idea"], "#### 18", {"prompt": "q"},
                               completion_ids=[[1, 2], [3], []])
    assert r.rewards == [1.0, 0.0, 0.0]
    assert r.errors == [None, None, None] and r.error is None
    assert [m["format"] for m in r.metrics] == ["hash", "answer_is", "none"]
    assert client.attempts == 1


async def test_bad_requests_get_an_error_result_and_the_service_stays_up(nats_config, nc):
    cfg = run_config(nats_config)
    subject = subjects.reward("exact")
    async with replicas(cfg, 1, "exact"):
        bad = [
            b"\xc1 not msgpack",
            msgpack.packb({"schema": "RewardRequest", "v": 1, "task": "exact"}),
            msgpack.packb({"schema": "RewardRequest", "v": 1, "task": "exact", "completions": ["a", 3],
                           "request_id": "r7"}),
            msgpack.packb({"schema": "RewardRequest", "v": 1, "task": 5, "completions": []}),
            msgpack.packb({1: 2}),
            msgpack.packb([1, 2]),
        ]
        for data in bad:
            reply = codec.decode((await nc.request(subject, data, timeout=5)).data, expect=RewardResult)
            assert reply.error and reply.error.startswith("bad request")
            assert all(x == 0.0 for x in reply.rewards)
        assert reply.rewards == [] and reply.request_id == ""
        wrong_types = codec.decode((await nc.request(subject, bad[2], timeout=5)).data, expect=RewardResult)
        assert wrong_types.request_id == "r7" and wrong_types.rewards == [0.0, 0.0]
        ok = await RewardClient(nc, cfg.reward).score("exact", ["a"], "a")
    assert ok.rewards == [1.0]


async def test_scorer_errors_are_per_completion_results(nats_config, nc):
    cfg = run_config(nats_config, scorer="reward_test_scorers:broken")
    async with replicas(cfg, 1, "custom"):
        r = await RewardClient(nc, cfg.reward).score("custom", ["x", "y"], None)
    assert r.rewards == [0.0, 0.0] and r.error is None
    assert all("always fails" in e for e in r.errors)


async def test_metrics_that_cannot_be_encoded_give_an_error_result(nats_config, nc):
    cfg = run_config(nats_config, scorer="reward_test_scorers:unencodable_metrics")
    async with replicas(cfg, 1, "odd"):
        r = await RewardClient(nc, cfg.reward).score("odd", ["x"], None)
    assert r.rewards == [0.0] and "could not be sent" in r.error


async def test_three_replicas_share_a_thousand_requests(nats_config, nc):
    cfg = run_config(nats_config, concurrency=16)
    async with replicas(cfg, 3, "exact") as services:
        client = RewardClient(nc, cfg.reward)
        sem = asyncio.Semaphore(50)

        async def one(i: int) -> RewardResult:
            async with sem:
                return await client.score("exact", [str(i), "x"], str(i))

        results = await asyncio.gather(*(one(i) for i in range(1000)))
        handled = [s.handled for s in services]
    assert all(r.rewards == [1.0, 0.0] for r in results)
    by_instance = Counter(r.extra["instance"] for r in results)
    assert sum(by_instance.values()) == 1000 and sum(handled) == 1000
    assert set(by_instance) == {"replica-0", "replica-1", "replica-2"}
    assert min(by_instance.values()) > 100, by_instance  # NATS spreads a queue group's load


async def test_no_responders_is_retried_until_a_replica_comes_up(nats_config, nc):
    cfg = run_config(nats_config, retries=8, retry_backoff_s=0.2, timeout_s=5)
    client = RewardClient(nc, cfg.reward)
    pending = asyncio.create_task(client.score("exact", ["a"], "a"))
    await asyncio.sleep(0.5)
    assert not pending.done()
    async with replicas(cfg, 1, "exact"):
        r = await asyncio.wait_for(pending, 30)
    assert r.rewards == [1.0] and r.error is None
    assert client.attempts > 1


async def test_without_any_replica_the_client_returns_an_error_result_instead_of_raising(nats_config, nc):
    cfg = run_config(nats_config, retries=1, retry_backoff_s=0.01)
    r = await RewardClient(nc, cfg.reward).score("exact", ["a", "b"], "a")
    assert r.rewards == [0.0, 0.0]
    assert "no reward service answers on jetrl.reward.exact" in r.error


async def test_a_hung_scorer_is_killed_in_the_process_pool_and_the_rest_are_scored(nats_config, nc):
    cfg = run_config(nats_config, scorer="reward_test_scorers:spin_forever", executor="process", processes=2,
                     scorer_timeout_s=1.0)
    async with replicas(cfg, 1, "spin") as (svc,):
        client = RewardClient(nc, cfg.reward)
        r = await client.score("spin", ["ok", "hang", "ok"], None)
        assert r.rewards == [1.0, 0.0, 1.0]
        assert r.errors[0] is None and "timed out after 1s" in r.errors[1]
        again = await client.score("spin", ["ok", "ok"], None)  # a fresh worker replaced the killed one
        assert again.rewards == [1.0, 1.0]
        assert svc.engine.pool_restarts == 1


async def test_a_catastrophic_regex_times_out_without_blocking_other_requests(nats_config, nc):
    cfg = run_config(nats_config, processes=2, scorer_timeout_s=4.0)  # generous: the fast one must finish first
    async with replicas(cfg, 1, "regex"):
        client = RewardClient(nc, cfg.reward)
        slow = asyncio.create_task(client.score("regex", ["a" * 40 + "!"], "^(a+)+$"))
        fast = await client.score("regex", ["abc"], "b")
        assert fast.rewards == [1.0] and not slow.done()
        r = await slow
    assert r.rewards == [0.0] and "timed out" in r.errors[0]


async def test_math_runs_in_the_process_pool(nats_config, nc):
    cfg = run_config(nats_config, processes=1)
    async with replicas(cfg, 1, "math") as (svc,):
        r = await RewardClient(nc, cfg.reward).score("math", ["$\\boxed{\\frac{2}{4}}$", "$1$"], "0.5")
    assert svc.engine.mode == "process"
    assert r.rewards == [1.0, 0.0]


async def test_a_math_answer_that_takes_sympy_too_long_is_a_timeout_error(nats_config, nc):
    cfg = run_config(nats_config, processes=2, scorer_timeout_s=2.0)
    async with replicas(cfg, 1, "math"):
        r = await RewardClient(nc, cfg.reward).score("math", ["$\\boxed{(x+1)^{100000}}$", "$\\boxed{1}$"], "1")
    assert r.rewards == [0.0, 1.0]
    assert "timed out after 2s" in r.errors[0] and r.errors[1] is None


async def test_a_request_may_ask_for_a_shorter_scorer_time_limit(nats_config, nc):
    cfg = run_config(nats_config, scorer="reward_test_scorers:slow_and_tell", scorer_timeout_s=30)
    async with replicas(cfg, 1, "slow"):
        req = codec.encode(RewardRequest(task="slow", completions=["a"], reference="a", payload={"sleep_s": 3},
                                         timeout_s=0.3))
        reply = codec.decode((await nc.request(subjects.reward("slow"), req, timeout=10)).data)
    assert reply.rewards == [0.0] and "timed out after 0.3s" in reply.errors[0]


async def test_health_events_and_metrics_are_published(nats_config, js, nc):
    cfg = run_config(nats_config)
    sub = await nc.subscribe(subjects.events(cfg.run, "reward"))
    await bus.flush(nc)
    async with replicas(cfg, 1, "exact", js=True) as (svc,):
        await RewardClient(nc, cfg.reward).score("exact", ["a", "b"], "a")
        ev = codec.decode((await sub.next_msg(timeout=10)).data, expect=Event)
        text = generate_latest(svc.metrics.registry).decode()
    assert ev.kind == "health" and ev.data["status"] == "ok" and ev.data["instance"] == "replica-0"
    assert 'jetrl_reward_completions_total{task="exact"} 2.0' in text
    assert 'jetrl_reward_requests_total{outcome="ok",task="exact"} 1.0' in text


async def test_replicas_are_discoverable_as_a_nats_micro_service(nats_config, nc):
    cfg = run_config(nats_config)
    async with replicas(cfg, 2, "exact"):
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish("$SRV.PING.jetrl-reward", b"", reply=inbox)
        pings = [await sub.next_msg(timeout=5) for _ in range(2)]
    assert len(pings) == 2


@pytest.mark.parametrize("bad", [{"concurrency": 0}, {"executor": "gpu"}, {"retries": -1}])
def test_bad_reward_config_names_the_field(bad):
    with pytest.raises(ValueError) as info:
        RewardConfig(**bad)
    assert next(iter(bad)) in str(info.value)


async def test_client_reports_a_request_over_max_payload_without_sending_it(nats_config, nc):
    cfg = run_config(nats_config)
    r = await RewardClient(nc, cfg.reward).score("exact", ["x" * (nc.max_payload + 10)], "x")
    assert r.rewards == [0.0] and "max_payload" in r.error
