"""`jetrl up --online` for real: the policy served to outside traffic by `jetrl serve-policy` (the tiny policy
in the local engine), sessions opened and answered over the real openai client, rewarded later, grouped by
the caller's key, and trained by the real trainer (its version moves), with no dataset and no rollout
worker."""

import os
import socket

import httpx
import openai
import pytest

from launcher.plan import UpOptions
from launcher.up import Launcher, poll_until
from shared.config import JetrlConfig, load_config

pytestmark = pytest.mark.slow
KEY = "k" * 24 + "-online-app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_up_online_trains_on_sessions_rewarded_later(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "webapp.key").write_text(KEY + "\n")
    os.chmod(keys / "webapp.key", 0o600)
    port = free_port()
    p = tmp_path / "c.yaml"
    p.write_text("run: onl\nnats: {embedded: true}\ntelemetry: {events_interval_s: 1.0}\n"
                 "schedule: {batch_size: 2, total_steps: 2, max_staleness: 8}\n"
                 f"rollout: {{sampling: {{max_new_tokens: 6}}, agent: {{port: {port}}}, "
                 f"online: {{keys_dir: {keys}, group_size: 2}}}}\n")
    cfg = load_config(JetrlConfig, str(p), [])
    launcher = Launcher(cfg, UpOptions(run_dir=tmp_path / "run", workers=0, online=True, echo_logs=False))
    url = f"http://127.0.0.1:{port}"
    try:
        await launcher.start(timeout_s=180)
        assert "rollout" not in launcher.sup.children and "serve-policy" in launcher.sup.children

        async def serving():
            try:
                async with httpx.AsyncClient() as h:
                    return (await h.get(f"{url}/health", timeout=2)).status_code == 200
            except httpx.HTTPError:
                return False

        await poll_until(serving, 180, "the online endpoint")
        auth = {"Authorization": f"Bearer {KEY}"}
        published = []
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60) as http:
            for q in range(4):  # four questions, two answers each: four groups, two steps of two groups
                sessions = [(await http.post("/v1/sessions", json={"group": f"q{q}"})).json() for _ in range(2)]
                for s in sessions:
                    client = openai.AsyncOpenAI(base_url=s["base_url"], api_key=KEY, max_retries=0)
                    r = await client.chat.completions.create(
                        model="policy", messages=[{"role": "user", "content": f"question {q}"}])
                    await client.close()
                    assert r.choices[0].finish_reason in ("stop", "length")
                for s, reward in zip(sessions, (1.0, 0.0), strict=True):
                    r = await http.post(f"/sessions/{s['id']}/reward", json={"reward": reward})
                    assert r.status_code == 200, r.text
                published.append(r.json()["published"])
        assert all(g and g.startswith("onl:0:online-webapp-") for g in published)

        async def trained():
            snap = await launcher.poll()
            return (snap.get("run") or {}).get("current_version", -1) >= 2 and snap

        await poll_until(trained, 240, "two trainer steps on the rewarded sessions")
    finally:
        await launcher.stop()
    log = (tmp_path / "run" / "logs" / "serve-policy.log").read_text()
    assert "online endpoint on" in log
