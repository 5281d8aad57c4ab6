"""The dashboard rendered by headless Chromium draws what the API returns: reward curve, staleness, stage
timings, the rollout viewer (DOM checked against the JSON endpoints, screenshot saved to
test-artifacts/controller-dashboard.png). Without /usr/bin/chromium the browser test is skipped on a
developer machine and FAILS in CI (CI=true; .ci/run installs chromium)."""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from ci_gate import unavailable
from controller_helpers import AUTH, TOKEN, run_config, wait_for

from controller import ledger
from shared.contract import bus, codec, subjects
from shared.contract.messages import TRAINER_STAGES, Event, Sample, TrajectoryGroup
from shared.model.tinymodel import build_tokenizer

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def need_chromium() -> None:
    """The dashboard is tested in a real browser."""
    if not CHROMIUM.exists():
        unavailable("/usr/bin/chromium is absent (apt-get install chromium chromium-driver)")


async def chromium(url: str, tmp_path: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,1100",
        "--virtual-time-budget=8000", *args, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError("chromium did not finish in 120 s") from None
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    return out.decode(errors="replace")


def sample(tok, prompt: str, parts: list[tuple[str, int]], reward: float) -> Sample:
    ids = tok.encode(prompt, add_special_tokens=False)
    plen = len(ids)
    mask, vers = [0] * plen, [-1] * plen
    for text, v in parts:  # v = -1: tool output
        t = tok.encode(text, add_special_tokens=False)
        ids, mask, vers = ids + t, mask + [int(v >= 0)] * len(t), vers + [v] * len(t)
    return Sample(tokens=np.array(ids, np.int32), loss_mask=np.array(mask, np.uint8),
                  logprobs=np.zeros(len(ids), np.float32), versions=np.array(vers, np.int32), prompt_len=plen,
                  reward=reward)


def attrs(dom: str, elem_id: str) -> dict[str, str]:
    tag = re.search(rf'<div id="{elem_id}"[^>]*>', dom).group(0)
    return {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', tag)}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_dashboard_draws_what_the_api_returns(live, js, nc, tmp_path):
    need_chromium()
    assert (await live.http.post("/v1/runs", json=run_config("dash", 1, 4), headers=AUTH)).status_code == 201
    for v, reward in enumerate([0.1, 0.3, 0.45, 0.7, 0.8], start=1):
        t = dict.fromkeys(TRAINER_STAGES, 0.0)
        t.update(wait=0.5, forward=0.2 * v, backward=0.4, optimizer=0.1, publish=0.3)
        data = {"version": v, "step": v, "loss": 1.0 / v, "reward_mean": reward, "accuracy": reward * 0.8,
                "groups_with_signal": v, "samples_drawn": 8 * v, "samples_trained": 4 * v,
                "tokens_per_s": 900.0 + 10 * v, "staleness_hist": {"0": 10, "1": v}, "wall_s": sum(t.values()),
                "timings": t, "rollout_timings": {"generate": 1.5, "reward": 0.25, "tools": 0.0, "queue_wait": 2.0}}
        await bus.publish(js, nc, subjects.events("dash", "trainer"),
                          Event(run="dash", service="trainer", kind="step", data=data))
    await bus.publish(js, nc, subjects.events("dash", "rollout"),
                      Event(run="dash", service="rollout", kind="health", data={"status": "ok"}, instance="w0"))
    # prompt memory: three groups released, observed at versions 1 and 4; the trainer says no signal, in
    # a message that tries to inject markup (the banner must show it as text)
    gids = [subjects.group_id("dash", 0, f"feed{i}-{i}") for i in range(3)]
    ledger.reserve(live.ctl.Session, "dash", [
        dict(group_id=g, run_id="dash", enqueue_id=1, epoch=0, prompt_id=f"feed{i}-{i}", row_index=i, seq=i + 1,
             state="released", released_at_version=0, released_at=0.0, updated_at=0.0) for i, g in enumerate(gids)],
        {}, acked_seq=3)
    prompts = [{"group_id": g, "prompt_id": "", "drawn": 4, "successes": k, "reward_mean": k / 4, "signal": 0 < k < 4,
                "version": v} for g, k, v in zip(gids, (0, 2, 4), (1, 4, 4), strict=True)]
    await bus.publish(js, nc, subjects.events("dash", "rollout"), Event(
        run="dash", service="rollout", kind="published", data={"group_ids": gids, "prompts": prompts}))
    await bus.publish(js, nc, subjects.events("dash", "trainer"), Event(
        run="dash", service="trainer", kind="no_signal",
        data={"active": True, "step": 5, "since_step": 3, "groups": 12, "message": "zero advantage <img src=x onerror=alert(1)>"}))
    tok = build_tokenizer()
    for i in range(12):
        parts = [("call(", 4), ("=42", -1), (str(i % 10), 5)] if i % 3 == 0 else [(str(i % 10), 5)]
        g = TrajectoryGroup(run="dash", prompt_id=f"p{i}", epoch=0, worker="w0",
                            samples=[sample(tok, f"max {i} =", parts, float(i % 2)), sample(tok, "max 0 =", [("0", 4)], 0.0)])
        await js.publish(subjects.trajectories("dash"), codec.encode(g))

    async def stored():
        m = (await live.http.get("/v1/runs/dash/metrics", params={"name": "reward_mean"})).json()
        return len(m.get("trainer.reward_mean", [])) == 5

    await wait_for(stored, what="5 reward points stored")

    async def observed():
        st = (await live.http.get("/v1/runs/dash/prompts/stats")).json()
        sig = (await live.http.get("/v1/runs/dash")).json()["signal"]
        return st["prompts_observed"] == 3 and sig["no_signal"]

    await wait_for(observed, what="prompt memory and the no-signal report stored")
    timings = (await live.http.get("/v1/runs/dash/timings", params={"last": 500})).json()
    hist = (await live.http.get("/v1/runs/dash/staleness")).json()
    page = (await live.http.get("/v1/runs/dash/rollouts", params={"limit": 10})).json()

    dom = await chromium(f"{live.url}/?run=dash", tmp_path, "--dump-dom")
    assert "needs its token" in dom and 'data-points="5"' not in dom  # reads need the controller's token
    dom = await chromium(f"{live.url}/?run=dash#token={TOKEN}", tmp_path, "--dump-dom")
    assert 'data-loaded="1"' in dom, dom[:3000]
    # reward curve: the five stored points of both series
    reward = attrs(dom, "chart-reward")
    assert reward["data-points"] == "5" and reward["data-series"] == "trainer.accuracy,trainer.reward_mean"
    chart_html = dom[dom.index('id="chart-reward"'): dom.index('id="chart-staleness"')]
    assert "<canvas" in chart_html and "uplot" in chart_html  # uPlot drew it
    # staleness: one bar per histogram bucket of /staleness
    assert attrs(dom, "chart-staleness")["data-points"] == str(len(hist)) == "2"
    # stage timings: one x per version, a stacked band per stage that took time, totals as the API says
    tm = attrs(dom, "chart-timings")
    assert tm["data-points"] == str(len(timings["versions"])) == "5"
    assert tm["data-stages"].split(",") == [k for k in TRAINER_STAGES if any(timings["trainer"][k])]
    assert json.loads(tm["data-totals"]) == timings["totals"]["trainer"]
    assert "<canvas" in dom[dom.index('id="chart-timings"'): dom.index('id="timings-rollout"')]
    assert re.search(r'data-stage="rollout.generate">1.500<', dom)
    # the viewer: the API's first page, newest first, tool output styled apart, versions per segment
    seqs = re.findall(r'<div class="group" data-group="[^"]+" data-seq="(\d+)"', dom)
    assert [int(x) for x in seqs] == [g["seq"] for g in page["items"]] and len(seqs) == 10
    first = page["items"][0]
    assert first["prompt_id"] == "p11" and 'data-group="dash:0:p11"' in dom
    assert dom.count('data-kind="tool"') == sum(
        1 for g in page["items"] for s in g["samples"] for seg in s["segments"] if seg["kind"] == "tool") > 0
    assert re.search(r'<span class="seg-tool" data-kind="tool" data-version="-1" title="[^"]*">=42</span>', dom)
    assert re.search(r'<span class="seg-policy" data-kind="policy" data-version="5" title="sampled by version 5">', dom)
    assert 'data-run="dash"' in dom and "w0" in dom and "nats connected" in dom
    # the no-signal banner, as text; the solve-rate chart: 12 points (0, ten bins, 1) per version bucket seen
    banner = re.search(r'<div id="signal-banner"[^>]*>(.*?)</div>', dom)
    assert banner and "hidden" not in banner.group(0).split(">")[0], banner
    assert "No learning signal in run dash since step 3: zero advantage &lt;img" in banner.group(1)
    assert "<img src=x" not in dom
    # the diagnosis panel (GET /v1/runs/dash/diagnosis): its state and one row per finding with what to do
    diag = (await live.http.get("/v1/runs/dash/diagnosis")).json()
    assert attrs(dom, "diagnosis")["data-state"] == diag["state"] == "no data"  # nothing was enqueued into "dash"
    assert diag["findings"] and all(f'data-cause="{f["cause"]}"' in dom for f in diag["findings"])
    assert "what to do:" in dom
    solve = attrs(dom, "chart-solve")
    assert solve["data-points"] == "12" and solve["data-series"] == "v1,v4"
    assert "<canvas" in dom[dom.index('id="chart-solve"'): dom.index('id="prompt-classes"')]
    assert re.search(r'data-stat="learnable">1<', dom) and re.search(r'data-stat="never solved">1<', dom)
    assert re.search(r'data-stat="always solved">1<', dom)
    assert attrs(dom, "chart-signal")["data-series"] == \
        "trainer.groups_with_signal,trainer.samples_drawn,trainer.samples_trained"
    assert dom.count("<tr data-prompt=") == 3

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "controller-dashboard.png"
    shot.unlink(missing_ok=True)
    await chromium(f"{live.url}/?run=dash#token={TOKEN}", tmp_path, f"--screenshot={shot}", "--window-size=1400,2200")
    assert shot.exists() and shot.stat().st_size > 10_000
    # the screenshot shows the tool-output colour (#fdf0e0) and the policy colour (#e3f2fd) of the viewer
    from PIL import Image

    px = {c for _, c in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 24)}
    assert (0xFD, 0xF0, 0xE0) in px and (0xE3, 0xF2, 0xFD) in px


async def test_dashboard_assets_are_served_from_the_package(live):
    page = await live.http.get("/")
    assert page.status_code == 200 and "/static/uPlot.iife.min.js" in page.text
    assert "http" not in re.sub(r"<meta[^>]*>", "", page.text.split("<body>")[1])  # no CDN
    js = await live.http.get("/static/uPlot.iife.min.js")
    assert js.status_code == 200 and "uPlot" in js.text
    assert (await live.http.get("/static/app.js")).status_code == 200
