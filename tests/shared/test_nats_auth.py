"""NATS authentication end to end, against real nats-server processes:
- the controller's embedded server requires nats.user/password (anonymous clients are refused) and stops
  with the controller on SIGTERM (it used to run on, orphaned);
- `jetrl nats` takes its secrets from files, never from its command line, and writes its config 0600;
- bus.connect authenticates with a token, an nkey, a .creds file (operator/account/user JWTs made here)
  and mutual TLS (a throwaway CA made here with openssl), each against a server configured for it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import pytest
import yaml
from ci_gate import need_module, unavailable

from shared.config import NatsConfig
from shared.contract import bus
from shared.runtime.natsd import free_port, nats_server_binary

SECRET = "pw-" + secrets.token_hex(16)


def pids_with(text: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if text.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def refused(url: str, **kw) -> bool:
    try:
        nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3, **kw)
    except Exception:
        return True
    await nc.close()
    return False


async def roundtrip(cfg: NatsConfig) -> None:
    nc = await asyncio.wait_for(bus.connect(cfg, name="auth-test"), 15)
    try:
        sub = await nc.subscribe("auth.test")
        await bus.flush(nc)
        await nc.publish("auth.test", b"ping")
        msg = await sub.next_msg(timeout=5)
        assert msg.data == b"ping"
    finally:
        await nc.close()


def private_file(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


async def test_embedded_server_of_the_controller_requires_credentials_and_stops_with_it(tmp_path):
    port, nport = free_port(), free_port()
    store = tmp_path / "nats-store"
    cfg = {"nats": {"embedded": True, "port": nport, "store_dir": str(store), "user": "jetrl",
                    "password_file": private_file(tmp_path / "nats.pw", SECRET)},
           "telemetry": {"log_level": "WARNING"},
           "controller": {"db_url": f"sqlite:///{tmp_path / 'c.db'}", "data_dir": str(tmp_path / "d"), "port": port,
                          "token_file": private_file(tmp_path / "ctl.token", "t-" + secrets.token_hex(16))}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    log = open(tmp_path / "controller.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "controller", "-c", str(tmp_path / "c.yaml")],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "controller.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).json()["nats"] == "connected":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "controller did not start"
            time.sleep(0.2)
        url = f"nats://127.0.0.1:{nport}"
        assert await refused(url)  # anonymous
        assert await refused(url, user="jetrl", password="wrong")
        await roundtrip(NatsConfig(servers=[url], user="jetrl", password_file=str(tmp_path / "nats.pw")))
        server_pids = pids_with(str(store))
        assert server_pids, "no nats-server process found"
        conf = store / "nats-server.conf"
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600 and SECRET in conf.read_text()
        for pid in [proc.pid, *server_pids]:  # the password is on no command line
            assert SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        deadline = time.monotonic() + 15
        while pids_with(str(store)):
            assert time.monotonic() < deadline, "the embedded nats-server outlived the controller"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_all(pids_with(str(store)))
        log.close()


async def test_jetrl_nats_takes_secrets_from_files_and_refuses_to_run_open(tmp_path):
    port = free_port()
    store = tmp_path / "store"
    no_auth = subprocess.run([sys.executable, "-m", "launcher.cli", "nats", "--port", str(port), "--store-dir",
                              str(store)], capture_output=True, text=True, timeout=60)
    assert no_auth.returncode == 2 and "nats.user" in no_auth.stderr and "insecure_no_auth" in no_auth.stderr
    pw = private_file(tmp_path / "pw", SECRET)
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "nats", "--port", str(port), "--store-dir",
                             str(store), "--user", "u", "--password-file", pw], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("nats-server nats://") and "user/password auth" in line, line
        url = f"nats://127.0.0.1:{port}"
        assert await refused(url)
        await roundtrip(NatsConfig(servers=[url], user="u", password=SECRET))
        for pid in [proc.pid, *pids_with(str(store))]:
            assert SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert stat.S_IMODE((store / "nats-server.conf").stat().st_mode) == 0o600
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        kill_all(pids_with(str(store)))


class Server:
    """A nats-server with a given config body, on a free port."""

    def __init__(self, tmp_path: Path, body: str, scheme: str = "nats"):
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        conf = tmp_path / f"server-{self.port}.conf"
        conf.write_text(f"listen: 127.0.0.1:{self.port}\n{body}\n")
        self.proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while True:
            assert self.proc.poll() is None, self.proc.stderr.read().decode()[-2000:]
            try:
                import socket

                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not listen"
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def server(tmp_path):
    started: list[Server] = []

    def make(body: str, scheme: str = "nats") -> Server:
        s = Server(tmp_path, body, scheme)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


async def test_token_auth(server, tmp_path):
    token = "tok-" + secrets.token_hex(16)
    srv = server(f'authorization {{ token: "{token}" }}')
    assert await refused(srv.url)
    await roundtrip(NatsConfig(servers=[srv.url], token_file=private_file(tmp_path / "tok", token)))
    await roundtrip(NatsConfig(servers=[srv.url], token=token))


def _keypair(prefix: int):
    nkeys = need_module("nkeys", "dev extra: pip install -e .[dev]")
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    kp = nkeys.from_seed(bytearray(seed))
    return seed.decode(), kp.public_key.decode(), kp


async def test_nkey_auth(server, tmp_path):
    nkeys = need_module("nkeys", "dev extra: pip install -e .[dev]")
    seed, public, _ = _keypair(nkeys.PREFIX_BYTE_USER)
    srv = server(f"authorization {{ users: [ {{ nkey: {public} }} ] }}")
    assert await refused(srv.url)
    await roundtrip(NatsConfig(servers=[srv.url], nkey_seed_file=private_file(tmp_path / "user.nk", seed + "\n")))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt(claims: dict, issuer_kp) -> str:
    """A NATS JWT (alg ed25519-nkey) signed by the issuer's nkey."""
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    claims = {"jti": base64.b32encode(os.urandom(20)).decode().rstrip("="), "iat": int(time.time()), **claims}
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(issuer_kp.sign(f'{head}.{body}'.encode()))}"


