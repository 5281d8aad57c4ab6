"""The controller as an attacker meets it: no host file is readable through the dataset
routes, no YAML expands or loops, no run id hides a newline, no body is read before the token is
checked, no read is open, and no secret of a run config lands in the database (which is 0600)."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from ci_gate import need_module
from controller_helpers import AUTH, TOKEN, run_config, write_jsonl

from shared.contract.subjects import check_run_id

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
HOST_FILE = "/etc/passwd"  # exists on every Linux host


@SQLITE
async def test_hf_route_reads_no_file_outside_path_roots(live, tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    live.ctl.ccfg.path_roots = [str(allowed)]
    mapping = {"prompt": "text", "reference": ""}
    for body in ({"name": "text", "data_files": [HOST_FILE]},  # the builder reading any file
                 {"name": "json", "data_files": [str(allowed / ".." / "x.jsonl")]},
                 {"name": "/etc"},  # a local dataset dir
                 {"name": "text", "data_files": ["relative.txt"]}):
        r = await live.http.post("/v1/datasets/hf", json={**body, "mapping": mapping})
        assert r.status_code == 403, (body, r.text)
        assert "path_roots" in r.json()["detail"]
    r = await live.http.post("/v1/datasets/hf", json={"name": "openai/gsm8k", "data_files": ["../../etc/passwd"]})
    assert r.status_code == 422 and "relative path inside the dataset repo" in r.json()["detail"]
    r = await live.http.post("/v1/datasets/hf", json={"name": "text"})
    assert r.status_code == 422 and "data_files" in r.json()["detail"]
    assert (await live.http.get("/v1/datasets")).json() == []  # nothing was registered
    # inside the roots the builder works as before
    good = write_jsonl(allowed / "ok.jsonl", [{"q": "max 1 2 =", "a": "2"}])
    need_module("datasets", "jetrl[datasets]")
    r = await live.http.post("/v1/datasets/hf", json={"name": "json", "data_files": [good],
                                                      "mapping": {"prompt": "q", "reference": "a"}})
    assert r.status_code == 201, r.text


@SQLITE
async def test_path_route_does_not_tell_whether_a_host_file_exists(live, tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "link.jsonl").symlink_to(HOST_FILE)
    answers = []
    for roots in ([], [str(allowed)]):
        live.ctl.ccfg.path_roots = roots
        for path in (HOST_FILE, "/etc/no-such-file-here", str(allowed / "link.jsonl"), "/etc/shadow"):
            r = await live.http.post("/v1/datasets/path", json={"path": path})
            assert r.status_code == 403, (roots, path, r.text)
            detail = r.json()["detail"].replace(repr(path), "PATH")
            assert "/etc/passwd" not in detail and not r.json()["errors"]  # no line numbers, no target
            answers.append((tuple(roots), detail))
    for roots in ([], [str(allowed)]):
        assert len({d for r, d in answers if r == tuple(roots)}) == 1  # the same answer for every path


@SQLITE
async def test_yaml_aliases_are_refused_with_a_clear_4xx(live):
    levels = ["a: &a [x, x, x, x, x, x, x, x]"]
    for i in range(1, 6):  # 8^6 = 262,144 strings from ~300 bytes (the issue's 9-level one was 600 MB)
        prev = chr(ord("a") + i - 1)
        levels.append(f"{chr(ord('a') + i)}: &{chr(ord('a') + i)} [{', '.join(['*' + prev] * 8)}]")
    bomb = "run: bomb\nrollout:\n  workflow_args:\n" + "".join(f"    {line}\n" for line in levels)
    loop = "run: loop\nrollout:\n  workflow_args:\n    a: &a [*a]\n"
    for text in (bomb, loop, "run: &r merge\nschedule: {<<: *r}\n"):
        r = await live.http.post("/v1/runs", content=text, headers={"Content-Type": "application/yaml"})
        assert r.status_code == 400, r.text[:300]
        assert "aliases" in r.json()["detail"]
    deep = "run: deep\nrollout:\n  workflow_args:\n    a: " + "[" * 50 + "]" * 50 + "\n"
    r = await live.http.post("/v1/runs", content=deep, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 422 and "nested deeper" in r.json()["detail"]
    r = await live.http.post("/v1/runs", content="[" * 200_000, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert (await live.http.get("/v1/runs")).json() == []


def test_config_show_refuses_a_circular_alias_without_a_traceback(tmp_path):
    cfg = tmp_path / "loop.yaml"
    cfg.write_text("rollout:\n  workflow_args:\n    a: &a [*a]\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "config", "show", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-500:] + proc.stderr[-2000:]
    assert "aliases" in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) < 10


@SQLITE
async def test_a_run_id_with_a_trailing_newline_is_refused(live):
    for bad in ("evil\n", "evil\r\n", "ev il", ""):
        with pytest.raises(ValueError):
            check_run_id(bad)
        r = await live.http.post("/v1/runs", json=run_config(bad))
        assert r.status_code == 422 and "run" in r.json()["detail"], (bad, r.text)
    assert (await live.http.get("/v1/runs")).json() == []


def _send_head_then_part_of_body(url: str, path: str, headers: dict, total: int, sent: int) -> tuple[bytes, float]:
    """Send a request head announcing `total` body bytes and `sent` of them; the answer that comes back
    (read until the server closes or 10 s pass) and when it came."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        head = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {total}",
                *[f"{k}: {v}" for k, v in headers.items()]]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b"x" * sent)
        t0 = time.monotonic()
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return data, time.monotonic() - t0


