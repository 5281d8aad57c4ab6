"""The NATS cluster config docs/deploy.md shows is the one `jetrl nats --cluster` writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.runtime.natsd import EmbeddedNats

DOC = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def test_the_documented_cluster_config_is_what_jetrl_nats_writes():
    text = DOC.read_text()
    block = re.search(r"```\n(server_name: n1\n.*?)```", text, re.S).group(1)
    node = EmbeddedNats("/data", port=4222, host="0.0.0.0", monitor_port=8222, server_name="n1",
                        routes=["nats://n1:6222", "nats://n2:6222", "nats://n3:6222"])
    assert node.config_text() == block
    assert "--server-name n1 --cluster nats://n1:6222,nats://n2:6222,nats://n3:6222" in text


def test_a_cluster_node_without_a_name_is_refused():
    with pytest.raises(ValueError, match="server_name"):
        EmbeddedNats(routes=["nats://a:6222"])


def test_jetrl_nats_refuses_a_cluster_without_a_server_name(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "launcher.cli", "nats", "--store-dir", str(tmp_path), "--cluster",
                        "nats://a:6222,nats://b:6222", "--insecure-no-auth"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "server_name" in r.stderr and "--server-name" in r.stderr