async def test_creds_file_auth_with_operator_account_and_user_jwts(server, tmp_path):
    nkeys = need_module("nkeys", "dev extra: pip install -e .[dev]")
    _, op_pub, op_kp = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    _, acc_pub, acc_kp = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user_seed, user_pub, _ = _keypair(nkeys.PREFIX_BYTE_USER)
    limits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1,
              "leaf": -1}
    op_jwt = _jwt({"iss": op_pub, "sub": op_pub, "name": "op", "nats": {"type": "operator", "version": 2}}, op_kp)
    acc_jwt = _jwt({"iss": op_pub, "sub": acc_pub, "name": "jetrl",
                    "nats": {"type": "account", "version": 2, "limits": limits}}, op_kp)
    user_jwt = _jwt({"iss": acc_pub, "sub": user_pub, "name": "trainer",
                     "nats": {"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1,
                              "payload": -1}}, acc_kp)
    srv = server(f"operator: {op_jwt}\nresolver: MEMORY\nresolver_preload: {{ {acc_pub}: {acc_jwt} }}")
    creds = private_file(tmp_path / "user.creds", (
        f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{user_seed}\n------END USER NKEY SEED------\n"))
    assert await refused(srv.url)
    await roundtrip(NatsConfig(servers=[srv.url], creds_file=creds))


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


async def test_mutual_tls(server, tmp_path):
    if shutil.which("openssl") is None:
        unavailable("openssl is not installed (apt-get install openssl)")
    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=jetrl-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=jetrl-{name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", "san.ext", cwd=d)
    srv = server(f'tls {{ cert_file: "{d}/server.pem", key_file: "{d}/server.key", ca_file: "{d}/ca.pem", '
                 f"verify: true, timeout: 5 }}", scheme="tls")
    assert await refused(srv.url.replace("tls://", "nats://"))  # no TLS
    import ssl

    no_cert = ssl.create_default_context(cafile=str(d / "ca.pem"))
    assert await refused(srv.url, tls=no_cert)  # TLS without a client certificate
    await roundtrip(NatsConfig(servers=[srv.url], tls_ca=str(d / "ca.pem"), tls_cert=str(d / "client.pem"),
                               tls_key=str(d / "client.key")))
