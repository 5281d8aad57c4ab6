"""`jetrl up` for real: every service starts and reports healthy, a SIGKILLed child is restarted, and a
stop ends every child by itself (SIGTERM, no SIGKILL needed)."""

import os
import signal
import stat

import httpx
import nats
import pytest

from launcher.plan import UpOptions
from launcher.up import Launcher, poll_until
from shared.config import JetrlConfig, load_config

pytestmark = pytest.mark.slow


async def test_up_starts_restarts_and_stops_every_service(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("run: life\nnats: {embedded: true}\ntelemetry: {events_interval_s: 1.0}\nreward: {task: maxdigit}\n"
                 "rollout: {sampling: {max_new_tokens: 1}}\n")
    cfg = load_config(JetrlConfig, str(p), [])
    launcher = Launcher(cfg, UpOptions(run_dir=tmp_path / "run", echo_logs=False))
    try:
        await launcher.start(timeout_s=180)

        async def healthy():
            snap = await launcher.poll()
            seen = {s["service"] for s in (snap.get("health") or {}).get("services", [])
                    if s["run"] == "life" and s["alive"]}
            running = all(c["running"] for c in snap["children"].values())
            version = (snap.get("run") or {}).get("current_version", -1)
            return running and {"rollout", "trainer"} <= seen and version >= 0 and snap

        snap = await poll_until(healthy, 240, "every child running, rollout and trainer healthy, version 0")
        assert set(snap["children"]) == {"nats", "controller", "weights", "reward", "rollout", "trainer"}
        await _everything_needs_the_runs_credentials(launcher)

        old_pid = snap["children"]["rollout"]["pid"]
        launcher.sup.kill("rollout", signal.SIGKILL)

        async def restarted():
            st = launcher.sup.status()["rollout"]
            return st["running"] and st["restarts"] >= 1 and st["pid"] != old_pid

        await poll_until(restarted, 120, "the killed rollout worker to be restarted")
        assert launcher.sup.status()["rollout"]["last_exit"] == -signal.SIGKILL
    finally:
        await launcher.stop()
    logs = {name: (tmp_path / "run" / "logs" / f"{name}.log").read_text() for name in launcher.sup.children}
    for name, c in launcher.sup.children.items():
        assert c.proc.returncode is not None, name
        assert "did not stop" not in logs[name], f"{name} had to be killed"


async def _everything_needs_the_runs_credentials(launcher: Launcher) -> None:
    """Authenticated by default: the run's generated credentials are in 0600 files, the config
    and the command lines hold none of them, and an anonymous client gets nowhere."""
    r = launcher.resolved
    secret_files = [r.controller.token_file, r.weights.token_file, r.nats.password_file]
    assert all(secret_files) and r.nats.user
    secrets = [open(f).read().strip() for f in secret_files]
    for f in [*secret_files, launcher.config_file]:
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
    text = launcher.config_file.read_text()
    argvs = " ".join(" ".join(c.spec.argv) for c in launcher.sup.children.values())
    for secret in secrets:
        assert len(secret) >= 32 and secret not in text and secret not in argvs
    async with httpx.AsyncClient() as anon:
        assert (await anon.get(f"{r.controller.url}/v1/runs")).status_code == 401
        assert (await anon.get(f"{r.weights.url}/v1/runs")).status_code == 401
    with pytest.raises(Exception):  # noqa: B017 - nats-py raises its own error types for a refused login
        nc = await nats.connect(r.nats.servers[0], allow_reconnect=False, max_reconnect_attempts=0,
                                connect_timeout=2)
        await nc.close()
