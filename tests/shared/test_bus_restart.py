"""The nats-server is SIGKILLed and restarted on the same store dir: no acknowledged message is lost,
and a running ConsumerLoop carries on by itself (same loop object, same connection)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shared.contract import bus, consumer, subjects
from shared.contract.messages import Sample, TrajectoryGroup

RUN = "crash"
SUBJECT = subjects.trajectories(RUN)


def group(i: int) -> TrajectoryGroup:
    s = Sample(tokens=np.full(64, i, np.int32), loss_mask=np.ones(64, np.uint8),
               logprobs=np.zeros(64, np.float32), versions=np.zeros(64, np.int32))
    return TrajectoryGroup(run=RUN, prompt_id=f"p{i}", epoch=0, samples=[s])


async def publish_until_acked(js, nc, i: int) -> None:
    """A producer that retries until JetStream acknowledged the message (dedup makes retries safe)."""
    while True:
        try:
            await bus.publish(js, nc, SUBJECT, group(i), msg_id=f"{RUN}:0:p{i}", timeout=2.0)
            return
        except Exception:
            await asyncio.sleep(0.2)


async def wait_until(cond, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_sigkilled_server_restarted_on_same_store_loses_no_acked_message_and_loop_resumes(
        nats_server, js, nc):
    for i in range(30):
        await publish_until_acked(js, nc, i)
    handled: set[str] = set()
    gate = asyncio.Event()

    async def handler(g, msg):
        if len(handled) >= 10:
            await gate.wait()  # hold the rest in flight while the server dies
        handled.add(g.prompt_id)

    loop = consumer.ConsumerLoop(js, nc, run=RUN, stream=subjects.TRAJECTORIES_STREAM, subject=SUBJECT,
                            durable=subjects.trainer_consumer(RUN), handler=handler, batch=4, max_in_flight=4,
                            ack_wait_s=2.0, fetch_timeout_s=0.3)
    task = asyncio.create_task(loop.run())
    try:
        await wait_until(lambda: len(handled) >= 10, 30, "first 10 handled")
        nats_server.kill()  # SIGKILL: no flush, no goodbye
        await wait_until(lambda: not nc.is_connected, 10, "client to notice the crash")
        gate.set()  # handlers finish while the server is down: their acks are lost
        await asyncio.sleep(0.5)
        nats_server.restart()
        for i in range(30, 40):  # more work published after the restart
            await publish_until_acked(js, nc, i)
        await wait_until(lambda: len(handled) == 40, 60, "all 40 acknowledged messages handled")
        assert not task.done()  # the very same loop carried on
        info = await js.stream_info(subjects.TRAJECTORIES_STREAM)
        assert info.state.messages == 40  # nothing acknowledged before the crash was lost from the store
        # ...and the consumer eventually has nothing left un-acked (lost acks were redelivered)
        async def settled() -> bool:
            ci = await js.consumer_info(subjects.TRAJECTORIES_STREAM, loop.durable)
            return ci.num_pending == 0 and ci.num_ack_pending == 0
        deadline = asyncio.get_running_loop().time() + 30
        while not await settled():
            assert asyncio.get_running_loop().time() < deadline, "consumer did not settle"
            await asyncio.sleep(0.2)
    finally:
        loop.stop()
        await asyncio.wait_for(task, 30)
    assert handled == {f"p{i}" for i in range(40)}


async def test_an_acked_event_outlives_a_server_outage_longer_than_one_attempt_and_is_stored_once(
        nats_server, js, nc):
    """emit_acked (the trainer's "groups" events, which the controller's ledger depends on) retries until
    JetStream stores the event; a best-effort emit would give up after its 5 s timeout."""
    events = bus.EventPublisher(js, nc, RUN, "trainer", "t0")
    nats_server.kill()
    await wait_until(lambda: not nc.is_connected, 10, "client to notice the crash")
    sent = asyncio.create_task(events.emit_acked("groups", {"trained": [f"{RUN}:0:p1"]}))
    await asyncio.sleep(6.0)  # longer than one attempt's timeout
    assert not sent.done()
    nats_server.restart()
    await asyncio.wait_for(sent, 60)
    subject = subjects.events(RUN, "trainer")
    info = await js.stream_info(subjects.EVENTS_STREAM, subjects_filter=subject)
    assert (info.state.subjects or {}).get(subject) == 1  # retries of one event are one event


async def test_an_acked_event_gives_up_once_the_service_stops(nats_server, js, nc):
    events = bus.EventPublisher(js, nc, RUN, "trainer", "t0")
    nats_server.kill()
    stop = asyncio.Event()
    sent = asyncio.create_task(events.emit_acked("groups", {"trained": []}, stop=stop))
    await asyncio.sleep(0.5)
    stop.set()
    with pytest.raises(bus.EventNotDelivered):
        await asyncio.wait_for(sent, 30)
