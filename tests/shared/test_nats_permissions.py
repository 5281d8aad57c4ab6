"""Per-service NATS users, against a real nats-server configured by shared/runtime/natsd.py with
the users of shared/runtime/nats_permissions.py, scoped to run `r1`:
- the rollout credential cannot publish trajectories of another run, delete a stream or write the weights
  KV; the trainer can announce weights; nobody but admin deletes streams;
- each service's own code path works with its own credential: the controller creates the streams, the
  others only bind to them (streams.manage false), prompts flow controller -> rollout consumer ->
  trajectories -> trainer consumer, events reach the controller's consumer, the tracker's ordered consumer
  reads, KV watch/latest work for readers;
- compose/nats.conf holds exactly the generated authorization block; monitoring is on loopback;
- passwords from `jetrl secrets` (new_token) parse where nats.conf reads them from the environment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from shared.config import NatsConfig, StreamsConfig
from shared.contract import bus, consumer, subjects
from shared.contract.messages import Event, WeightVersion
from shared.runtime.credentials import new_token
from shared.runtime.nats_permissions import ROLES, env_var, permissions, server_authorization, user_name
from shared.runtime.natsd import EmbeddedNats, nats_server_binary
from weight_store.announce import announce, latest, watch

RUN, OTHER = "r1", "r2"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path):
    srv = EmbeddedNats(tmp_path / "nats", users={r: f"pw-{r}-secret" for r in ROLES}, run=RUN)
    srv.start()
    yield srv
    srv.close()


class Client:
    """A connection as one role, recording the server's permission errors."""

    def __init__(self, nc, errors):
        self.nc, self.errors, self.js = nc, errors, nc.jetstream(timeout=1.0)

    def violations(self) -> list[str]:
        return [e for e in self.errors if "permissions violation" in e.lower()]


@contextlib.asynccontextmanager
async def as_role(server, role: str):
    import nats

    errors: list[str] = []

    async def on_error(exc):
        errors.append(str(exc))

    nc = await nats.connect(server.url, user=user_name(role), password=f"pw-{role}-secret", error_cb=on_error,
                            allow_reconnect=False, connect_timeout=5)
    try:
        yield Client(nc, errors)
    finally:
        await nc.close()


async def denied(client: Client, coro) -> bool:
    """The call failed (no reply: the server dropped the request) and the server said why, for this call."""
    before = len(client.violations())
    try:
        await coro
    except Exception:
        await asyncio.sleep(0.2)
        return len(client.violations()) > before
    return False


async def setup_streams(server) -> None:
    async with as_role(server, "controller") as c:
        await bus.ensure_streams(c.js, StreamsConfig(duplicate_window_s=60))


async def test_rollout_credential_cannot_forge_other_runs_delete_streams_or_announce_weights(server):
    await setup_streams(server)
    async with as_role(server, "rollout") as w:
        assert await bus.ensure_streams(w.js, StreamsConfig(manage=False)) == {s: "exists" for s in
                                                                             subjects.ALL_STREAMS}
        ack = await w.js.publish(subjects.trajectories(RUN), b"own run", timeout=2)
        assert ack.stream == subjects.TRAJECTORIES_STREAM
        assert await denied(w, w.js.publish(subjects.trajectories(OTHER), b"forged", timeout=1))
        assert await denied(w, w.js.publish(subjects.prompts(RUN), b"forged prompt", timeout=1))
        assert await denied(w, w.js.delete_stream(subjects.TRAJECTORIES_STREAM))
        assert await denied(w, w.js.purge_stream(subjects.PROMPTS_STREAM))
        assert await denied(w, w.js.delete_consumer(subjects.TRAJECTORIES_STREAM, subjects.trainer_consumer(RUN)))
        assert await denied(w, announce(w.js, WeightVersion(run=RUN, version=1_000_000, sha256="x")))
        kv = await w.js.key_value(subjects.WEIGHTS_KV_BUCKET)
        assert await denied(w, kv.put(RUN, b"forged"))
        assert await denied(w, w.js.add_stream(name="EVIL", subjects=["evil.>"]))
    async with as_role(server, "trainer") as t:
        assert await announce(t.js, WeightVersion(run=RUN, version=1, sha256="a" * 64)) >= 1
        assert await denied(t, announce(t.js, WeightVersion(run=OTHER, version=1, sha256="a" * 64)))
        assert await denied(t, t.js.delete_stream(subjects.PROMPTS_STREAM))
    for role in ("controller", "reward", "tracker", "eval", "agent"):
        async with as_role(server, role) as c:
            assert await denied(c, c.js.delete_stream(subjects.TRAJECTORIES_STREAM)), role
    async with as_role(server, "admin") as a:
        info = await a.js.stream_info(subjects.TRAJECTORIES_STREAM)
        assert info.state.messages == 1  # only the rollout's own-run publish got in
        assert (await latest(a.js, RUN)).version == 1
        assert await latest(a.js, OTHER) is None
        assert await a.js.delete_stream("KV_" + subjects.WEIGHTS_KV_BUCKET)  # admin may


