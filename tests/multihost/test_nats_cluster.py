"""Three `jetrl nats --cluster` nodes on three hosts: the jetrl streams and the weights KV bucket are
created with three replicas, and killing every process on the host of the PROMPTS stream leader loses no
acknowledged message; the node comes back on its store dir and catches up. Clients are the cluster's
per-service users: the controller creates the R3 streams, a rollout worker may not delete them."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.errors import ServiceUnavailableError

from multihost.cluster import NatsCluster
from shared.config import StreamsConfig
from shared.contract import bus, subjects

pytestmark = pytest.mark.timeout(180)


async def test_r3_streams_and_kv_survive_the_loss_of_the_stream_leaders_host(hostnet, tmp_path):
    net = hostnet(["n1", "n2", "n3"])
    cluster = NatsCluster(net, {"n1": "n1", "n2": "n2", "n3": "n3"}, tmp_path / "nats").start_all()
    ctl = await bus.connect(cluster.client_config("controller"), name="cluster-controller")
    try:  # the controller's user creates the streams (every other service only binds to them)
        created = await bus.ensure_streams(ctl.jetstream(), StreamsConfig(replicas=3, duplicate_window_s=120))
        assert set(created.values()) == {"created"}
    finally:
        await ctl.close()
    errors = []

    async def on_error(exc):
        errors.append(str(exc))

    worker = await nats.connect(cluster.urls, user="jetrl-rollout", connect_timeout=2, allow_reconnect=False,
                                password=(cluster.users_dir / "rollout.password").read_text().strip(),
                                error_cb=on_error)
    try:
        with pytest.raises(Exception):  # noqa: B017 - the server drops the request: a timeout
            await worker.jetstream(timeout=1).delete_stream(subjects.PROMPTS_STREAM)
    finally:
        await worker.close()
    assert any("permissions violation" in e.lower() for e in errors), errors
    nc = await bus.connect(cluster.client_config("admin", reconnect_wait_s=0.1, max_reconnect_wait_s=0.5),
                           name="cluster-test")
    try:
        js = nc.jetstream()
        for name in created:
            info = await js.stream_info(name)
            assert info.config.num_replicas == 3
            assert info.cluster.leader and len(info.cluster.replicas) == 2, name
        kv = await js.stream_info(f"KV_{subjects.WEIGHTS_KV_BUCKET}")
        assert kv.config.num_replicas == 3
        # services list all three seeds: ensure_streams again is a no-op
        assert set((await bus.ensure_streams(js, StreamsConfig(replicas=3, duplicate_window_s=120))).values()) == {
            "unchanged"}

        subject = subjects.prompts("clu")
        for i in range(50):
            await js.publish(subject, f"m{i}".encode(), headers={"Nats-Msg-Id": f"m{i}"}, timeout=10)
        leader = (await js.stream_info(subjects.PROMPTS_STREAM)).cluster.leader
        net.kill_all(cluster.nodes[leader])  # the leader's host dies with everything on it

        async def publish_more() -> None:
            for i in range(50, 100):
                for _ in range(100):  # a new leader is elected within seconds; until then publishes fail
                    try:
                        await js.publish(subject, f"m{i}".encode(), headers={"Nats-Msg-Id": f"m{i}"}, timeout=2)
                        break
                    except Exception:
                        await asyncio.sleep(0.2)
                else:
                    raise AssertionError(f"publish m{i} never succeeded after the leader died")

        await asyncio.wait_for(publish_more(), 90)
        info = await js.stream_info(subjects.PROMPTS_STREAM)
        assert info.cluster.leader != leader and info.state.messages == 100
        # the old leader comes back on its store dir and catches up
        cluster.start(leader)
        cluster.wait_ready(60, names=[leader])
        sub = await js.pull_subscribe(subject, "clu-reader", stream=subjects.PROMPTS_STREAM)
        got = []
        deadline = asyncio.get_running_loop().time() + 60
        while len(got) < 100:
            try:
                msgs = await sub.fetch(100, timeout=10)
            except ServiceUnavailableError:  # the new consumer's leader is still being elected (as the
                assert asyncio.get_running_loop().time() < deadline  # services' consumer loop, wait)
                await asyncio.sleep(0.2)
                continue
            for m in msgs:
                got.append(m.data.decode())
                await m.ack()
        assert sorted(got, key=lambda s: int(s[1:])) == [f"m{i}" for i in range(100)]
        for _ in range(100):
            peers = (await js.stream_info(subjects.PROMPTS_STREAM)).cluster.replicas
            if len(peers) == 2 and all(p.current for p in peers):
                break
            await asyncio.sleep(0.2)
        assert all(p.current for p in peers) and leader in {p.name for p in peers} | {
            (await js.stream_info(subjects.PROMPTS_STREAM)).cluster.leader}
    finally:
        await nc.close()
