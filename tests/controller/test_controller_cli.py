"""`jetrl enqueue` and `jetrl status` as clients of a live controller."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
import yaml
from controller_helpers import TOKEN, maxdigit_rows, prompts_count, run_config, wait_for, write_jsonl


async def jetrl(*args: str, token: str = TOKEN) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "launcher.cli", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "JETRL_TOKEN": token})
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_enqueue_file_and_hf_then_status(live, js, tmp_path):
    data = write_jsonl(tmp_path / "m.jsonl", maxdigit_rows(7))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(run_config("cli1", 10, 10)))
    rc, out = await jetrl("enqueue", data, "--run", "cli1", "--create", str(cfg), "--url", live.url, "--epochs", "2")
    assert rc == 0, out
    assert "run cli1: created" in out and "7 rows" in out and "14 prompts" in out
    await wait_for(lambda: _count(js, "cli1", 14), what="14 prompts")
    # the same data through the datasets library is the same dataset; a second enqueue adds epochs 2..2
    live.ctl.ccfg.path_roots = [str(tmp_path)]  # server-side files are read only under path_roots
    rc, out = await jetrl("enqueue", "hf:json", "--data-files", data, "--run", "cli1", "--url", live.url)
    assert rc == 0, out
    assert "already registered" in out and "epochs 2..2" in out
    rc, out = await jetrl("status", "cli1", "--url", live.url)
    assert rc == 0, out
    assert "cli1: running" in out and "enqueued 21" in out
    rc, out = await jetrl("status", "--url", live.url, "--json")
    assert rc == 0 and json.loads(out)["runs"][0]["id"] == "cli1"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_enqueue_reports_bad_rows_and_auth_errors(live, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "reference": "1"}\n{"prompt": 3, "reference": "1"}\n')
    rc, out = await jetrl("enqueue", str(bad), "--run", "x", "--url", live.url)
    assert rc == 1 and "error 422: line 2" in out and "must be a string" in out
    good = write_jsonl(tmp_path / "g.jsonl", maxdigit_rows(2))
    rc, out = await jetrl("enqueue", good, "--run", "x", "--url", live.url, token="wrong")
    assert rc == 1 and "error 401" in out
    rc, out = await jetrl("enqueue", good, "--run", "nope", "--url", live.url)
    assert rc == 1 and "error 404: run 'nope' not found" in out


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_status_warns_while_the_trainer_reports_no_learning_signal(live, nc, js):
    from shared.contract import bus, subjects
    from shared.contract.messages import Event

    assert (await live.http.post("/v1/runs", json=run_config("ns1", 1, 4))).status_code == 201

    async def say(step, active, message):
        data = {"active": active, "step": step, "since_step": 12, "groups": 32, "message": message}
        await bus.publish(js, nc, subjects.events("ns1", "trainer"),
                          Event(run="ns1", service="trainer", kind="no_signal", data=data))
        await wait_for(lambda: _signal_is(live, active), what=f"no_signal {active}")

    await say(20, True, "8 steps trained only zero-advantage groups\x1b[2J")
    rc, out = await jetrl("status", "ns1", "--url", live.url)
    assert rc == 0 and "WARNING: no learning signal since step 12 (step 20): 8 steps trained only zero-advantage " \
        "groups" in out and "\x1b" not in out
    sig = (await live.http.get("/v1/runs/ns1")).json()["signal"]
    assert sig["no_signal"] and sig["since_step"] == 12 and sig["message"].endswith("groups [2J")
    await say(25, False, "signal is back")
    rc, out = await jetrl("status", "ns1", "--url", live.url)
    assert rc == 0 and "WARNING" not in out


async def _signal_is(live, active):
    return (await live.http.get("/v1/runs/ns1")).json()["signal"]["no_signal"] is active


async def _count(js, run, n):
    return await prompts_count(js, run) == n