async def test_each_service_path_works_with_its_own_user(server):
    from shared.contract.messages import PromptTask

    await setup_streams(server)
    async with (as_role(server, "controller") as ctl, as_role(server, "rollout") as w,
                as_role(server, "trainer") as t, as_role(server, "tracker") as trk, as_role(server, "eval") as ev,
                as_role(server, "reward") as rw):
        await bus.ensure_streams(w.js, StreamsConfig(manage=False))
        # tracker: ordered consumers on events and trajectories (stream looked up by subject)
        seen: list[str] = []

        async def on_msg(m):
            seen.append(m.subject)

        subs = [await trk.js.subscribe(subjects.events_all(RUN), cb=on_msg, ordered_consumer=True),
                await trk.js.subscribe(subjects.trajectories(RUN), cb=on_msg, ordered_consumer=True)]
        # controller -> prompts; rollout's durable consumer (the real ConsumerLoop) -> trajectories
        task = PromptTask(run=RUN, epoch=0, prompt_id="p0", payload={"prompt": "hi"})
        await bus.publish(ctl.js, ctl.nc, subjects.prompts(RUN), task, msg_id=task.group_id)
        got = asyncio.Event()

        async def rollout_handler(obj, msg):
            await w.js.publish(subjects.trajectories(RUN), b"group", timeout=2)
            await bus.EventPublisher(w.js, w.nc, RUN, "rollout").emit("published", {"n": 1})
            got.set()

        loop = consumer.ConsumerLoop(w.js, w.nc, run=RUN, stream=subjects.PROMPTS_STREAM, subject=subjects.prompts(RUN),
                                durable=subjects.rollout_consumer(RUN), handler=rollout_handler, expect=PromptTask,
                                source="rollout", fetch_timeout_s=0.2)
        runner = asyncio.create_task(loop.run())
        await asyncio.wait_for(got.wait(), 10)
        # trainer: its durable consumer on trajectories, a poison message dead-lettered, its consumer deleted
        tdone = asyncio.Event()

        async def trainer_handler(obj, msg):
            tdone.set()

        tloop = consumer.ConsumerLoop(t.js, t.nc, run=RUN, stream=subjects.TRAJECTORIES_STREAM,
                                 subject=subjects.trajectories(RUN), durable=subjects.trainer_consumer(RUN),
                                 handler=trainer_handler, source="trainer", fetch_timeout_s=0.2)
        trunner = asyncio.create_task(tloop.run())
        for _ in range(100):
            if tloop.stats.dead_lettered or tdone.is_set():
                break
            await asyncio.sleep(0.1)
        assert tloop.stats.dead_lettered == 1  # b"group" is not a message: dead-lettered with the trainer's user
        for lp, r in ((loop, runner), (tloop, trunner)):
            lp.stop()
            await asyncio.wait_for(r, 10)
        assert loop.stats.handled == 1 and not w.violations()
        assert await t.js.delete_consumer(subjects.TRAJECTORIES_STREAM, subjects.trainer_consumer(RUN))
        # controller: its events consumer sees the rollout's event; queue depths; trajectories lookups
        evs: list[Event] = []

        async def on_event(obj, msg):
            evs.append(obj)

        cloop = consumer.ConsumerLoop(ctl.js, ctl.nc, run=RUN, stream=subjects.EVENTS_STREAM,
                                 subject=subjects.events_all(RUN), durable=subjects.controller_events_consumer(RUN),
                                 handler=on_event, expect=Event, source="controller-events", fetch_timeout_s=0.2)
        crunner = asyncio.create_task(cloop.run())
        for _ in range(100):
            if evs:
                break
            await asyncio.sleep(0.1)
        cloop.stop()
        await asyncio.wait_for(crunner, 10)
        assert [e.kind for e in evs] == ["published"]
        await bus.EventPublisher(ctl.js, ctl.nc, RUN, "controller").emit("weights_refused", {"version": 9})
        assert (await ctl.js.consumer_info(subjects.PROMPTS_STREAM, subjects.rollout_consumer(RUN))).num_pending == 0
        last = await ctl.js.get_last_msg(subjects.TRAJECTORIES_STREAM, subjects.trajectories(RUN))
        assert last.data == b"group"
        # weights: the trainer announces, the rollout, eval and controller read it (and the reward service,
        # for a judge that follows the policy: reward.judge.follow_policy)
        await announce(t.js, WeightVersion(run=RUN, version=3, sha256="b" * 64))
        version = 3
        for reader in (w, ev, ctl, rw):
            assert (await latest(reader.js, RUN)).version == version
            watching = watch(reader.js, RUN, idle_s=0.3)  # kv.watch: ordered consumer + its consumer info
            assert (await asyncio.wait_for(watching.__anext__(), 10)).version == version
            version += 1
            await announce(t.js, WeightVersion(run=RUN, version=version, sha256="c" * 64))
            assert (await asyncio.wait_for(watching.__anext__(), 10)).version == version
            await asyncio.sleep(0.7)  # quiet periods: the watch re-checks the key
            await watching.aclose()
        for _ in range(50):
            if len(seen) >= 2:
                break
            await asyncio.sleep(0.1)
        assert subjects.trajectories(RUN) in seen and subjects.events(RUN, "rollout") in seen
        for s in subs:
            await s.unsubscribe()
        for c in (ctl, w, t, trk, ev, rw):
            assert not c.violations(), c.violations()


