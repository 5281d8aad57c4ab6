"""`launch.sampling: learnable-first` against a live controller and nats-server: a second run on the same
data releases in the order the first run's prompt memory gives (learnable, unseen, no signal, never
solved, always solved; ties in the seeded permutation), each row exactly once per epoch over two epochs
with a `limit` and two controller restarts mid-epoch; a `uniform` run on the same data keeps its
permutation; the memory is still there after the restarts (REST views)."""

from __future__ import annotations

import numpy as np
from controller_helpers import (
    make_config,
    maxdigit_rows,
    prompts_count,
    run_config,
    start_live,
    stop_live,
    wait_for,
    write_jsonl,
)
from sqlalchemy import select

from controller.db import Ledger, PromptMemory
from shared.contract import bus, codec, subjects
from shared.contract.messages import Event, WeightVersion

ROWS, LIMIT, SEED = 10, 9, 5
# what run "first" saw per row: (drawn, successes, signal); rows 7, 8, 9 were never observed
SEEN = {0: (4, 4, False), 1: (4, 4, False), 2: (4, 0, False), 3: (8, 0, False), 4: (4, 2, True), 5: (4, 1, True),
        6: (4, 3, False)}
RANK = {0: 4, 1: 4, 2: 3, 3: 3, 4: 0, 5: 0, 6: 2, 7: 1, 8: 1, 9: 1}  # always, never, learnable, no signal, unseen


def expected_epoch(local_epoch: int) -> list[int]:
    perm = np.random.default_rng([SEED, local_epoch]).permutation(LIMIT).tolist()
    return sorted(perm, key=lambda r: (RANK[r], perm.index(r)))


def released(ctl, run) -> list[tuple[int, int]]:
    with ctl.Session() as s:
        return [(e, i) for e, i in s.execute(select(Ledger.epoch, Ledger.row_index).where(Ledger.run_id == run)
                                              .order_by(Ledger.seq))]


async def announce(js, run, version):
    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    await kv.put(run, codec.encode(WeightVersion(run=run, version=version, step=version)))


async def test_a_second_run_releases_learnable_prompts_first_exactly_once_per_epoch_across_restarts(
        tmp_path, nats_config, nc, js, db_url):
    cfg = make_config(tmp_path, nats_config, db_url, verify_weights=False)
    handle = await start_live(cfg)
    live = handle[0]
    data = write_jsonl(tmp_path / "rows.jsonl", maxdigit_rows(ROWS))
    with open(data, "rb") as f:
        d = (await live.http.post("/v1/datasets", files={"file": ("rows.jsonl", f)})).json()
    pid = lambda i: f"{d['content_hash'][:12]}-{i}"  # noqa: E731

    # run "first" (uniform) releases every row; its rollouts report what they saw on the bus
    assert (await live.http.post("/v1/runs", json=run_config("first", 0, 100))).status_code == 201
    await live.http.post("/v1/runs/first/enqueues", json={"dataset": str(d["id"])})
    await wait_for(lambda: _count_is(js, "first", ROWS), what="run first released")
    prompts = [{"group_id": subjects.group_id("first", 0, pid(i)), "prompt_id": pid(i), "drawn": n, "successes": k,
                "reward_mean": k / n, "signal": sig, "version": 1} for i, (n, k, sig) in SEEN.items()]
    ev = Event(run="first", service="rollout", kind="published",
               data={"group_ids": [p["group_id"] for p in prompts], "worker": "w0", "prompts": prompts})
    await bus.publish(js, nc, subjects.events("first", "rollout"), ev)
    await wait_for(lambda: _memory_rows(live) == len(SEEN), what="the first run's memory")

    # run "second": learnable-first, 2 epochs of the first 9 rows, 3 groups per version (max_staleness 0)
    second = run_config("second", 0, 3, launch={"sampling": "learnable-first"})
    assert (await live.http.post("/v1/runs", json=second)).status_code == 201
    # and a uniform run on the same data keeps the epoch's permutation whatever the memory says
    assert (await live.http.post("/v1/runs", json=run_config("plain", 0, 100))).status_code == 201
    await live.http.post("/v1/runs/plain/enqueues", json={"dataset": str(d["id"]), "shuffle_seed": SEED, "limit": LIMIT})
    await live.http.post("/v1/runs/second/enqueues", json={"dataset": str(d["id"]), "epochs": 2, "shuffle_seed": SEED,
                                                            "limit": LIMIT})
    await wait_for(lambda: _count_is(js, "second", 3), what="the first 3 of run second")
    await wait_for(lambda: _count_is(js, "plain", LIMIT), what="run plain released")
    perm0 = np.random.default_rng([SEED, 0]).permutation(LIMIT).tolist()
    assert released(live.ctl, "plain") == [(0, i) for i in perm0]

    for version, restart in ((1, True), (2, False), (3, True), (4, False), (5, False)):
        if restart:  # mid-epoch: after 3 and after 12 of the 18 releases
            await stop_live(handle)
            handle = await start_live(cfg)
            live = handle[0]
        await announce(js, "second", version)
        await wait_for(lambda n=3 * (version + 1): _count_is(js, "second", n), what=f"{3 * (version + 1)} released")
    await wait_for(lambda: _count_is(js, "second", 18), what="18 released")
    got = released(live.ctl, "second")
    want = [(0, i) for i in expected_epoch(0)] + [(1, i) for i in expected_epoch(1)]
    assert got == want
    ids = [mid for mid, _ in await _stream(js, "second")]
    assert len(ids) == len(set(ids)) == 18

    # the memory survived both restarts: the dataset view still holds the first run's observations
    st = (await live.http.get(f"/v1/datasets/{d['id']}/prompts/stats", params={"limit": 3})).json()
    assert st["prompts_observed"] == 7 and st["samples_drawn"] == 32
    assert st["classes"] == {"learnable": 2, "unseen": 3, "no_signal": 1, "never_solved": 2, "always_solved": 2}
    assert [p["prompt_id"] for p in st["top"]] == [pid(3), pid(0), pid(1)]
    rs = (await live.http.get("/v1/runs/first/prompts/stats")).json()
    assert rs["prompts_released"] == ROWS and rs["classes"]["unseen"] == 3 and rs["groups_with_signal"] == 2
    assert (await live.http.get("/v1/runs/nope/prompts/stats")).status_code == 404
    assert (await live.http.get("/v1/datasets/999/prompts/stats")).status_code == 404
    await stop_live(handle)


async def _count_is(js, run, n):
    return await prompts_count(js, run) == n


def _memory_rows(live) -> int:
    with live.ctl.Session() as s:
        return len(list(s.scalars(select(PromptMemory.prompt_id))))


async def _stream(js, run):
    from controller_helpers import stream_prompts

    return await stream_prompts(js, run)
