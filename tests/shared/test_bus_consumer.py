"""The durable consumer loop: redelivery, in-progress acks, nak back-off and the dead-letter queue."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest
from nats.js import api

from shared.contract import bus, codec, consumer, subjects
from shared.contract.messages import DeadLetter, Sample, TrajectoryGroup

RUN = "t1"
SUBJECT = subjects.trajectories(RUN)


def group(prompt_id: str) -> TrajectoryGroup:
    s = Sample(tokens=np.arange(4, dtype=np.int32), loss_mask=np.array([0, 1, 1, 1], np.uint8),
               logprobs=np.zeros(4, np.float32), versions=np.array([-1, 0, 0, 0], np.int32))
    return TrajectoryGroup(run=RUN, prompt_id=prompt_id, epoch=0, samples=[s])


def loop_for(js, nc, handler, **kw) -> consumer.ConsumerLoop:
    kw.setdefault("durable", subjects.trainer_consumer(RUN))
    return consumer.ConsumerLoop(js, nc, run=RUN, stream=subjects.TRAJECTORIES_STREAM, subject=SUBJECT,
                            handler=handler, expect=TrajectoryGroup, fetch_timeout_s=0.2, **kw)


async def wait_until(cond, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(loop: consumer.ConsumerLoop):
    task = asyncio.create_task(loop.run())
    try:
        yield task
    finally:
        loop.stop()
        try:
            await asyncio.wait_for(task, 30)
        except asyncio.TimeoutError:
            task.cancel()


async def dead_letters(js, source: str, n: int) -> list[tuple[DeadLetter, bytes]]:
    sub = await js.pull_subscribe(subjects.dlq(RUN, source), stream=subjects.DLQ_STREAM)
    msgs = await sub.fetch(n, timeout=10)
    await sub.unsubscribe()
    return [(codec.decode(m.data, expect=DeadLetter), m.headers or {}) for m in msgs]


async def test_acked_messages_are_handled_once_in_order_of_arrival(js, nc):
    seen: list[str] = []

    async def handler(g, msg):
        seen.append(g.prompt_id)

    for i in range(25):
        await bus.publish(js, nc, SUBJECT, group(f"p{i}"), msg_id=f"{RUN}:0:p{i}")
    loop = loop_for(js, nc, handler, batch=8, max_in_flight=4)
    async with running(loop):
        await wait_until(lambda: loop.stats.handled == 25, what="25 handled")
    assert sorted(seen) == sorted(f"p{i}" for i in range(25)) and len(seen) == 25
    info = await js.consumer_info(subjects.TRAJECTORIES_STREAM, loop.durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0 and info.num_redelivered == 0


async def test_unacked_message_is_redelivered_after_ack_wait(js, nc):
    first_delivery = asyncio.Event()
    deliveries: list[int] = []

    async def crashing_worker(g, msg):  # takes the message, then its process "dies" (task cancelled)
        deliveries.append(msg.metadata.num_delivered)
        first_delivery.set()
        await asyncio.Event().wait()

    await bus.publish(js, nc, SUBJECT, group("p1"), msg_id="p1")
    worker1 = loop_for(js, nc, crashing_worker, ack_wait_s=1.0)
    task = asyncio.create_task(worker1.run())
    await asyncio.wait_for(first_delivery.wait(), 30)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert worker1.in_flight == 0  # cancelling the loop cancelled its handler: no ack, no in-progress

    redelivered: list[int] = []

    async def healthy_worker(g, msg):
        redelivered.append(msg.metadata.num_delivered)

    worker2 = loop_for(js, nc, healthy_worker, ack_wait_s=1.0)
    async with running(worker2):
        await wait_until(lambda: worker2.stats.handled == 1, what="redelivery")
    assert deliveries == [1] and redelivered == [2]


async def test_long_handler_sending_in_progress_acks_is_not_redelivered(js, nc):
    calls: list[int] = []

    async def slow_handler(g, msg):
        calls.append(msg.metadata.num_delivered)
        await asyncio.sleep(5.0)  # 2.5x ack_wait

    await bus.publish(js, nc, SUBJECT, group("slow"), msg_id="slow")
    loop = loop_for(js, nc, slow_handler, ack_wait_s=2.0, max_in_flight=4)
    async with running(loop):
        await wait_until(lambda: loop.stats.handled == 1, what="slow handler done")
    assert calls == [1]
    assert loop.stats.in_progress_acks >= 1
    info = await js.consumer_info(subjects.TRAJECTORIES_STREAM, loop.durable)
    assert info.num_redelivered == 0 and info.num_ack_pending == 0


async def test_undecodable_message_goes_to_the_dlq_with_its_bytes_and_the_loop_carries_on(js, nc):
    garbage = b"\x92\x01\x02"  # valid msgpack, but an array, not a message map
    truncated = codec.encode(group("cut"))[:-7]
    wrong_schema = codec.encode(DeadLetter(run=RUN, source="x", subject="s", reason="r", original=b""))
    acks = []
    for raw in (garbage, truncated, wrong_schema):
        acks.append(await js.publish(SUBJECT, raw))
    await bus.publish(js, nc, SUBJECT, group("good"), msg_id="good")
    handled: list[str] = []

    async def handler(g, msg):
        handled.append(g.prompt_id)

    loop = loop_for(js, nc, handler)
    async with running(loop):
        await wait_until(lambda: loop.stats.dead_lettered == 3 and handled == ["good"], what="3 dead letters")
    letters = sorted(await dead_letters(js, loop.source, 3), key=lambda x: x[0].stream_seq)
    assert [dl.original for dl, _ in letters] == [garbage, truncated, wrong_schema]
    assert [dl.stream_seq for dl, _ in letters] == [a.seq for a in acks]
    for (dl, headers), why in zip(letters, ("expected a msgpack map", "not valid msgpack", "got DeadLetter"),
                                  strict=True):
        assert dl.reason.startswith("decode error") and why in dl.reason
        assert (dl.subject, dl.stream, dl.delivery_count, dl.run) == (SUBJECT, subjects.TRAJECTORIES_STREAM, 1, RUN)
        assert headers.get(subjects.MSG_ID_HEADER) == f"dlq:{subjects.TRAJECTORIES_STREAM}:{dl.stream_seq}"
    info = await js.consumer_info(subjects.TRAJECTORIES_STREAM, loop.durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0  # terminated, not left for redelivery


async def test_message_failing_max_deliver_times_goes_to_the_dlq_with_reason_and_bytes(js, nc):
    attempts: list[int] = []

    async def failing(g, msg):
        attempts.append(msg.metadata.num_delivered)
        raise consumer.Transient("reward service down")

    await bus.publish(js, nc, SUBJECT, group("poison"), msg_id="poison")
    original = codec.encode(group("poison"))
    loop = loop_for(js, nc, failing, max_deliver=3, nak_backoff_s=(0.05, 0.1))
    async with running(loop):
        await wait_until(lambda: loop.stats.dead_lettered == 1, what="dead letter")
    assert attempts == [1, 2, 3] and loop.stats.failed == 3 and loop.stats.handled == 0
    [(dl, _)] = await dead_letters(js, loop.source, 1)
    assert "handler failed on delivery 3/3" in dl.reason and "reward service down" in dl.reason
    assert dl.delivery_count == 3 and dl.subject == SUBJECT
    back = codec.decode(dl.original, expect=TrajectoryGroup)
    assert back.prompt_id == "poison" and len(dl.original) == len(original)
    info = await js.consumer_info(subjects.TRAJECTORIES_STREAM, loop.durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_message_whose_handler_keeps_crashing_is_dead_lettered_after_max_deliver(js, nc):
    """A handler that never finishes (a worker killed mid-message) also counts towards max_deliver."""
    started = asyncio.Event()

    async def hangs(g, msg):
        started.set()
        await asyncio.Event().wait()

    await bus.publish(js, nc, SUBJECT, group("crash"), msg_id="crash")
    first = loop_for(js, nc, hangs, ack_wait_s=1.0, max_deliver=1)
    task = asyncio.create_task(first.run())
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    async def never_called(g, msg):
        raise AssertionError("must not be handled again")

    second = loop_for(js, nc, never_called, ack_wait_s=1.0, max_deliver=1)
    async with running(second):
        await wait_until(lambda: second.stats.dead_lettered == 1, what="dead letter")
    [(dl, _)] = await dead_letters(js, second.source, 1)
    assert dl.delivery_count == 2 and "max_deliver=1" in dl.reason


async def test_can_fetch_holds_back_fetching(js, nc):
    open_gate = False
    handled: list[str] = []

    async def handler(g, msg):
        handled.append(g.prompt_id)

    await bus.publish(js, nc, SUBJECT, group("gated"), msg_id="gated")
    loop = loop_for(js, nc, handler, can_fetch=lambda: open_gate)
    async with running(loop):
        await asyncio.sleep(0.5)
        assert handled == []
        info = await js.consumer_info(subjects.TRAJECTORIES_STREAM, loop.durable)
        assert info.num_pending == 1 and info.num_ack_pending == 0
        open_gate = True
        await wait_until(lambda: handled == ["gated"], what="gated message")


def test_consumer_config_is_explicit_ack_with_the_loops_ack_wait():
    loop = consumer.ConsumerLoop(None, None, run=RUN, stream="S", subject="x", durable="d", handler=None,
                            ack_wait_s=7.0, max_in_flight=300)
    cfg = loop.consumer_config()
    assert cfg.ack_policy == api.AckPolicy.EXPLICIT and cfg.ack_wait == 7.0 and cfg.durable_name == "d"
    assert cfg.max_ack_pending >= 300


def test_a_dead_letter_source_over_the_token_limit_is_refused_when_the_loop_is_made(js, nc):
    run = "r" * 64  # the longest run id: `controller-events-<run>` would be 82 characters
    with pytest.raises(ValueError, match="dead-letter source 'controller-events-r+' is invalid"):
        consumer.ConsumerLoop(js, nc, run=run, stream=subjects.EVENTS_STREAM, subject=subjects.events_all(run),
                     durable=subjects.controller_events_consumer(run), handler=None)
    loop = consumer.ConsumerLoop(js, nc, run=run, stream=subjects.EVENTS_STREAM, subject=subjects.events_all(run),
                        durable=subjects.controller_events_consumer(run), handler=None, source="controller-events")
    assert subjects.dlq(run, loop.source) == f"jetrl.{run}.dlq.controller-events"