async def test_reward_service_answers_only_its_subjects(server):
    async with as_role(server, "reward") as r, as_role(server, "rollout") as w:
        async def answer(m):
            await m.respond(b"ok")

        sub = await r.nc.subscribe(subjects.reward("maxdigit"), queue=subjects.REWARD_QUEUE_GROUP, cb=answer)
        await bus.flush(r.nc)
        assert (await w.nc.request(subjects.reward("maxdigit"), b"q", timeout=3)).data == b"ok"
        assert not r.violations()  # the reply went out under allow_responses
        await r.nc.publish(subjects.trajectories(RUN), b"x")
        await r.nc.flush()
        await asyncio.sleep(0.3)
        assert [e for e in r.violations() if "publish" in e.lower() and "trajectories" in e]
        await sub.unsubscribe()
        await r.nc.subscribe(subjects.prompts(RUN))  # outside its allow-list: refused
        await r.nc.flush()
        await asyncio.sleep(0.3)
        assert [e for e in r.violations() if "subscription" in e.lower() and "prompts" in e]


async def test_non_admin_cannot_create_streams_and_waits_for_them(server):
    cfg = NatsConfig(servers=[server.url], user=user_name("rollout"), password="pw-rollout-secret")
    nc = await bus.connect(cfg, name="wait-test")
    try:
        waiting = asyncio.create_task(bus.ensure_streams(nc.jetstream(timeout=2), StreamsConfig(manage=False)))
        await asyncio.sleep(1.0)
        assert not waiting.done()  # nothing created by the rollout user: it waits for the controller
        await setup_streams(server)
        assert set(await asyncio.wait_for(waiting, 10)) == set(subjects.ALL_STREAMS)
    finally:
        await nc.close()


