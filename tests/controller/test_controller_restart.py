"""A real `jetrl controller` process killed with SIGKILL mid-release and restarted: every prompt is
released exactly once (JetStream holds each group id once, the ledger counts them once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml
from controller_helpers import (
    AUTH,
    TOKEN,
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

from controller import ledger
from controller.db import RELEASED, Run, open_database
from controller.release import prompt_id_for
from shared.contract import bus, codec, subjects
from shared.contract.messages import PromptTask, WeightVersion
from shared.runtime.natsd import free_port

ROWS = 240


def start_controller(cfg_path, log_path) -> subprocess.Popen:
    logf = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "launcher.cli", "controller", "-c", str(cfg_path)],
                                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        logf.close()


async def wait_up(url, proc, log_path):
    async def up():
        assert proc.poll() is None, f"controller exited: {log_path.read_text()[-3000:]}"
        try:
            async with httpx.AsyncClient() as c:
                h = (await c.get(f"{url}/v1/health", timeout=2)).json()
                return h["nats"] == "connected"
        except httpx.HTTPError:
            return False

    await wait_for(up, timeout=60, what="controller subprocess up", interval=0.2)


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


@pytest.mark.slow
async def test_sigkill_mid_release_loses_nothing_and_repeats_nothing(tmp_path, nats_server, js, db_url):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = {"nats": {"servers": [nats_server.url], "reconnect_wait_s": 0.1},
           "telemetry": {"log_level": "WARNING"},
           "controller": {"db_url": db_url, "data_dir": str(tmp_path / "data"), "port": port, "token": TOKEN,
                          "release_rate": 60.0, "release_batch": 8, "poll_interval_s": 0.2}}
    cfg_path = tmp_path / "controller.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    log_path = tmp_path / "controller.log"
    data = tmp_path / "rows.jsonl"
    write_jsonl(data, maxdigit_rows(ROWS))

    proc = start_controller(cfg_path, log_path)
    try:
        await wait_up(url, proc, log_path)
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as c:
            with open(data, "rb") as f:
                d = (await c.post("/v1/datasets", files={"file": ("rows.jsonl", f)})).json()
            assert (await c.post("/v1/runs", json=run_config("k1", 0, 10_000))).status_code == 201
            assert (await c.post("/v1/runs/k1/enqueues", json={"dataset": d["content_hash"], "shuffle_seed": 3}))\
                .status_code == 201
        seen = []
        for stop_at in (40, 120):  # two crashes, both while prompts are flowing
            await wait_for(lambda n=stop_at: _at_least(js, n), timeout=60, what=f"{stop_at} prompts released")
            kill(proc)
            seen.append(await prompts_count(js, "k1"))
            assert seen[-1] < ROWS, "killed after the release finished: not mid-release"
            proc = start_controller(cfg_path, log_path)
            await wait_up(url, proc, log_path)
        await wait_for(lambda: _at_least(js, ROWS), timeout=60, what="all prompts released after restarts")
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as c:
            async def done():
                lg = (await c.get("/v1/runs/k1/ledger")).json()
                return lg if lg["released"] == ROWS and lg["enqueued"] == ROWS else None

            lg = await wait_for(done, timeout=30, what="ledger complete")
        assert lg["balanced"] and lg["in_flight"] == ROWS
        msgs = await stream_prompts(js, "k1")
        ids = [mid for mid, _ in msgs]
        assert len(ids) == ROWS, f"{len(ids)} messages in the stream for {ROWS} prompts (kills at {seen})"
        want = {subjects.group_id("k1", 0, f"{d['content_hash'][:12]}-{i}") for i in range(ROWS)}
        assert set(ids) == want
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                kill(proc)


async def _at_least(js, n):
    return await prompts_count(js, "k1") >= n


async def test_rows_written_but_not_acked_before_a_crash_are_published_once_on_restart(
        tmp_path, nats_config, nc, js, db_url):
    """The crash window itself, made deterministic: ledger rows committed, one of them published, the
    watermark not advanced (the process died there). The next controller publishes each exactly once."""
    cfg = make_config(tmp_path, nats_config, db_url)
    handle = await start_live(cfg)
    live = handle[0]
    data = tmp_path / "rows.jsonl"
    write_jsonl(data, maxdigit_rows(10))
    with open(data, "rb") as f:
        d = (await live.http.post("/v1/datasets", files={"file": ("rows.jsonl", f)}, headers=AUTH)).json()
    await live.http.post("/v1/runs", json=run_config("c1", 0, 4), headers=AUTH)
    enq = (await live.http.post("/v1/runs/c1/enqueues", json={"dataset": d["name"]}, headers=AUTH)).json()
    await wait_for(lambda: _count_is(js, "c1", 4), what="first 4 prompts")
    await wait_for(lambda: _published_seq(live, "c1", 4), what="watermark at 4")
    await stop_live(handle)

    # what a controller that died mid-batch leaves behind: rows 5 and 6 committed, only row 5 published
    now = time.time()
    rows = []
    for seq, idx in ((5, 4), (6, 5)):
        pid = prompt_id_for(d["content_hash"], idx)
        rows.append(dict(group_id=subjects.group_id("c1", 0, pid), run_id="c1", enqueue_id=enq["id"], epoch=0,
                         prompt_id=pid, row_index=idx, seq=seq, state=RELEASED, released_at_version=0,
                         released_at=now, updated_at=now))
    _, Session_ = open_database(db_url)
    ledger.reserve(Session_, "c1", rows, {enq["id"]: 6}, acked_seq=4)
    task = PromptTask(run="c1", prompt_id=rows[0]["prompt_id"], epoch=0, payload={"prompt": "x"})
    await bus.publish(js, nc, subjects.prompts("c1"), task, msg_id=rows[0]["group_id"])
    assert await prompts_count(js, "c1") == 5

    # announce_version writes a bare WeightVersion with no weight store behind it: this test is about the
    # ledger (test_controller_admission checks announcements against a real store)
    handle = await start_live(make_config(tmp_path, nats_config, db_url, verify_weights=False))
    live = handle[0]
    try:
        await wait_for(lambda: _published_seq(live, "c1", 6), what="unacked rows republished")
        ids = [mid for mid, _ in await stream_prompts(js, "c1")]
        assert len(ids) == len(set(ids)) == 6
        assert {r["group_id"] for r in rows} <= set(ids)
        lg = (await live.http.get("/v1/runs/c1/ledger")).json()
        assert lg["released"] == 6 and lg["outstanding"] == 6  # over the bound of 4: nothing new went out
        await announce_version(js, "c1", 1)  # bound 8: exactly 2 more
        await wait_for(lambda: _count_is(js, "c1", 8), what="8 prompts after version 1")
        ids = [mid for mid, _ in await stream_prompts(js, "c1")]
        assert len(ids) == len(set(ids)) == 8
    finally:
        await stop_live(handle)


async def _count_is(js, run, n):
    return await prompts_count(js, run) == n


async def _published_seq(live, run, n):
    with live.ctl.Session() as s:
        return s.get(Run, run).published_seq == n


async def announce_version(js, run, version):
    kv = await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    await kv.put(run, codec.encode(WeightVersion(run=run, version=version, step=version)))
