"""Announcements in the `jetrl_weights` KV bucket on a real nats-server: CAS, latest, watch."""

from __future__ import annotations

import asyncio
import time

import pytest

from shared.contract import codec
from shared.contract.messages import WeightVersion
from shared.contract.subjects import WEIGHTS_KV_BUCKET
from weight_store.announce import VersionConflict, announce, latest, watch


def wv(version: int, run: str = "demo") -> WeightVersion:
    return WeightVersion(run=run, version=version, step=version, manifest_url=f"http://x/{version}",
                         files=[{"name": "model.safetensors", "size": 1, "sha256": "0" * 64}])


async def test_cas_announcement_refuses_a_second_publisher_of_the_same_version(js):
    assert await latest(js, "demo") is None
    await announce(js, wv(0))
    results = await asyncio.gather(announce(js, wv(1)), announce(js, wv(1)), return_exceptions=True)
    assert sum(isinstance(r, int) for r in results) == 1  # exactly one trainer wins version 1
    (lost,) = [r for r in results if isinstance(r, Exception)]
    assert isinstance(lost, VersionConflict) and lost.announced == 1
    with pytest.raises(VersionConflict):
        await announce(js, wv(0))  # an older version never replaces a newer one
    got = await latest(js, "demo")
    assert got.version == 1 and got.manifest_url == "http://x/1"
    # a writer that changed the key in between (stale revision) makes the CAS re-read, not overwrite
    kv = await js.key_value(WEIGHTS_KV_BUCKET)
    entry = await kv.get("demo")
    await kv.update("demo", codec.encode(wv(5)), last=entry.revision)
    with pytest.raises(VersionConflict):
        await announce(js, wv(2))
    assert (await latest(js, "demo")).version == 5
    assert await latest(js, "other") is None


async def _next(it, timeout: float = 30.0) -> WeightVersion:
    return await asyncio.wait_for(it.__anext__(), timeout)


async def _announce_retrying(js, v: WeightVersion, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await announce(js, v)
            return
        except VersionConflict:
            raise
        except Exception:  # the connection is still coming back after the server restart
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_watcher_sees_every_version_in_order_across_a_nats_server_restart(js, nats_server):
    await announce(js, wv(0))
    await announce(js, wv(1))
    it = watch(js, "demo", idle_s=0.5).__aiter__()
    try:
        assert (await _next(it)).version == 1  # starts from the latest
        await announce(js, wv(2))
        await announce(js, wv(3))
        assert [(await _next(it)).version for _ in range(2)] == [2, 3]
        nats_server.kill()
        nats_server.start()
        for v in (4, 5, 6):
            await _announce_retrying(js, wv(v))
        assert [(await _next(it)).version for _ in range(3)] == [4, 5, 6]
        await announce(js, wv(7))
        assert (await _next(it)).version == 7
    finally:
        await it.aclose()


async def test_watcher_started_before_the_first_version_yields_it(js):
    it = watch(js, "fresh", idle_s=0.5).__aiter__()
    try:
        nxt = asyncio.ensure_future(_next(it))
        await asyncio.sleep(0.3)
        assert not nxt.done()
        await announce(js, wv(0, run="fresh"))
        assert (await nxt).version == 0
        await announce(js, wv(1, run="fresh"))
        assert (await _next(it)).version == 1
    finally:
        await it.aclose()
