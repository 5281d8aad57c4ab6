"""Several rollout workers in one process (rollout_service/pool.py): the shared announcement watch, the
merged metrics, and a pool on a real nats-server with the real reward service -- K workers, K ids, one
connection, each prompt one group; a worker whose engine died stops the pool and leaves its prompts."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rollout_doubles import ScriptedEngine, publish_prompts, read_groups, wait_for, worker_config

from rollout_service.engines.base import EngineDead
from rollout_service.pool import Broadcast, PoolCollector, WorkerPool, worker_ids
from shared.contract import subjects
from shared.model.tinymodel import build_tokenizer

RUN = "r1"


class Source:
    """An async iterator factory fed by hand; counts how often it was started."""

    def __init__(self):
        self.q: asyncio.Queue = asyncio.Queue()
        self.starts = 0

    async def __call__(self):
        self.starts += 1
        while True:
            item = await self.q.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                return
            yield item


async def take(it, n: int) -> list:
    out = []
    async for x in it:
        out.append(x)
        if len(out) == n:
            break
    return out


async def test_broadcast_reads_the_source_once_and_hands_every_item_to_each_reader_in_order():
    src = Source()
    b = Broadcast(src)
    readers = [asyncio.create_task(take(b(), 3)) for _ in range(5)]
    await asyncio.sleep(0.05)
    for v in (1, 2, 3):
        src.q.put_nowait(v)
    assert [await r for r in readers] == [[1, 2, 3]] * 5
    assert src.starts == 1
    await b.close()


async def test_a_late_reader_first_gets_the_newest_item_then_the_rest():
    src = Source()
    b = Broadcast(src)
    first = asyncio.create_task(take(b(), 3))
    await asyncio.sleep(0.05)
    src.q.put_nowait(1)
    src.q.put_nowait(2)
    await asyncio.sleep(0.05)
    late = asyncio.create_task(take(b(), 2))
    await asyncio.sleep(0.05)
    src.q.put_nowait(3)
    assert await first == [1, 2, 3]
    assert await late == [2, 3]
    await b.close()


async def test_a_failed_source_fails_every_reader_and_the_next_subscription_starts_it_again():
    src = Source()
    b = Broadcast(src)

    async def read_all(it):
        return [x async for x in it]

    readers = [asyncio.create_task(read_all(b())) for _ in range(3)]
    await asyncio.sleep(0.05)
    src.q.put_nowait(1)
    src.q.put_nowait(ConnectionError("watch lost"))
    for r in readers:
        with pytest.raises(ConnectionError, match="watch lost"):
            await r
    again = asyncio.create_task(take(b(), 1))
    await asyncio.sleep(0.05)
    assert src.starts == 2
    src.q.put_nowait(7)
    assert await again == [7]  # not the failed run's newest item: a fresh watch starts with its own
    last = asyncio.create_task(read_all(b()))
    await asyncio.sleep(0.05)
    src.q.put_nowait(None)  # a source that ends ends every reader
    assert await asyncio.wait_for(last, 5) == [7]  # the newest item, then the end
    await b.close()


def test_worker_ids():
    assert worker_ids("run-rollout-0", 1) == ["run-rollout-0"]
    assert worker_ids("run-rollout-0", 3) == ["run-rollout-0-0", "run-rollout-0-1", "run-rollout-0-2"]
    assert len(set(worker_ids(None, 4))) == 4


class _Fake:
    def __init__(self, instance, published):
        from rollout_service.metrics import RolloutMetrics

        self.instance, self.metrics = instance, RolloutMetrics()
        self.metrics.published.inc(published)
        self.metrics.weight_bytes.labels("delta").inc(10 * published)


def test_the_pool_serves_every_worker_s_series_labelled_by_worker():
    reg = CollectorRegistry()
    reg.register(PoolCollector([_Fake("a", 2), _Fake("b", 5)]))
    text = generate_latest(reg).decode()
    assert 'jetrl_rollout_groups_published_total{worker="a"} 2.0' in text
    assert 'jetrl_rollout_groups_published_total{worker="b"} 5.0' in text
    assert 'jetrl_rollout_weight_bytes_total{how="delta",worker="b"} 50.0' in text
    assert text.count("# TYPE jetrl_rollout_groups_published_total counter") == 1  # one family, two series


def answer_max(prompt: str, n: int) -> str:
    digits = [c for c in prompt.split("=")[0] if c.isdigit()]
    return " " + max(digits) + " done"


def make_pool(nats_config, count: int, engine_cls=ScriptedEngine, delay: float = 0.02) -> WorkerPool:
    tok = build_tokenizer()
    cfg = worker_config(nats_config.servers[0], RUN, max_in_flight=2, service={"fetch_batch": 1})
    cfg.rollout.service.follow_weights = False
    return WorkerPool(cfg, count, instance="host-rollout-0", tokenizer=tok,
                      engine_factory=lambda: engine_cls(tok, answer_max, token_delay_s=delay))


async def test_k_workers_in_one_process_share_one_connection_and_each_prompt_is_one_group(
        nats_config, nc, js, reward_service):
    pool = make_pool(nats_config, 6)
    await pool.start()
    assert {w.nc for w in pool.workers} == {pool.nc}
    run = asyncio.create_task(pool.run())
    ids = await publish_prompts(js, nc, RUN, 48)

    async def all_groups():
        gs = await read_groups(js, RUN)
        return gs if len(gs) >= 48 else None

    groups = await wait_for(all_groups, 60, what="48 groups")
    pool.stop()
    await asyncio.wait_for(run, 30)
    assert pool.nc.is_closed
    assert sorted(g.group_id for g in groups) == sorted(ids)  # each prompt once
    by_worker = Counter(g.worker for g in groups)
    assert set(by_worker) <= {f"host-rollout-0-{i}" for i in range(6)}
    assert len(by_worker) >= 4, by_worker  # the work spread over the pool's workers
    assert all(s.reward == 1.0 for g in groups for s in g.samples)
    info = await js.consumer_info(subjects.PROMPTS_STREAM, subjects.rollout_consumer(RUN))
    assert info.num_ack_pending == 0 and info.num_pending == 0


class DeadEngine(ScriptedEngine):
    async def generate(self, req):
        raise EngineDead("the server exited")


async def test_a_worker_whose_engine_died_stops_the_pool_which_raises_and_acks_nothing(nats_config, nc, js):
    tok = build_tokenizer()
    engines = iter([ScriptedEngine(tok, answer_max, token_delay_s=5.0), DeadEngine(tok, answer_max)])
    cfg = worker_config(nats_config.servers[0], RUN, max_in_flight=1, service={"fetch_batch": 1, "stop_timeout_s": 1.0})
    cfg.rollout.service.follow_weights = False
    pool = WorkerPool(cfg, 2, instance="p", tokenizer=tok, engine_factory=lambda: next(engines))
    await publish_prompts(js, nc, RUN, 3)
    with pytest.raises(EngineDead):
        await asyncio.wait_for(pool.run(), 60)
    # the slow worker's task was cancelled at the stop deadline, the dead one's failed: nothing acked
    info = await js.stream_info(subjects.PROMPTS_STREAM)
    assert info.state.messages == 3 and not await read_groups(js, RUN)


async def test_fetch_once_fetches_a_version_once_for_all_callers_and_retries_after_a_failure():
    from rollout_service.pool import fetch_once

    calls = []
    gate = asyncio.Event()

    async def fetch(run, version):
        calls.append(version)
        await gate.wait()
        if version == 2 and calls.count(2) == 1:
            raise ConnectionError("store down")
        return f"/cache/{run}/{version}"

    once = fetch_once(fetch, keep=2)
    waiting = [asyncio.create_task(once("r", 1)) for _ in range(64)]
    await asyncio.sleep(0.01)
    gate.set()
    assert set(await asyncio.gather(*waiting)) == {"/cache/r/1"} and calls == [1]
    failed = await asyncio.gather(*(once("r", 2) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(f, ConnectionError) for f in failed) and calls == [1, 2]  # one try, one error for all
    assert await once("r", 2) == "/cache/r/2" and calls == [1, 2, 2]  # the next call tries again
    await once("r", 3)
    await once("r", 4)
    await once("r", 1)  # forgotten (keep 2): fetched again
    assert calls == [1, 2, 2, 3, 4, 1]
