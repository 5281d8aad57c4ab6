"""Online training (`jetrl serve-policy`) on a real nats-server: sessions from outside traffic over the real
openai client, late rewards, expiry, a reward posted twice or for an unknown session, applications that
cannot reach each other's sessions, per-application limits, a worker SIGKILLed between a conversation and
its reward, and staleness on the versions recorded."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from rollout_doubles import (
    QWEN_LIKE_TEMPLATE,
    ScriptedEngine,
    char_tokenizer,
    read_groups,
    wait_for,
    worker_config,
)

from rollout_service.online.groups import MovingBaseline
from rollout_service.online.keys import ClientKeys, read_key_file
from rollout_service.online.limits import AppLimits, Bucket
from rollout_service.service import RolloutWorker
from trainer_service.service import draw_stats

RUN = "on1"
KEY_A = "a" * 20 + "-key-of-app-a"
KEY_A2 = "a2" * 12 + "-rotated"
KEY_B = "b" * 20 + "-key-of-app-b"


def write_key(d: Path, app: str, *keys: str, mode: int = 0o600) -> Path:
    p = d / f"{app}.key"
    p.write_text("".join(k + "\n" for k in keys))
    os.chmod(p, mode)
    return p


@pytest.fixture
def keys_dir(tmp_path):
    d = tmp_path / "keys"
    d.mkdir()
    write_key(d, "appa", KEY_A)
    write_key(d, "appb", KEY_B)
    return d


class Online:
    """A serve-policy worker in this process (scripted engine: it answers `answer <call index>`)."""

    def __init__(self, nats_config, keys_dir, **online):
        self.cfg = worker_config(nats_config.servers[0], RUN, online={"keys_dir": str(keys_dir), **online},
                                 agent={"max_calls": 4}, service={"max_new_tokens": 64})
        self.cfg.rollout.service.follow_weights = False
        self.tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
        self.engine = ScriptedEngine(self.tok, lambda p, n: f"answer {n}")
        self.worker = RolloutWorker(self.cfg, engine=self.engine, tokenizer=self.tok, instance="online", online=True)
        self.task = None

    async def __aenter__(self):
        await self.worker.start()
        self.task = asyncio.create_task(self.worker.run())
        self.url = self.worker.online.base_url
        self.http = httpx.AsyncClient(base_url=self.url, timeout=30)
        return self

    async def __aexit__(self, *exc):
        await self.http.aclose()
        self.worker.stop()
        await asyncio.wait_for(self.task, 30)

    @property
    def server(self):
        return self.worker.online

    async def open(self, key: str = KEY_A, **body) -> dict:
        r = await self.http.post("/v1/sessions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 201, r.text
        return r.json()

    async def chat(self, session: dict, text: str, key: str = KEY_A, messages=None) -> str:
        client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=key, max_retries=0)
        r = await client.chat.completions.create(model="anything", messages=messages or [
            {"role": "user", "content": text}])
        await client.close()
        return r.choices[0].message.content

    async def reward(self, sid: str, value, key: str = KEY_A) -> httpx.Response:
        return await self.http.post(f"/sessions/{sid}/reward", json={"reward": value},
                                    headers={"Authorization": f"Bearer {key}"})


# --- pure parts ---------------------------------------------------------------------------------------


def test_keys_must_be_private_and_are_reread_when_they_change(tmp_path):
    write_key(tmp_path, "appa", KEY_A)
    loose = write_key(tmp_path, "loose", KEY_B, mode=0o644)
    keys = ClientKeys(tmp_path, recheck_s=0)
    assert keys.app_for(KEY_A) == "appa" and keys.app_for(KEY_B) is None and keys.app_for("x" * 30) is None
    assert "chmod 600" in keys.problems["loose.key"]
    write_key(tmp_path, "bad name", KEY_B)
    keys.refresh(force=True)
    assert "application name" in keys.problems["bad name.key"] and "chmod 600" in keys.problems["loose.key"]
    with pytest.raises(ValueError, match="at least 16"):
        read_key_file(write_key(tmp_path, "short", "tooshort"))
    os.chmod(loose, 0o600)
    write_key(tmp_path, "appa", KEY_A, KEY_A2)  # rotation: old and new both admitted
    keys.refresh(force=True)
    assert keys.app_for(KEY_B) == "loose" and keys.app_for(KEY_A2) == "appa" and keys.app_for(KEY_A) == "appa"
    write_key(tmp_path, "appa", KEY_A2)  # the old key revoked
    keys.refresh(force=True)
    assert keys.app_for(KEY_A) is None and keys.app_for(KEY_A2) == "appa"
    with pytest.raises(ValueError, match="not a directory"):
        ClientKeys(tmp_path / "missing")


def test_buckets_refill_by_the_minute_and_charges_may_overdraw():
    b = Bucket(60.0, at=0.0)
    b.take(60, now=0.0)
    assert b.available(now=0.0) == 0 and b.available(now=0.5) == pytest.approx(0.5)
    b.take(10.5, now=0.5)  # overdrawn to -10
    assert b.wait_s(now=0.5) == pytest.approx(11.0)
    limits = AppLimits(requests_per_min=2, tokens_per_min=100)
    assert limits.admit_request("a", now=0.0) is None and limits.admit_request("a", now=0.0) is None
    assert "requests_per_min = 2" in limits.admit_request("a", now=0.0)
    assert limits.admit_request("b", now=0.0) is None  # per application
    limits.charge_tokens("a", 150, now=0.0)
    assert "tokens_per_min = 100" in limits.admit_tokens("a", now=0.0) and limits.admit_tokens("b", now=0.0) is None


def test_the_moving_baseline_is_the_window_mean_and_population_std():
    b = MovingBaseline(window=3)
    assert b.account(1.0) == {"drawn": 1, "mean": 1.0, "std": 0.0, "signal": False, "rounds": 0, "successes": 0,
                              "baseline": "moving"}
    a = b.account(0.0)
    assert (a["drawn"], a["mean"], a["std"], a["signal"]) == (2, 0.5, 0.5, True)
    b.account(0.0)
    a = b.account(1.0)  # the window is the last 3: 0, 0, 1
    assert (a["drawn"], a["mean"]) == (3, pytest.approx(1 / 3))
    assert a["std"] == pytest.approx(math.sqrt(2 / 9))


# --- the endpoint on NATS -----------------------------------------------------------------------------


async def _groups(js, n: int):
    gs = await read_groups(js, RUN)
    return gs if len(gs) >= n else None


async def test_late_rewards_publish_sessions_with_their_recorded_tokens_against_a_moving_baseline(
        nats_config, js, keys_dir):
    async with Online(nats_config, keys_dir) as on:
        s1, s2 = await on.open(), await on.open()
        assert s1["base_url"] == f"{on.url}/sessions/{s1['id']}/v1" and s1["id"] != s2["id"]
        assert await on.chat(s1, "hello") == "answer 0"
        # a second turn of the same conversation extends it: one sample of two turns
        await on.chat(s1, "", messages=[{"role": "user", "content": "hello"},
                                        {"role": "assistant", "content": "answer 0"},
                                        {"role": "user", "content": "again"}])
        assert await on.chat(s2, "other") == "answer 2"
        assert await read_groups(js, RUN) == []  # nothing is published before a reward
        await asyncio.sleep(0.3)  # the reward comes later
        r = await on.reward(s1["id"], 1.0)
        assert r.status_code == 200 and r.json()["published"] == f"{RUN}:0:online-appa-{s1['id']}"
        r = await on.reward(s2["id"], 0.0)
        assert r.status_code == 200
        g1, g2 = await wait_for(lambda: _groups(js, 2), what="two online groups")
    assert [len(g.samples) for g in (g1, g2)] == [1, 1] and g1.workflow == "online"
    s = g1.samples[0]
    assert s.reward == 1.0 and s.metrics["session"] == s1["id"] and s.metrics["episode_calls"] == 2
    text = on.tok.decode(s.tokens[s.loss_mask.astype(bool)].tolist())
    assert text == "answer 0answer 1"  # both turns' completions are trained; the rest is masked
    assert (s.logprobs[s.loss_mask.astype(bool)] == -0.25).all()
    # the baseline: the first session alone (no spread yet), then the window {1, 0}
    assert g1.adaptive["drawn"] == 1 and g1.adaptive["signal"] is False
    assert (g2.adaptive["drawn"], g2.adaptive["mean"], g2.adaptive["std"]) == (2, 0.5, 0.5)
    d = draw_stats(g2)
    assert d is not None and (d.n, d.mean, d.std) == (2, 0.5, 0.5)  # what the trainer's advantage uses
    assert on.server.counts["opened"] == 2 and on.server.counts["published"] == 2


async def test_a_group_key_makes_one_group_per_application_when_enough_are_rewarded(nats_config, js, keys_dir):
    async with Online(nats_config, keys_dir, group_size=2) as on:
        a1, a2 = await on.open(group="q1"), await on.open(group="q1")
        b1 = await on.open(key=KEY_B, group="q1")  # the same key in another application: its own group
        for s in (a1, a2):
            await on.chat(s, "same question")
        await on.chat(b1, "same question", key=KEY_B)
        r = (await on.reward(a1["id"], 1.0)).json()
        assert r["published"] is None and r["group_waiting"] == "1 of 2 sessions of group 'q1' rewarded"
        assert (await on.reward(b1["id"], 0.5, key=KEY_B)).json()["published"] is None
        r = (await on.reward(a2["id"], 0.0)).json()
        assert r["published"].startswith(f"{RUN}:0:online-appa-")
        (g,) = await wait_for(lambda: _groups(js, 1), what="the group")
        assert sorted(s.reward for s in g.samples) == [0.0, 1.0] and not g.adaptive
        assert {s.metrics["session"] for s in g.samples} == {a1["id"], a2["id"]}
        assert len(on.server.store.sessions) == 1  # b1 waits for its sibling


async def test_rewards_twice_unknown_expired_and_another_applications_sessions(nats_config, js, keys_dir):
    async with Online(nats_config, keys_dir, session_ttl_s=1.0, sweep_interval_s=0.2) as on:
        s = await on.open()
        await on.chat(s, "hi")
        other = await on.open()
        await on.chat(other, "hi")
        auth_b = {"Authorization": f"Bearer {KEY_B}"}
        # another application's key: the session does not exist for it, whatever the route
        for method, path in (("POST", f"/sessions/{s['id']}/reward"), ("GET", f"/sessions/{s['id']}"),
                             ("POST", f"/sessions/{s['id']}/v1/chat/completions")):
            r = await on.http.request(method, path, headers=auth_b, json={"reward": 1.0} if "reward" in path else
                                      {"messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 404, (path, r.text)
        with pytest.raises(openai.NotFoundError):
            await on.chat(s, "steal", key=KEY_B)
        assert (await on.http.get(f"/sessions/{s['id']}", headers={"Authorization": "Bearer nope" * 4})).status_code == 401
        assert (await on.http.post("/v1/sessions", json={})).status_code == 401
        assert (await on.reward(s["id"], 1.0)).status_code == 200
        r = await on.reward(s["id"], 0.0)  # posted twice: the first stands
        assert r.status_code in (404, 409)  # 409 while held; 404 once published (it is gone)
        assert (await on.reward("0" * 32, 1.0)).status_code == 404
        assert (await on.reward("../../etc", 1.0)).status_code == 404
        for bad in (b'{"reward": NaN}', b'{"reward": 1e999}', b'{"reward": "1"}', b'{"reward": 1, "x": 2}'):
            r = await on.http.post(f"/sessions/{other['id']}/reward", content=bad, headers={
                "Authorization": f"Bearer {KEY_A}", "content-type": "application/json"})
            assert r.status_code == 400, (bad, r.text)
        await wait_for(lambda: on.server.counts["expired"] >= 1, timeout=10, what="the idle session to expire")
        assert (await on.reward(other["id"], 1.0)).status_code == 404  # too late: dropped and counted
        counts = on.server.counts
        assert counts["unknown_session"] >= 3 and counts["expired"] == 1 and counts["published"] == 1
        assert len(await read_groups(js, RUN)) == 1
        metrics = on.worker.metrics.online_sessions
        assert metrics.labels("expired")._value.get() == 1


async def test_a_reward_posted_twice_while_its_group_waits_is_refused(nats_config, js, keys_dir):
    async with Online(nats_config, keys_dir, group_size=3) as on:
        s = await on.open(group="g")
        await on.chat(s, "hi")
        assert (await on.reward(s["id"], 1.0)).status_code == 200
        r = await on.reward(s["id"], 0.0)
        assert r.status_code == 409 and r.json()["error"]["code"] == "already_rewarded"
        # a rewarded session takes no more calls
        with pytest.raises(openai.ConflictError):
            await on.chat(s, "more")
        assert on.server.counts["duplicate_reward"] == 1 and on.server.store.sessions[s["id"]].reward == 1.0


async def test_limits_per_application_and_the_endpoints_bounds(nats_config, js, keys_dir):
    async with Online(nats_config, keys_dir, requests_per_min=5, tokens_per_min=60, max_open_sessions=2) as on:
        s = await on.open()
        await on.open()
        r = await on.http.post("/v1/sessions", json={}, headers={"Authorization": f"Bearer {KEY_A}"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_sessions"
        await on.chat(s, "x" * 40)  # about 60 prompt + completion tokens: the budget is spent
        with pytest.raises(openai.RateLimitError):
            await on.chat(s, "again")
        r = await on.http.post("/v1/sessions", json={}, headers={"Authorization": f"Bearer {KEY_A}"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1  # 6th request in the minute
        other = await on.open(key=KEY_B)  # application b has its own limits
        client = openai.AsyncOpenAI(base_url=other["base_url"], api_key=KEY_B, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="max_new_tokens"):  # the rollout engines' bounds
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=100_000)
        # the app itself (over TCP the server's close would reset the upload before its 413 is read)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=on.server.build_app()), base_url=on.url) as h:
            big = await h.post(f"/sessions/{other['id']}/v1/chat/completions", content=b"{" + b" " * 5_000_000,
                               headers={"Authorization": f"Bearer {KEY_B}", "content-type": "application/json"})
        assert big.status_code == 413 and "max_request_bytes" in big.text
        await client.close()


async def test_staleness_is_measured_on_the_versions_recorded(nats_config, js, keys_dir):
    async with Online(nats_config, keys_dir) as on:
        s = await on.open()
        await on.chat(s, "first")
        await on.engine.update_weights(3)  # the policy moved on between the turns
        await on.chat(s, "", messages=[{"role": "user", "content": "first"}, {"role": "assistant", "content": "answer 0"},
                                       {"role": "user", "content": "second"}])
        info = (await on.http.get(f"/sessions/{s['id']}", headers={"Authorization": f"Bearer {KEY_A}"})).json()
        assert info["versions"] == [0, 3] and info["calls"] == 2
        await on.engine.update_weights(9)  # and again before the reward arrived
        await on.reward(s["id"], 1.0)
        (g,) = await wait_for(lambda: _groups(js, 1), what="the group")
    sample = g.samples[0]
    assert sorted(set(sample.versions[sample.loss_mask.astype(bool)].tolist())) == [0, 3]
    assert sample.oldest_version() == 0 and g.released_at_version == 0  # the trainer's staleness: now - 0


async def test_a_worker_sigkilled_between_the_conversation_and_its_reward_loses_nothing(nats_config, js, keys_dir):
    proc_py = Path(__file__).with_name("online_worker_proc.py")

    def start():
        p = subprocess.Popen([sys.executable, str(proc_py), nats_config.servers[0], RUN, str(keys_dir)],
                             stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        assert line.startswith("url "), line
        return p, line.split()[1]

    p, url = start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30, headers={"Authorization": f"Bearer {KEY_A}"}) as http:
            s = (await http.post("/v1/sessions", json={"metadata": {"user": "u1"}})).json()
            client = openai.AsyncOpenAI(base_url=s["base_url"], api_key=KEY_A, max_retries=0)
            r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "remember"}])
            await client.close()
            assert r.choices[0].message.content == "answer 0"
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        p, url = start()  # a new worker, another port: it takes the session over from its record
        async with httpx.AsyncClient(base_url=url, timeout=30, headers={"Authorization": f"Bearer {KEY_A}"}) as http:
            info = (await http.get(f"/sessions/{s['id']}")).json()
            assert info["calls"] == 1 and info["metadata"] == {"user": "u1"}
            r = await http.post(f"/sessions/{s['id']}/reward", json={"reward": 1.0})
            assert r.status_code == 200, r.text
        (g,) = await wait_for(lambda: _groups(js, 1), what="the group")
        tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
        sample = g.samples[0]
        assert "remember" in tok.decode(sample.tokens[: sample.prompt_len].tolist())
        assert tok.decode(sample.tokens[sample.loss_mask.astype(bool)].tolist()) == "answer 0"
    finally:
        p.kill()
        p.wait(10)


async def test_a_failed_publish_keeps_the_reward_and_the_sweep_publishes_it(nats_config, js, keys_dir):
    async with Online(nats_config, keys_dir, sweep_interval_s=0.2) as on:
        real, failures = on.server.publish, []

        async def flaky(group):
            if not failures:
                failures.append(group.group_id)
                raise ConnectionError("NATS is away")
            await real(group)

        on.server.publish = flaky
        s = await on.open()
        await on.chat(s, "hi")
        r = (await on.reward(s["id"], 1.0)).json()
        assert r["published"] is None and "publish_pending" in r
        (g,) = await wait_for(lambda: _groups(js, 1), what="the sweep to publish it")
        assert g.group_id == failures[0] and g.samples[0].reward == 1.0
        assert (await on.reward(s["id"], 0.0)).status_code == 404  # published: gone
