"""The dashboard rendered by headless Chromium draws curves from stored metrics (DOM checked, screenshot
saved to test-artifacts/controller-dashboard.png)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from controller_helpers import AUTH, TOKEN, run_config, wait_for

from shared import bus, subjects
from shared.messages import Event

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


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


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium chromium-driver)")
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_dashboard_draws_reward_curve_from_stored_metrics(live, js, nc, tmp_path):
    assert (await live.http.post("/v1/runs", json=run_config("dash", 1, 4), headers=AUTH)).status_code == 201
    for v, reward in enumerate([0.1, 0.3, 0.45, 0.7, 0.8], start=1):
        data = {"version": v, "step": v, "loss": 1.0 / v, "reward_mean": reward, "accuracy": reward * 0.8,
                "tokens_per_s": 900.0 + 10 * v, "staleness_hist": {"0": 10, "1": v}}
        await bus.publish(js, nc, subjects.events("dash", "trainer"),
                          Event(run="dash", service="trainer", kind="step", data=data))
    await bus.publish(js, nc, subjects.events("dash", "rollout"),
                      Event(run="dash", service="rollout", kind="health", data={"status": "ok"}, instance="w0"))

    async def stored():
        m = (await live.http.get("/v1/runs/dash/metrics", params={"name": "reward_mean"})).json()
        return len(m.get("trainer.reward_mean", [])) == 5

    await wait_for(stored, what="5 reward points stored")

    dom = await chromium(f"{live.url}/?run=dash", tmp_path, "--dump-dom")
    assert "needs its token" in dom and 'data-points="5"' not in dom  # reads need the controller's token
    dom = await chromium(f"{live.url}/?run=dash#token={TOKEN}", tmp_path, "--dump-dom")
    assert 'data-loaded="1"' in dom, dom[:3000]
    reward = re.search(r'<div id="chart-reward"[^>]*>', dom).group(0)
    assert 'data-points="5"' in reward and "trainer.reward_mean" in reward and "trainer.accuracy" in reward
    chart_html = dom[dom.index('id="chart-reward"'): dom.index('id="chart-staleness"')]
    assert "<canvas" in chart_html and "uplot" in chart_html  # uPlot drew it
    stale = re.search(r'<div id="chart-staleness"[^>]*>', dom).group(0)
    assert 'data-points="2"' in stale
    assert 'data-run="dash"' in dom and "w0" in dom and "nats connected" in dom

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "controller-dashboard.png"
    shot.unlink(missing_ok=True)
    await chromium(f"{live.url}/?run=dash#token={TOKEN}", tmp_path, f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 10_000


async def test_dashboard_assets_are_served_from_the_package(live):
    page = await live.http.get("/")
    assert page.status_code == 200 and "/static/uPlot.iife.min.js" in page.text
    assert "http" not in re.sub(r"<meta[^>]*>", "", page.text.split("<body>")[1])  # no CDN
    js = await live.http.get("/static/uPlot.iife.min.js")
    assert js.status_code == 200 and "uPlot" in js.text
    assert (await live.http.get("/static/app.js")).status_code == 200
