"""A JetStream cluster of `jetrl nats --cluster` nodes, one per host of a HostNet.

Every node uses the same fixed ports on its own host (client 4222, routes 6222, monitoring 8222: each
host is its own network namespace), the config of docs/deploy.md. `urls` is what every service lists
in `nats.servers`, with `token_file` as `nats.token_file` (clients authenticate: every node is started with
the same token, written 0600 under the cluster's root); services then create the streams and the weights
KV bucket with `streams.replicas`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from multihost.netns import HostNet
from shared.config import NatsConfig
from shared.credentials import new_token, write_private

CLIENT_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222
CLI = [sys.executable, "-m", "launcher.cli"]


@dataclass
class NatsCluster:
    net: HostNet
    nodes: dict[str, str]  # server name -> host
    root: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return [f"nats://{self.net.addr(h)}:{CLIENT_PORT}" for h in self.nodes.values()]

    @property
    def token_file(self) -> Path:
        """The client token every node requires (made on first use, mode 0600)."""
        path = self.root / "nats.token"
        if not path.is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            write_private(path, new_token() + "\n")
        return path

    def client_config(self, **kw) -> NatsConfig:
        """A NatsConfig listing every node, with the cluster's token."""
        return NatsConfig(servers=self.urls, token_file=str(self.token_file), **kw)

    def routes(self) -> list[str]:
        return [f"nats://{self.net.addr(h)}:{ROUTE_PORT}" for h in self.nodes.values()]

    def argv(self, name: str) -> list[str]:
        host = self.nodes[name]
        return CLI + ["nats", "--host", self.net.addr(host), "--port", str(CLIENT_PORT),
                      "--monitor-port", str(MONITOR_PORT), "--store-dir", str(self.root / name),
                      "--server-name", name, "--cluster", ",".join(self.routes()),
                      "--token-file", str(self.token_file)]

    def start(self, name: str) -> subprocess.Popen:
        """Start (or start again, on its store dir) node `name` on its host."""
        self.root.mkdir(parents=True, exist_ok=True)
        proc = self.net.spawn(self.nodes[name], self.argv(name), log=self.root / f"{name}.log")
        self.procs[name] = proc
        return proc

    def start_all(self, timeout_s: float = 60.0) -> NatsCluster:
        for name in self.nodes:
            self.start(name)
        self.wait_ready(timeout_s)
        return self

    def jsz(self, name: str) -> dict:
        url = f"http://{self.net.addr(self.nodes[name])}:{MONITOR_PORT}/jsz"
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())

    def wait_ready(self, timeout_s: float = 60.0, names: list[str] | None = None) -> None:
        """Until every node (of `names`) answers /healthz and sees a meta leader of the full cluster."""
        deadline = time.monotonic() + timeout_s
        pending = list(names or self.nodes)
        last = ""
        while pending and time.monotonic() < deadline:
            name = pending[0]
            try:
                meta = self.jsz(name).get("meta_cluster") or {}
                ok = meta.get("leader") and meta.get("cluster_size") == len(self.nodes)
                url = f"http://{self.net.addr(self.nodes[name])}:{MONITOR_PORT}/healthz"
                with urllib.request.urlopen(url, timeout=2) as r:
                    ok = ok and r.status == 200
                if ok:
                    pending.pop(0)
                    continue
                last = f"{name}: meta {meta}"
            except Exception as exc:  # not up yet
                last = f"{name}: {exc}"
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                tail = (self.root / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"nats node {name} exited with {proc.returncode}:\n{tail}")
            time.sleep(0.2)
        if pending:
            raise TimeoutError(f"NATS cluster not ready in {timeout_s:.0f}s ({last})")
