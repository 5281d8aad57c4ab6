"""Helpers for the weight store tests: a live service (in-process uvicorn thread, or a `jetrl weights
serve` subprocess that can be SIGKILLed), raw HTTP requests, and a TCP proxy that cuts a connection."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import torch
import uvicorn

from shared.config import WeightStoreConfig
from shared.runtime.natsd import free_port
from weight_store.server import create_app, http_protocol

REPO = Path(__file__).resolve().parents[2]


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}: {proc.stderr.read().decode()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer in {timeout}s")


class ThreadServer:
    """The real FastAPI app on uvicorn, in a thread of this process, on a free loopback port."""

    def __init__(self, cfg: WeightStoreConfig, http=None):
        self.cfg = cfg
        self.app = create_app(cfg)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=cfg.port, log_level="warning",
                                                    lifespan="off", http=http or http_protocol(), loop="asyncio",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return self.cfg.url

    def start(self) -> ThreadServer:
        self.thread.start()
        wait_http(self.url + "/healthz")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class ProcServer:
    """`python -m launcher.cli weights serve ...` as a child process (SIGKILL-able, restartable)."""

    def __init__(self, cfg: WeightStoreConfig):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return self.cfg.url

    def start(self) -> ProcServer:
        c = self.cfg
        cmd = [sys.executable, "-m", "launcher.cli", "weights", "serve", f"weights.root={c.root}",
               f"weights.port={c.port}", f"weights.token={c.token}", f"weights.keep_last={c.keep_last}",
               f"weights.insecure_no_auth={str(c.insecure_no_auth).lower()}",
               "telemetry.log_level=WARNING"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("JETRL__")}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_http(self.url + "/healthz", proc=self.proc)
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def store_config(root: Path, **kw) -> WeightStoreConfig:
    port = free_port()
    # fanout store: these tests are about the store's own download path; the relay's are
    # tests/weights/test_weights_relay.py and tests/multihost/test_weight_relay.py
    base = dict(url=f"http://127.0.0.1:{port}", root=str(root), port=port, shared_fs=False,
                cache_dir=str(root.parent / f"cache-{port}"), timeout_s=30.0, fanout="store")
    base.update(kw)
    if not base.get("token"):  # tests of everything but auth talk to the store without a token
        base.setdefault("insecure_no_auth", True)
    return WeightStoreConfig(**base)


def state_dict(n: int = 6, rows: int = 256, cols: int = 512, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {f"layers.{i}.weight": torch.randn(rows, cols, generator=g).to(torch.bfloat16) for i in range(n)}
    sd["norm.bias"] = torch.randn(cols, generator=g)
    sd["step"] = torch.tensor(7, dtype=torch.int64)
    return sd


def raw_request(url: str, method: str = "GET", target: str = "/", headers: dict | None = None,
                body: bytes = b"") -> tuple[int, dict, bytes]:
    """One HTTP/1.1 request with the target sent byte for byte (no client-side path normalisation)."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {u.hostname}", "Connection: close",
                 f"Content-Length: {len(body)}", *[f"{k}: {v}" for k, v in (headers or {}).items()]]
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *hl = head.decode("latin-1").split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in hl)}
    return int(status_line.split()[1]), hdrs, rest


class CuttingProxy:
    """Forwards 127.0.0.1 TCP connections to `target_port`; the first connection is cut after
    `cut_after` response bytes. Records each request's head."""

    def __init__(self, target_port: int, cut_after: int):
        self.target_port, self.cut_after = target_port, cut_after
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.heads: list[str] = []
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            limit = self.cut_after if self.connections == 1 else None
            threading.Thread(target=self._serve, args=(client, limit), daemon=True).start()

    def _serve(self, client: socket.socket, limit: int | None) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        head = b""
        while b"\r\n\r\n" not in head:
            head += client.recv(65536)
        self.heads.append(head.decode("latin-1"))
        upstream.sendall(head)
        sent = 0
        try:
            while data := upstream.recv(1 << 16):
                if limit is not None and sent + len(data) >= limit:
                    client.sendall(data[: limit - sent])
                    break  # cut: close both sides mid-body
                client.sendall(data)
                sent += len(data)
        finally:
            upstream.close()
            client.close()

    def close(self) -> None:
        self.sock.close()
