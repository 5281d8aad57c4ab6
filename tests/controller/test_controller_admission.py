"""Admission control and the bus follower: the bound holds, versions on the KV raise it, trainer and
rollout events and dead letters move the ledger, metrics/health/versions become readable."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
import uvicorn
from controller_helpers import (
    AUTH,
    make_config,
    maxdigit_rows,
    prompts_count,
    run_config,
    start_live,
    stop_live,
    stream_prompts,
    wait_for,
    write_jsonl,
)

from controller.release import RunReleaser
from shared.config import WeightStoreConfig
from shared.contract import bus, codec, subjects
from shared.contract.messages import DeadLetter, Event, WeightVersion
from shared.runtime.natsd import free_port
from weight_store.client import WeightStoreClient
from weight_store.server import create_app
from weight_store.storage import Storage


async def setup_run(live, tmp_path, run, rows, max_staleness, batch_size, total_steps=0):
    p = tmp_path / f"{run}.jsonl"
    write_jsonl(p, maxdigit_rows(rows))
    with open(p, "rb") as f:
        d = (await live.http.post("/v1/datasets", files={"file": (p.name, f)}, headers=AUTH)).json()
    cfg = run_config(run, max_staleness, batch_size)
    cfg["schedule"]["total_steps"] = total_steps
    r = await live.http.post("/v1/runs", json=cfg, headers=AUTH)
    assert r.status_code == 201, r.text
    r = await live.http.post(f"/v1/runs/{run}/enqueues", json={"dataset": str(d["id"])}, headers=AUTH)
    assert r.status_code == 201, r.text
    return d


async def ledger(live, run):
    return (await live.http.get(f"/v1/runs/{run}/ledger")).json()


async def settle_at(live, js, run, want: int, bound: int):
    """Wait until `want` groups are released, then keep watching a while: never more than `bound`."""
    await wait_for(lambda: _released(live, run, want), what=f"{want} groups released")
    for _ in range(10):  # the releaser gets many chances to overshoot; it must not
        live.ctl.releasers[run].wake()
        await asyncio.sleep(0.05)
        lg = await ledger(live, run)
        assert lg["outstanding"] <= bound, lg
        assert await prompts_count(js, run) == lg["released"]
    assert (await ledger(live, run))["released"] == want


async def _released(live, run, want):
    return (await ledger(live, run))["released"] == want


@pytest.fixture
def weights_store(tmp_path):
    """A real weight store (the FastAPI app on uvicorn in a thread) that the controller checks versions with."""
    port = free_port()
    cfg = WeightStoreConfig(url=f"http://127.0.0.1:{port}", root=str(tmp_path / "weights"), port=port,
                            insecure_no_auth=True, cache_dir=str(tmp_path / "wcache"))
    server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", loop="asyncio", access_log=False))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "weight store did not start"
        time.sleep(0.02)
    yield cfg
    server.should_exit = True
    t.join(10)


@pytest.fixture
async def live(tmp_path, nats_config, db_url, js, weights_store):
    cfg = make_config(tmp_path, nats_config, db_url).model_copy(update={"weights": weights_store})
    handle = await start_live(cfg)
    yield handle[0]
    await stop_live(handle)


async def store_version(live, run, version, step=None) -> WeightVersion:
    """Commit `version` to the weight store (what the trainer does before it announces)."""
    client = WeightStoreClient(live.cfg.weights)
    return await client.publish(run, version, {"w": torch.full((4,), float(version))},
                                step=version if step is None else step)


async def announce(js, run, version, step=None, live=None, store=True):
    """Commit the version to the store (unless `store` is false), then announce it in the KV."""
    wv = WeightVersion(run=run, version=version, step=version if step is None else step, sha256="0" * 64)
    if store:
        wv = await store_version(live or LIVE[0], run, version, step)
    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    await kv.put(run, codec.encode(wv))


LIVE: list = []


@pytest.fixture(autouse=True)
def _live_for_announce(request):
    """announce() commits through the test's live controller's weight store config."""
    if "live" in request.fixturenames:
        LIVE[:] = [request.getfixturevalue("live")]
    yield
    LIVE.clear()


async def emit(js, nc, run, service, kind, data, instance="i0"):
    await bus.publish(js, nc, subjects.events(run, service), Event(run=run, service=service, kind=kind, data=data,
                                                                    instance=instance))


async def test_admission_never_exceeds_the_bound_and_grows_with_versions(live, js, nc, tmp_path):
    await setup_run(live, tmp_path, "a1", rows=40, max_staleness=1, batch_size=3)
    await settle_at(live, js, "a1", 6, bound=6)  # (0 + 1 + 1) * 3 before any version
    await announce(js, "a1", 0)
    await settle_at(live, js, "a1", 6, bound=6)
    await announce(js, "a1", 1)
    await settle_at(live, js, "a1", 9, bound=9)
    await store_version(live, "a1", 2)  # committed, never announced (a trainer that died before announcing)
    await announce(js, "a1", 3)  # a jump the store accounts for
    await settle_at(live, js, "a1", 15, bound=15)
    run = (await live.http.get("/v1/runs/a1")).json()
    assert run["current_version"] == 3 and run["admission_bound"] == 15
    versions = (await live.http.get("/v1/runs/a1/versions")).json()
    assert [v["version"] for v in versions] == [0, 1, 3]
    tasks = [t for _, t in await stream_prompts(js, "a1")]
    assert sorted(t.released_at_version for t in tasks) == [0] * 6 + [1] * 3 + [3] * 6


async def test_after_a_trainer_resume_the_bound_follows_its_steps_not_its_versions(live, js, nc, tmp_path):
    # A trainer killed at version 6 resumed from its step-4 checkpoint and published version 7 at step 5:
    # its lineage has trained 5 batches, so the window is (5 + 1 + 1) x 3, not (7 + 1 + 1) x 3.
    await setup_run(live, tmp_path, "j1", rows=40, max_staleness=1, batch_size=3)
    await announce(js, "j1", 6)
    await settle_at(live, js, "j1", 24, bound=24)
    await announce(js, "j1", 7, step=5)
    await wait_for(lambda: _current_version_is(live, "j1", 7), what="version 7 seen")
    run = (await live.http.get("/v1/runs/j1")).json()
    assert run["current_step"] == 5 and run["admission_bound"] == 21
    await settle_at(live, js, "j1", 24, bound=24)  # nothing more released: 24 out already


async def _current_version_is(live, run, v):
    return (await live.http.get(f"/v1/runs/{run}")).json()["current_version"] == v


async def test_a_run_of_total_steps_never_has_more_groups_out_than_it_will_train(live, js, nc, tmp_path):
    """The bound is capped at total_steps x batch_size groups not freed, so the run ends with nothing in
    flight; groups dropped (or re-decided as dropped by a resumed trainer) make room for others."""
    await setup_run(live, tmp_path, "n1", rows=30, max_staleness=1, batch_size=3, total_steps=3)
    await settle_at(live, js, "n1", 6, bound=6)  # (0 + 1 + 1) * 3
    await announce(js, "n1", 5)  # (5 + 1 + 1) * 3 = 21, but the run trains 3 x 3 groups
    await settle_at(live, js, "n1", 9, bound=9)
    assert (await live.http.get("/v1/runs/n1")).json()["admission_bound"] == 9
    gids = [mid for mid, _ in await stream_prompts(js, "n1")]
    await emit(js, nc, "n1", "trainer", "groups", {"version": 5, "step": 1, "trained": gids[:3],
                                                   "dropped_stale": gids[3:5], "filtered": []})
    await settle_at(live, js, "n1", 11, bound=9)  # two dropped: two more released
    # a resumed trainer reads gids[0] again and now drops it as stale: the latest report wins
    await emit(js, nc, "n1", "trainer", "groups", {"version": 7, "step": 1, "trained": [],
                                                   "dropped_stale": gids[:1], "filtered": []})
    await settle_at(live, js, "n1", 12, bound=9)
    lg = await ledger(live, "n1")
    assert (lg["trained"], lg["dropped_stale"], lg["outstanding"]) == (2, 3, 9)


async def test_synchronous_baseline_releases_one_batch_per_version(live, js, tmp_path):
    await setup_run(live, tmp_path, "s0", rows=20, max_staleness=0, batch_size=4)
    await settle_at(live, js, "s0", 4, bound=4)
    await announce(js, "s0", 1)
    await settle_at(live, js, "s0", 8, bound=8)


async def test_events_and_dead_letters_move_the_ledger_and_free_budget(live, js, nc, tmp_path):
    await setup_run(live, tmp_path, "e1", rows=30, max_staleness=0, batch_size=5)
    await settle_at(live, js, "e1", 5, bound=5)
    gids = [mid for mid, _ in await stream_prompts(js, "e1")]
    raw = {mid: None for mid in gids}
    for seq in range(1, 100):
        try:
            m = await js.get_msg(subjects.PROMPTS_STREAM, seq)
        except Exception:
            break
        raw[m.headers[subjects.MSG_ID_HEADER]] = m.data

    await emit(js, nc, "e1", "rollout", "published", {"group_ids": gids[:4], "worker": "w0"})
    await wait_for(lambda: _state(live, "e1", "trajectory_received", 4), what="4 groups received")
    await emit(js, nc, "e1", "trainer", "groups", {"version": 1, "trained": gids[:2], "dropped_stale": [gids[2]],
                                                   "filtered": [gids[3]]})
    # a dead letter of the 5th prompt (as the rollout consumer would publish it)
    dl = DeadLetter(run="e1", source="rollout-e1", subject=subjects.prompts("e1"), reason="max_deliver",
                    original=raw[gids[4]], delivery_count=5, stream=subjects.PROMPTS_STREAM, stream_seq=5)
    await bus.publish(js, nc, subjects.dlq("e1", "rollout-e1"), dl)
    await wait_for(lambda: _state(live, "e1", "dead_lettered", 1), what="dead letter recorded")
    # the DLQ and the events are two consumers: the dead letter can land before the groups event
    await wait_for(lambda: _state(live, "e1", "filtered", 1), what="groups event applied")
    lg = await ledger(live, "e1")
    assert (lg["trained"], lg["dropped_stale"], lg["filtered"], lg["dead_lettered"]) == (2, 1, 1, 1)
    # 3 groups were freed (stale, filtered, dead-lettered): 3 more released under the same bound of 5
    await settle_at(live, js, "e1", 8, bound=5)
    lg = await ledger(live, "e1")
    assert lg["balanced"] and lg["in_flight"] == 3 and lg["outstanding"] == 5
    # a late "published" for an already trained group does not move it backwards
    await emit(js, nc, "e1", "rollout", "published", {"group_ids": gids[:1]})
    await emit(js, nc, "e1", "trainer", "step", {"version": 1, "step": 1, "loss": 0.5, "reward_mean": 0.25,
                                                 "accuracy": 0.25, "tokens_per_s": 100.0,
                                                 "staleness_hist": {"0": 6, "1": 2}})
    await emit(js, nc, "e1", "trainer", "step", {"version": 2, "step": 2, "loss": 0.4, "reward_mean": 0.5,
                                                 "tokens_per_s": 120.0, "staleness_hist": {"0": 5, "2": 1}})
    await emit(js, nc, "e1", "trainer", "health", {"status": "ok"}, instance="trainer-0")
    await wait_for(lambda: _metric_points(live, "e1", "trainer.reward_mean", 2), what="2 reward points")
    assert (await ledger(live, "e1"))["trained"] == 2
    m = (await live.http.get("/v1/runs/e1/metrics", params={"name": ["reward_mean", "loss"]})).json()
    assert m["trainer.reward_mean"] == [[1.0, 0.25], [2.0, 0.5]] and "trainer.tokens_per_s" not in m
    assert (await live.http.get("/v1/runs/e1/staleness")).json() == {"0": 11, "1": 2, "2": 1}
    await wait_for(lambda: _healthy(live, "trainer-0"), what="trainer health")
    ev = (await live.http.get("/v1/runs/e1/events", params={"kind": "dead_letter"})).json()
    assert ev[0]["data"]["group_id"] == gids[4] and ev[0]["data"]["reason"] == "max_deliver"
    q = (await live.http.get("/v1/runs/e1/queues")).json()
    assert q["prompts_in_stream"] == 8 and q["dead_letters_in_stream"] == 1


async def _state(live, run, key, n):
    return (await ledger(live, run))[key] == n


async def _metric_points(live, run, name, n):
    m = (await live.http.get(f"/v1/runs/{run}/metrics")).json()
    return len(m.get(name, [])) == n


async def _healthy(live, instance):
    h = (await live.http.get("/v1/health")).json()
    return any(s["instance"] == instance and s["alive"] for s in h["services"]) and h["nats"] == "connected"


async def test_pause_holds_releases_and_resume_continues(live, js, tmp_path):
    await setup_run(live, tmp_path, "p1", rows=20, max_staleness=0, batch_size=4)
    await settle_at(live, js, "p1", 4, bound=4)
    assert (await live.http.post("/v1/runs/p1/pause", headers=AUTH)).json()["status"] == "paused"
    await announce(js, "p1", 2)
    await wait_for(lambda: _version(live, "p1", 2), what="version 2 seen")
    await settle_at(live, js, "p1", 4, bound=4)
    await live.http.post("/v1/runs/p1/resume", headers=AUTH)
    await settle_at(live, js, "p1", 12, bound=12)


async def _version(live, run, v):
    return (await live.http.get(f"/v1/runs/{run}")).json()["current_version"] == v


async def test_a_newer_version_reported_during_start_up_keeps_its_own_step():
    # Restarted controller: the releaser looks up the step of the version its database last saw (27,
    # step 21) while the follower already reports the newest announcement (30, step 27). The result must
    # be the newer pair; (30, 21) shrank the bound below the groups already out and the run deadlocked
    # (fault suite, controller kill during a burst of trainer steps).
    rel = RunReleaser(ctl=None, run_id="r")
    looking_up, follower_done = threading.Event(), threading.Event()

    def slow_lookup(version: int) -> tuple[int, int]:
        looking_up.set()
        follower_done.wait(10)
        return {27: (21, 0), 30: (27, 0)}[version]

    rel._announced = slow_lookup
    start_up = asyncio.create_task(rel._adopt_stored_version(27))
    await asyncio.to_thread(looking_up.wait, 10)
    rel.set_version(30, 27)  # the follower, on the event loop, while the lookup runs
    follower_done.set()
    await start_up
    assert (rel.current_version, rel.current_step) == (30, 27)
    await rel._adopt_stored_version(25)  # an older stored version changes nothing
    assert (rel.current_version, rel.current_step) == (30, 27)


async def _refused_event(live, run, version):
    evs = (await live.http.get(f"/v1/runs/{run}/events", params={"kind": "weights_refused"}, headers=AUTH)).json()
    evs = evs.get("events", evs) if isinstance(evs, dict) else evs
    return any(e["kind"] == "weights_refused" and e["data"].get("version") == version and
               e["service"] == "controller" for e in evs)


async def test_a_forged_announcement_does_not_move_the_bound_and_is_reported(live, js, nc, tmp_path):
    # a forged announcement: `version=1000000` written into the KV by someone other than the trainer
    await setup_run(live, tmp_path, "f1", rows=60, max_staleness=1, batch_size=3)
    await announce(js, "f1", 0)
    await announce(js, "f1", 1)
    await settle_at(live, js, "f1", 9, bound=9)
    await announce(js, "f1", 1_000_000, store=False)
    await wait_for(lambda: _refused_event(live, "f1", 1_000_000), what="the weights_refused event")
    await settle_at(live, js, "f1", 9, bound=9)  # the bound did not jump to 3,000,006
    run = (await live.http.get("/v1/runs/f1")).json()
    assert run["current_version"] == 1 and run["admission_bound"] == 9, run
    assert [v["version"] for v in (await live.http.get("/v1/runs/f1/versions", headers=AUTH)).json()] == [0, 1]
    # a version the store holds under another manifest digest is refused the same way
    good = await store_version(live, "f1", 2)
    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    await kv.put("f1", codec.encode(WeightVersion(run="f1", version=2, step=2, sha256="1" * 64)))
    await wait_for(lambda: _refused_event(live, "f1", 2), what="the refusal of a wrong digest")
    assert (await live.http.get("/v1/runs/f1")).json()["current_version"] == 1
    # the trainer's real next version moves the bound as usual
    await kv.put("f1", codec.encode(good))
    await wait_for(lambda: _current_version_is(live, "f1", 2), what="version 2 accepted")
    await settle_at(live, js, "f1", 12, bound=12)


async def test_versions_retention_retired_before_the_check_are_still_recorded(
        live, js, nc, tmp_path):
    # The trainer ran ahead: versions 0-3 are committed and the store's retention (keep_last) already deleted
    # 0 and 1 when the controller gets to version 0's announcement (seen in CI: the audit began at 3).
    await setup_run(live, tmp_path, "r1", rows=60, max_staleness=1, batch_size=3)
    client = WeightStoreClient(live.cfg.weights)
    wvs = [await store_version(live, "r1", v) for v in range(4)]
    storage = Storage(live.cfg.weights.root)  # what the store's retention deletes with (state.py StoreState.retain)
    for v in set(await client.versions("r1")) & {0, 1}:
        storage.delete("r1", v)
    held = await client.versions("r1")
    assert min(held) == 2, held
    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    for wv in wvs:
        await kv.put("r1", codec.encode(wv))
    await wait_for(lambda: _current_version_is(live, "r1", 3), what="version 3 accepted")
    assert [v["version"] for v in (await live.http.get("/v1/runs/r1/versions", headers=AUTH)).json()] == [0, 1, 2, 3]
