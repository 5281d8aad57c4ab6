"""Streams, KV bucket, dedup and size limits against a real nats-server."""

from __future__ import annotations

import nats.errors
import numpy as np
import pytest
from nats.js import api

from shared.config import NatsConfig, StreamsConfig
from shared.contract import bus, subjects
from shared.contract.codec import MessageTooLarge
from shared.contract.messages import Event, PromptTask, Sample, TrajectoryGroup
from shared.runtime.natsd import EmbeddedNats


async def test_ensure_streams_is_idempotent_and_creates_the_kv_bucket(js):
    # the `js` fixture already ran ensure_streams once with duplicate_window_s=120
    again = await bus.ensure_streams(js, StreamsConfig(duplicate_window_s=120))
    assert again == {name: "unchanged" for name in subjects.ALL_STREAMS}
    for want in bus.stream_configs(StreamsConfig(duplicate_window_s=120)):
        info = await js.stream_info(want.name)
        assert info.config.subjects == want.subjects
        assert info.config.retention == want.retention
        assert info.config.duplicate_window == pytest.approx(120)
    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    await kv.put("r", b"x")
    assert (await kv.get("r")).value == b"x"


async def test_ensure_streams_creates_on_a_fresh_server_then_updates_when_config_changes(nc):
    js = nc.jetstream()
    first = await bus.ensure_streams(js, StreamsConfig())
    assert first == {name: "created" for name in subjects.ALL_STREAMS}
    changed = StreamsConfig(duplicate_window_s=30, max_msg_size=2 * 1024 * 1024, events_max_msgs=5000)
    assert await bus.ensure_streams(js, changed) == {name: "updated" for name in subjects.ALL_STREAMS}
    assert await bus.ensure_streams(js, changed) == {name: "unchanged" for name in subjects.ALL_STREAMS}
    events = (await js.stream_info(subjects.EVENTS_STREAM)).config
    assert events.max_msgs == 5000 and events.max_msg_size == 2 * 1024 * 1024
    assert events.duplicate_window == pytest.approx(30)
    prompts = (await js.stream_info(subjects.PROMPTS_STREAM)).config
    assert prompts.retention == api.RetentionPolicy.WORK_QUEUE


async def test_republished_message_with_the_same_msg_id_is_dropped(js, nc):
    task = PromptTask(run="r1", prompt_id="p7", epoch=2, payload={"prompt": "max 1 2 3 4 5 ="})
    first = await bus.publish(js, nc, subjects.prompts("r1"), task, msg_id=task.group_id)
    second = await bus.publish(js, nc, subjects.prompts("r1"), task, msg_id=task.group_id)
    assert not first.duplicate
    assert second.duplicate and second.seq == first.seq
    info = await js.stream_info(subjects.PROMPTS_STREAM)
    assert info.state.messages == 1
    other = await bus.publish(js, nc, subjects.prompts("r1"), task, msg_id=subjects.group_id("r1", 3, "p7"))
    assert not other.duplicate and other.seq == first.seq + 1


async def test_publish_async_acks_every_message_and_dedups(js, nc):
    futs = [await bus.publish_async(js, nc, subjects.events("r1", "trainer"), Event(run="r1", service="t", kind="k"),
                                    msg_id=f"e{i % 10}") for i in range(30)]
    acks = [await f for f in futs]
    assert sum(not a.duplicate for a in acks) == 10
    assert (await js.stream_info(subjects.EVENTS_STREAM)).state.messages == 10


async def test_publishing_over_the_servers_max_payload_fails_naming_both_sizes(tmp_path):
    with EmbeddedNats(tmp_path / "small", max_payload=64 * 1024) as srv:
        conn = await bus.connect(NatsConfig(servers=[srv.url]))
        try:
            assert conn.max_payload == 64 * 1024
            n = 8000  # 8000 tokens * 13 bytes > 64 KiB
            s = Sample(tokens=np.zeros(n, np.int32), loss_mask=np.zeros(n, np.uint8),
                       logprobs=np.zeros(n, np.float32), versions=np.zeros(n, np.int32))
            group = TrajectoryGroup(run="r1", prompt_id="p", epoch=0, samples=[s])
            with pytest.raises(MessageTooLarge) as info:
                await bus.publish(conn.jetstream(), conn, subjects.trajectories("r1"), group)
            err = info.value
            assert err.limit == 64 * 1024 and err.size > err.limit
            assert f"{err.size} bytes" in str(err) and f"{64 * 1024} bytes" in str(err)
            assert "jetrl.r1.trajectories" in str(err) and "max_payload" in str(err)
        finally:
            await conn.close()


async def test_after_bus_flush_a_new_subscription_answers_requests_from_another_connection(nats_config, nc):
    # nats-py's own flush() can return before a fresh SUB leaves the client (it did 9 times in 300 here):
    # a reward replica announcing itself ready would then meet "no responders".
    async def answer(msg):
        await msg.respond(b"ok")

    no_responders = 0
    for i in range(150):
        server_side = await bus.connect(nats_config, name=f"replica-{i}")
        for j in range(9):  # a nats micro service subscribes to $SRV.* subjects before its endpoint
            await server_side.subscribe(f"$SRV.PING.x{i}.{j}", cb=answer)
        await server_side.subscribe(f"svc.{i}", queue="q", cb=answer)
        await bus.flush(server_side)
        try:
            assert (await nc.request(f"svc.{i}", b"?", timeout=5)).data == b"ok"
        except nats.errors.NoRespondersError:
            no_responders += 1
        await server_side.close()
    assert no_responders == 0
