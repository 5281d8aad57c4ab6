"""A JetStream cluster of `jetrl nats --cluster` nodes, one per host of a HostNet.

Every node uses the same fixed ports on its own host (client 4222, routes 6222, monitoring 8222: each
host is its own network namespace), the config of docs/deploy.md. `urls` is what every service lists
in `nats.servers`. Clients authenticate as per-service users, as `jetrl up` makes them: every node is
started with the same `users_dir` (one 0600 `<role>.password` per role of shared/runtime/nats_permissions.py under
the cluster's root, scoped to `run`), and `client_config(role)` / `identity(role)` connect a process as
`jetrl-<role>` with only that role's permissions (the controller creates the streams and the weights KV
bucket with `streams.replicas`; every other service binds to them).
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
from shared.runtime.credentials import new_token, write_private
from shared.runtime.nats_permissions import ROLES, user_name

CLIENT_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222
CLI = [sys.executable, "-m", "launcher.cli"]


@dataclass
class NatsCluster:
    net: HostNet
    nodes: dict[str, str]  # server name -> host
    root: Path
    run: str = "*"  # the run the services' users are scoped to ("*" = any run)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return [f"nats://{self.net.addr(h)}:{CLIENT_PORT}" for h in self.nodes.values()]

    @property
    def users_dir(self) -> Path:
        """One password file per role, every node's users (made on first use, 0600 files in a 0700 dir)."""
        d = self.root / "users"
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o700)
        for role in ROLES:
            if not (d / f"{role}.password").is_file():
                write_private(d / f"{role}.password", new_token() + "\n")
        return d

    def identity(self, role: str) -> dict[str, str]:
        """Config overrides ({dotted key: value}) connecting a service as `jetrl-<role>`; every role but the
        controller (and admin) binds to the streams instead of creating them (launcher/up.py's
        nats_identity for `jetrl up`)."""
        out = {"nats.user": user_name(role), "nats.password_file": str(self.users_dir / f"{role}.password")}
        return out if role in ("controller", "admin") else {**out, "streams.manage": "false"}

    def client_config(self, role: str = "admin", **kw) -> NatsConfig:
        """A NatsConfig listing every node, connecting as `role`'s user (admin: every permission)."""
        return NatsConfig(servers=self.urls, user=user_name(role),
                          password_file=str(self.users_dir / f"{role}.password"), **kw)

    def routes(self) -> list[str]:
        return [f"nats://{self.net.addr(h)}:{ROUTE_PORT}" for h in self.nodes.values()]

    def argv(self, name: str) -> list[str]:
        host = self.nodes[name]
        return CLI + ["nats", "--host", self.net.addr(host), "--port", str(CLIENT_PORT),
                      "--monitor-port", str(MONITOR_PORT), "--monitor-host", self.net.addr(host),
                      "--store-dir", str(self.root / name),
                      "--server-name", name, "--cluster", ",".join(self.routes()),
                      "--users-dir", str(self.users_dir), "--run", self.run]

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