def test_permissions_are_scoped_to_the_run():
    pub = permissions("rollout", RUN)["publish"]["allow"]
    assert subjects.trajectories(RUN) in pub and not any(OTHER in s or s == ">" for s in pub)
    assert not any("DELETE" in s or s.startswith(f"$KV.{subjects.WEIGHTS_KV_BUCKET}") or ".prompts" in s for s in pub)
    assert [s for s in pub if s.startswith("$KV.")] == [f"$KV.{subjects.SESSIONS_KV_BUCKET}.{RUN}.*"]
    assert f"$KV.{subjects.WEIGHTS_KV_BUCKET}.{RUN}" in permissions("trainer", RUN)["publish"]["allow"]
    with pytest.raises(ValueError, match="run id"):
        permissions("rollout", "bad.run")
    with pytest.raises(ValueError, match="unknown"):
        permissions("root", RUN)


def test_compose_nats_conf_is_the_generated_one_and_monitoring_is_loopback():
    conf = (ROOT / "compose" / "nats.conf").read_text()
    want = server_authorization({r: f"${env_var(r)}" for r in ROLES}, "*")
    assert want in conf, "compose/nats.conf is out of date: paste server_authorization()'s output"
    assert re.search(r"^http: 127\.0\.0\.1:8222$", conf, re.M)
    srv = EmbeddedNats(host="0.0.0.0")
    assert f"http: 127.0.0.1:{srv.monitor_port}" in srv.config_text()
    srv.close()


def test_generated_passwords_parse_as_nats_conf_variables(tmp_path):
    """nats-server parses a `$VAR`'s value as a config value: a password that begins with "-" or a digit
    ("1-2...", a date to it) stops the server starting (compose's NATS container once failed so on a random token)."""
    def valid(passwords: list[str]) -> subprocess.CompletedProcess:
        users = "\n".join(f'    {{user: "u{i}", password: $PW_{i}}}' for i in range(len(passwords)))
        conf = tmp_path / "nats.conf"
        conf.write_text(f"listen: 127.0.0.1:4222\nauthorization {{\n  users = [\n{users}\n  ]\n}}\n")
        env = {**os.environ, **{f"PW_{i}": pw for i, pw in enumerate(passwords)}}
        return subprocess.run([nats_server_binary(), "-c", str(conf), "-t"], env=env, capture_output=True,
                              text=True, timeout=30)

    tokens = [new_token() for _ in range(512)]
    r = valid(tokens)
    assert r.returncode == 0, r.stdout + r.stderr
    assert valid(["-" + tokens[0]]).returncode != 0 and valid(["1-2" + tokens[0]]).returncode != 0


async def test_rollout_credential_keeps_its_runs_online_session_records_only(server):
    """`jetrl serve-policy` (a rollout user) writes, reads, lists and deletes its own run's session records
    (rollout_service/online/records.py), and cannot write or get another run's; the trainer cannot write them."""
    from rollout_service.online.records import OnlineSession, SessionRecords

    await setup_streams(server)
    async with as_role(server, "rollout") as w:
        records = SessionRecords(w.js, RUN, max_bytes=1 << 20, max_calls=4, max_sequences=1)
        await records.open()
        s = OnlineSession(id="a" * 32, key="", task=None, index=0, max_calls=4, app="appa")
        await records.save(s)
        assert (await records.load(s.id)).app == "appa"
        assert [x.id for x in await records.load_all()] == [s.id]
        await records.delete(s.id)
        assert await records.load(s.id) is None
        other = SessionRecords(w.js, OTHER, max_bytes=1 << 20, max_calls=4, max_sequences=1)
        await other.open()
        assert await denied(w, other.save(s))
        assert await denied(w, other.kv.get(subjects.session_key(OTHER, s.id)))
    async with as_role(server, "trainer") as t:
        kv = await t.js.key_value(subjects.SESSIONS_KV_BUCKET)
        assert await denied(t, kv.put(subjects.session_key(RUN, s.id), b"forged"))