@SQLITE
async def test_an_unauthenticated_body_is_refused_before_it_is_read(live):
    fifty_mb = 50 * 1024 * 1024
    boundary = "b" * 20
    for path, ctype in (("/v1/datasets", f"multipart/form-data; boundary={boundary}"),
                        ("/v1/datasets/path", "application/json"), ("/v1/runs", "application/yaml")):
        data, _ = await asyncio.to_thread(_send_head_then_part_of_body, live.url, path, {"Content-Type": ctype},
                                          fifty_mb, 64 * 1024)
        assert data.startswith(b"HTTP/1.1 401"), (path, data[:200])
    # a wrong token too (the controller answers 401 for both)
    data, _ = await asyncio.to_thread(_send_head_then_part_of_body, live.url, "/v1/datasets",
                                      {"Content-Type": f"multipart/form-data; boundary={boundary}",
                                       "Authorization": "Bearer wrong"}, fifty_mb, 64 * 1024)
    assert data.startswith(b"HTTP/1.1 401")
    r = await live.http.post("/v1/runs", content=b"x" * (2 << 20), headers={"Content-Type": "application/yaml"})
    assert r.status_code == 413


@SQLITE
async def test_every_read_needs_the_token(live):
    assert (await live.http.post("/v1/runs", json=run_config("r1"))).status_code == 201
    async with httpx.AsyncClient(base_url=live.url) as anon:
        for path in ("/v1/datasets", "/v1/datasets/1", "/v1/runs", "/v1/runs/r1", "/v1/runs/r1/events",
                     "/v1/runs/r1/metrics", "/v1/runs/r1/ledger", "/v1/runs/r1/enqueues", "/v1/runs/r1/versions",
                     "/v1/runs/r1/staleness", "/v1/runs/r1/queues", "/v1/schema/run-config"):
            assert (await anon.get(path)).status_code == 401, path
            assert (await anon.get(path, headers=AUTH)).status_code in (200, 404), path
        health = (await anon.get("/v1/health")).json()  # open for probes, without the service list
        assert health["status"] and health["services"] == []


@SQLITE
async def test_run_config_secrets_never_reach_the_database_file(live, tmp_path):
    secrets = {"controller": {"token": "ctl-secret-1234567"}, "weights": {"token": "wts-secret-1234567",
               "read_token": "rd-secret-1234567"}, "nats": {"user": "u", "password": "nats-secret-1234567"}}
    r = await live.http.post("/v1/runs", json=run_config("sec", **secrets))
    assert r.status_code == 201, r.text
    again = await live.http.post("/v1/runs", json=run_config("sec", **secrets))  # the same run, not a 409
    assert again.status_code == 200, again.text
    db = Path(live.cfg.controller.db_url.removeprefix("sqlite:///"))
    live.ctl.engine.dispose()  # checkpoint nothing away: read the file and its WAL as they are
    raw = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))
    for section in secrets.values():
        for key, value in section.items():
            if key != "user":
                assert value.encode() not in raw, key
    assert b"<redacted>" in raw
    for p in db.parent.glob(db.name + "*"):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p


def test_config_show_redacts_secrets(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"controller": {"token": "show-me-not-123"}}))
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "config", "show", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "show-me-not-123" not in proc.stdout and "<redacted>" in proc.stdout
    cfg.write_text(proc.stdout)  # a redacted dump never runs with the placeholder as its token
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "config", "show", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "controller.token" in proc.stderr and "placeholder" in proc.stderr


def test_token_is_required_unless_explicitly_off(tmp_path, caplog):
    from controller.api import make_app
    from controller.service import Controller
    from shared.config import JetrlConfig
    from shared.runtime.auth import AuthConfigError

    base = {"db_url": f"sqlite:///{tmp_path / 'c.db'}", "data_dir": str(tmp_path / "d")}
    with pytest.raises(AuthConfigError, match="controller.token"):
        make_app(Controller(JetrlConfig(controller=base)))
    (tmp_path / "tok").write_text(TOKEN + "\n")
    make_app(Controller(JetrlConfig(controller={**base, "token_file": str(tmp_path / "tok")})))
    with caplog.at_level("WARNING"):
        make_app(Controller(JetrlConfig(controller={**base, "insecure_no_auth": True})))
    assert "WITHOUT authentication" in caplog.text
