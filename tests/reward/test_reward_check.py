"""`jetrl reward check`: passes a conforming service and fails one that breaks the protocol."""

from __future__ import annotations

import msgpack
import pytest
from reward_fixtures import replicas, run_config

from reward_service.check import run_check
from shared import subjects


@pytest.mark.parametrize("task", ["exact", "gsm8k", "maxdigit", "sort", "regex",
                                  pytest.param("math", marks=pytest.mark.slow),
                                  pytest.param("code", marks=pytest.mark.slow)])
async def test_the_python_service_passes_the_suite_for_every_builtin_task(nats_config, nc, task):
    cfg = run_config(nats_config, processes=2)
    async with replicas(cfg, 1, task):
        report = await run_check(nc, task, requests=10)
    failed = [(c.name, c.detail) for c in report.cases if not c.ok]
    assert failed == [], (task, failed)
    assert len(report.latencies_ms) == 10
    assert report.percentile(50) <= report.percentile(99)


async def test_a_service_that_breaks_the_protocol_fails_the_suite(nc):
    async def sloppy(msg):  # answers every request with "1.0" for one completion, and never an error
        await msg.respond(msgpack.packb({"schema": "RewardResult", "v": 1, "task": "exact", "rewards": [1.0]}))

    await nc.subscribe(subjects.reward("exact"), queue=subjects.REWARD_QUEUE_GROUP, cb=sloppy)
    report = await run_check(nc, "exact", requests=3)
    failed = {c.name for c in report.cases if not c.ok}
    assert not report.ok
    assert {"valid", "missing completions", "not msgpack", "wrong task for this subject"} <= failed


async def test_nothing_answering_fails_every_case_quickly(nc):
    report = await run_check(nc, "nobody-home", requests=1, timeout=2)
    assert not report.ok
    assert all("no service answers" in c.detail for c in report.cases if c.name != "latency run")
