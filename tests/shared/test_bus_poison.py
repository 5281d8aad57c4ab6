"""A poison message never locks a consumer out: a message just under max_payload whose dead
letter would not fit is dead-lettered without its payload (reason, headers, size and sha256 kept), the
connection stays up and the next message is handled; a consumer whose connection is closed for good
stops with ConnectionClosed instead of retrying for ever."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from test_bus_consumer import RUN, SUBJECT, dead_letters, group, loop_for, running, wait_until

from shared.config import NatsConfig, StreamsConfig
from shared.contract import bus, codec, consumer, subjects
from shared.runtime.natsd import EmbeddedNats

MAX = 1 << 20  # a 1 MiB server: the same arithmetic as the default 8 MiB, with less to write


@pytest.fixture
async def small_bus(tmp_path):
    srv = EmbeddedNats(tmp_path / "nats", max_payload=MAX).start()
    nc = await bus.connect(NatsConfig(servers=[srv.url], reconnect_wait_s=0.1, max_reconnect_wait_s=0.5))
    js = nc.jetstream()
    await bus.ensure_streams(js, StreamsConfig(max_msg_size=MAX, duplicate_window_s=120))
    yield js, nc
    await nc.close()
    srv.close()


async def test_messages_whose_dead_letter_would_not_fit_never_lock_the_consumer_out(small_bus):
    js, nc = small_bus
    # garbage (a decode error) of sizes sweeping the band where letter + headers cross max_payload
    sizes = list(range(MAX - 900, MAX - 60, 40))
    for i, n in enumerate(sizes):
        await js.publish(SUBJECT, bytes([0xC1]) * n, headers={subjects.MSG_ID_HEADER: f"{RUN}:0:poison{i}"})
    await bus.publish(js, nc, SUBJECT, group("good"), msg_id=f"{RUN}:0:good")
    handled = []

    async def handler(g, msg):
        handled.append(g.prompt_id)

    loop = loop_for(js, nc, handler, source="trainer", max_in_flight=1, batch=1)
    async with running(loop):
        await wait_until(lambda: handled == ["good"], timeout=60, what="the message after the poison ones")
    assert not nc.is_closed and nc.is_connected
    assert loop.stats.dead_lettered == len(sizes)
    letters = await dead_letters(js, "trainer", len(sizes))
    assert len(letters) == len(sizes)
    kept = stripped = 0
    for (dl, headers), n in zip(letters, sizes, strict=True):
        assert dl.original_size == n and dl.original_sha256 == hashlib.sha256(bytes([0xC1]) * n).hexdigest()
        assert dl.reason.startswith("decode error") and dl.headers[subjects.MSG_ID_HEADER].startswith(f"{RUN}:0:poison")
        assert headers[subjects.MSG_ID_HEADER] == f"dlq:{subjects.TRAJECTORIES_STREAM}:{dl.stream_seq}"
        if dl.original:
            assert dl.original == bytes([0xC1]) * n
            kept += 1
        else:
            assert "not kept" in dl.reason and dl.original_sha256 in dl.reason
            stripped += 1
    assert kept and stripped  # the sweep crossed the limit


async def test_publish_counts_headers_against_max_payload(small_bus):
    js, nc = small_bus
    g = group("big")
    g.samples[0].metrics = {"pad": "x" * (MAX - len(codec.encode(g)) - 40)}
    assert len(codec.encode(g)) <= MAX  # the payload alone fits ...
    with pytest.raises(codec.MessageTooLarge):  # ... with the Nats-Msg-Id header it does not: refused here
        await bus.publish(js, nc, SUBJECT, g, msg_id=f"{RUN}:0:" + "p" * 60)
    assert not nc.is_closed
    await bus.publish(js, nc, SUBJECT, group("small"), msg_id=f"{RUN}:0:small")  # the connection still works


async def test_a_consumer_on_a_closed_connection_stops_with_connection_closed(js, nc):
    loop = loop_for(js, nc, lambda g, m: asyncio.sleep(0))
    await nc.close()
    with pytest.raises(consumer.ConnectionClosed):
        await asyncio.wait_for(loop.run(), 10)


async def test_a_rejected_message_is_dead_lettered_at_once(js, nc):
    calls = []

    async def handler(g, msg):
        calls.append(g.prompt_id)
        raise consumer.Reject("group_size 200000 is outside 1..256")

    await bus.publish(js, nc, SUBJECT, group("huge"), msg_id=f"{RUN}:0:huge")
    loop = loop_for(js, nc, handler, source="trainer", max_deliver=5)
    async with running(loop):
        await wait_until(lambda: loop.stats.dead_lettered == 1, what="the dead letter")
    assert calls == ["huge"]  # no retries
    (dl, _), = await dead_letters(js, "trainer", 1)
    assert dl.reason == "rejected: group_size 200000 is outside 1..256"
