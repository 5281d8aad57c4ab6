"""Rollout test fixtures."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from rollout_doubles import MCP_SERVER, worker_config

from reward_service.service import RewardService
from shared.contract import bus
from shared.runtime.natsd import free_port


@pytest.fixture
async def reward_service(nats_config, js):
    """The real reward service (maxdigit scorer) answering on jetrl.reward.maxdigit."""
    conn = await bus.connect(nats_config, name="reward-test")
    svc = RewardService(conn, worker_config(nats_config.servers[0]), task="maxdigit")
    await svc.start()
    yield svc
    await svc.stop(drain_s=1)
    await conn.close()


@pytest.fixture
def http_server(tmp_path):
    """The example MCP server over streamable HTTP with a bearer token: (url, token file)."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    port = free_port()
    proc = subprocess.Popen([sys.executable, MCP_SERVER, "http", str(port), str(token)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the HTTP MCP server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", token
    finally:
        proc.kill()
        proc.wait(10)
