"""The weight store as an attacker meets it: racing uploads never pair one upload's bytes
with another's digest, malformed commits and names are 4xx (never 500), a commit cannot race an upload,
the service needs a token by default, and a file corrupted on the shared filesystem is not served."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time

import pytest
from weights_helpers import raw_request, state_dict, store_config

from shared.runtime.auth import AuthConfigError
from weight_store.client import DigestMismatch, WeightStoreClient
from weight_store.server import create_app


def put(srv, target: str, body: bytes) -> tuple[int, dict]:
    status, _, raw = raw_request(srv.url, "PUT", target, {}, body)
    return status, json.loads(raw) if raw else {}


def commit(srv, run: str, version, files: list[dict], **extra) -> tuple[int, dict]:
    body = json.dumps({"files": files, **extra}).encode()
    status, _, raw = raw_request(srv.url, "POST", f"/v1/runs/{run}/versions/{version}/commit",
                                 {"Content-Type": "application/json"}, body)
    return status, json.loads(raw) if raw else {}


def entry(name: str, data: bytes) -> dict:
    return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


async def test_racing_uploads_of_one_file_never_serve_bytes_that_differ_from_the_manifest(store):
    srv = store()
    bodies = [bytes([i]) * (256 << 10) for i in range(4)]  # same size, different bytes
    for trial in range(60):
        target = f"/v1/runs/race/versions/{trial}/files/model.bin"
        results = await asyncio.gather(*(asyncio.to_thread(put, srv, target, b) for b in bodies))
        assert all(status == 200 for status, _ in results), results
        # commit whichever upload the store says it holds last; the served bytes must hash to the manifest
        listed = {r["sha256"] for _, r in results}
        for b in bodies:
            status, body = commit(srv, "race", trial, [entry("model.bin", b)])
            if status == 201:
                break
            assert status == 400 and body["error"] == "digest_mismatch", body
        else:
            raise AssertionError("no upload's digest was accepted")
        want = body["manifest"]["files"][0]["sha256"]
        assert want in listed
        status, _, served = raw_request(srv.url, target=target)
        assert status == 200 and hashlib.sha256(served).hexdigest() == want, f"trial {trial}: served bytes differ"


@pytest.mark.parametrize("first,second", [("cfg", "cfg/x"), ("d/x", "d")])
async def test_a_file_and_a_dir_of_the_same_name_are_a_400_not_a_500(store, first, second):
    srv = store()
    for name in (first, second):
        status, body = put(srv, f"/v1/runs/r/versions/1/files/{name}", name.encode())
        assert status == 200, body
    status, body = commit(srv, "r", 1, [entry(first, first.encode()), entry(second, second.encode())])
    assert status == 400 and body["error"] == "name_conflict", body
    status, body = commit(srv, "r", 1, [entry(second, second.encode())])  # either alone commits
    assert status == 201, body
    assert raw_request(srv.url, target=f"/v1/runs/r/versions/1/files/{second}")[2] == second.encode()


@pytest.mark.parametrize("field,value", [("size", "abc"), ("size", [1]), ("size", 1e400), ("size", -1),
                                         ("size", True), ("sha256", 5), ("sha256", "zz"), ("name", 7)])
async def test_malformed_commit_files_are_400(store, field, value):
    srv = store()
    assert put(srv, "/v1/runs/r/versions/1/files/a.bin", b"abc")[0] == 200
    f = {**entry("a.bin", b"abc"), field: value}
    body = json.dumps({"files": [f]}).replace("Infinity", "1e400").encode()
    status, _, raw = raw_request(srv.url, "POST", "/v1/runs/r/versions/1/commit", {}, body)
    assert status == 400, raw


@pytest.mark.parametrize("step", [True, False, -1, 2**64, "3", 1.5])
async def test_a_step_that_is_not_a_non_negative_integer_is_400(store, step):
    srv = store()
    assert put(srv, "/v1/runs/r/versions/1/files/a.bin", b"abc")[0] == 200
    status, body = commit(srv, "r", 1, [entry("a.bin", b"abc")], step=step)
    assert status == 400 and "step" in body["message"], body


@pytest.mark.parametrize("target", ["/v1/runs/r1%0A/versions/1/files/a.bin", "/v1/runs/r1/versions/1%0A/files/a.bin",
                                    "/v1/runs/r1/versions/1/files/a.bin%0A"])
async def test_names_with_a_trailing_newline_are_refused(store, tmp_path, target):
    srv = store()
    status, body = put(srv, target, b"abc")
    assert status == 400 and body["error"] == "bad_name", body
    assert not (tmp_path / "root" / "r1\n").exists()


async def test_a_commit_cannot_race_an_upload_and_leaves_no_staging_dir(store, tmp_path):
    srv = store()
    assert put(srv, "/v1/runs/r/versions/3/files/a.bin", b"abc")[0] == 200
    slow = socket.create_connection(("127.0.0.1", srv.cfg.port))
    slow.sendall(b"PUT /v1/runs/r/versions/3/files/b.bin HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"b" * 10)
    staging = tmp_path / "root" / ".staging" / "r" / "3"
    deadline = time.monotonic() + 10
    while not any(p.name.endswith(".part") for p in staging.iterdir()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    status, body = commit(srv, "r", 3, [entry("a.bin", b"abc")])
    assert status == 409 and body["error"] == "upload_in_progress", body
    slow.sendall(b"b" * 990)
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += slow.recv(4096)
    slow.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    status, body = commit(srv, "r", 3, [entry("a.bin", b"abc")])
    assert status == 201, body
    assert not staging.exists() and sorted(p.name for p in (tmp_path / "root" / "r" / "3").iterdir()) == \
        [".pieces.json", "a.bin", "manifest.json"]  # the undeclared upload is gone with its staging dir


def test_the_service_needs_a_token_unless_explicitly_open(tmp_path, caplog):
    with pytest.raises(AuthConfigError, match="weights.token"):
        create_app(store_config(tmp_path / "a", insecure_no_auth=False))
    with pytest.raises(AuthConfigError, match="read_token"):
        create_app(store_config(tmp_path / "b", read_token="r", insecure_no_auth=False))
    (tmp_path / "tok").write_text("file-token\n")
    create_app(store_config(tmp_path / "c", token_file=str(tmp_path / "tok")))
    with caplog.at_level("WARNING"):
        create_app(store_config(tmp_path / "d", insecure_no_auth=True))
    assert "WITHOUT authentication" in caplog.text


async def test_reads_need_a_token_when_one_is_set(store):
    srv = store(token="w")
    await WeightStoreClient(srv.cfg).publish("demo", 0, state_dict(n=1))
    for target in ("/v1/runs", "/v1/runs/demo/versions", "/v1/runs/demo/latest", "/v1/runs/demo/versions/0/manifest"):
        assert raw_request(srv.url, target=target)[0] == 401, target
        assert raw_request(srv.url, target=target, headers={"Authorization": "Bearer w"})[0] == 200, target


async def test_a_file_corrupted_on_the_shared_filesystem_is_not_served_by_default(store, tmp_path):
    srv = store()
    wv = await WeightStoreClient(srv.cfg).publish("fs", 0, state_dict(n=2))
    stored = tmp_path / "root" / "fs" / "0" / wv.files[0]["name"]
    data = bytearray(stored.read_bytes())
    data[100:4196] = bytes(4096)  # a zeroed page, same size
    stored.write_bytes(bytes(data))
    reader = WeightStoreClient(store_config(tmp_path / "root", shared_fs=True))  # a rollout worker's defaults
    with pytest.raises(DigestMismatch):
        await reader.fetch("fs", 0)
