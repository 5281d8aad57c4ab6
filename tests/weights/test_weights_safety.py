"""Refusals: auth (401/403), names that could leave the root (400), size limits (413), wrong digests
(400), a second commit (409). Each one leaves nothing written."""

from __future__ import annotations

import hashlib
import json

import pytest
from weights_helpers import raw_request, state_dict

from weight_store import transfer
from weight_store.client import WeightStoreClient, WeightStoreError


def written(root) -> list[str]:
    """Every file under the store root (dot-dirs included), as relative paths."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def put(srv, target: str, body: bytes = b"abc", **headers) -> tuple[int, dict]:
    status, _, raw = raw_request(srv.url, "PUT", target, headers, body)
    return status, json.loads(raw) if raw else {}


async def test_writes_without_or_with_a_wrong_token_are_refused_and_write_nothing(store, tmp_path):
    srv = store(token="s3cret")
    root = tmp_path / "root"
    before = written(root)
    status, err = put(srv, "/v1/runs/demo/versions/0/files/model.safetensors")
    assert status == 401 and err["error"] == "unauthorized" and "Bearer" in err["message"]
    status, err = put(srv, "/v1/runs/demo/versions/0/files/model.safetensors", Authorization="Bearer nope")
    assert status == 403 and err["error"] == "forbidden"
    status, _, raw = raw_request(srv.url, "POST", "/v1/runs/demo/versions/0/commit", {}, b'{"files": []}')
    assert status == 401
    status, _, raw = raw_request(srv.url, "PUT", "/v1/runs/demo/versions/0/pin", {"Authorization": "Basic x"})
    assert status == 401
    assert written(root) == before and not (root / "demo").exists()
    with pytest.raises(WeightStoreError) as exc:
        await WeightStoreClient(srv.cfg.model_copy(update={"token": "wrong"})).publish("demo", 0, state_dict(n=1))
    assert exc.value.status == 403
    assert written(root) == before
    # the right token works; reads need it too (or the read token)
    await WeightStoreClient(srv.cfg).publish("demo", 0, state_dict(n=1))
    assert raw_request(srv.url, target="/v1/runs/demo/versions")[0] == 401
    assert raw_request(srv.url, target="/v1/runs/demo/versions", headers={"Authorization": "Bearer s3cret"})[0] == 200


async def test_reads_need_the_read_token_when_one_is_set(store):
    srv = store(token="w", read_token="r")
    await WeightStoreClient(srv.cfg).publish("demo", 0, state_dict(n=1))
    assert raw_request(srv.url, target="/v1/runs/demo/latest")[0] == 401
    assert raw_request(srv.url, target="/v1/runs/demo/latest", headers={"Authorization": "Bearer x"})[0] == 403
    assert raw_request(srv.url, target="/v1/runs/demo/latest", headers={"Authorization": "Bearer r"})[0] == 200
    reader = WeightStoreClient(srv.cfg.model_copy(update={"token": ""}))
    assert (await reader.fetch("demo", 0)).is_dir()


@pytest.mark.parametrize("target", [
    "/v1/runs/../versions/0/files/x.bin",
    "/v1/runs/demo/versions/0/files/../../../escape.bin",
    "/v1/runs/demo/versions/0/files/..%2F..%2F..%2Fescape.bin",
    "/v1/runs/demo/versions/0/files/%2Ftmp%2Fescape.bin",
    "/v1/runs/demo/versions/0/files//tmp/escape.bin",
    "/v1/runs/demo/versions/0/files/sub/../../escape.bin",
    "/v1/runs/demo/versions/0/files/.hidden",
    "/v1/runs/demo/versions/0/files/we%20ird.bin",
    "/v1/runs/demo/versions/0/files/manifest.json",
    "/v1/runs/demo/versions/-1/files/x.bin",
    "/v1/runs/demo/versions/1e3/files/x.bin",
    "/v1/runs/de%2Emo/versions/0/files/x.bin",
    "/v1/runs/%2E%2E/versions/0/files/x.bin",
])
async def test_names_that_could_leave_the_root_are_refused_with_400(store, tmp_path, target):
    srv = store()
    root = tmp_path / "root"
    before = written(root)
    status, err = put(srv, target)
    assert status == 400, (target, status, err)
    assert err["error"] == "bad_name" and "invalid" in err["message"]
    assert written(root) == before
    assert not list(tmp_path.glob("**/escape.bin")) and not (root.parent / "escape.bin").exists()
    status, _, raw = raw_request(srv.url, "GET", target)
    assert status == 400


async def test_uploads_over_the_size_limit_are_refused_with_413(store, tmp_path):
    srv = store(max_file_mb=1)
    root = tmp_path / "root"
    before = written(root)
    big = b"x" * ((1 << 20) + 1)
    url = transfer.file_url(srv.url, "demo", 0, "big.bin")
    with pytest.raises(WeightStoreError) as exc:  # Expect: 100-continue: refused before the body is sent
        transfer.put_stream(url, lambda: [big], len(big), {}, timeout=30)
    assert exc.value.status == 413 and "max_file_mb" in exc.value.message
    assert written(root) == before
    status, rec = put(srv, "/v1/runs/demo/versions/0/files/ok.bin", b"y" * 1000)
    assert status == 200 and rec["size"] == 1000


async def test_a_wrong_declared_digest_is_refused_and_nothing_is_kept(store, tmp_path):
    srv = store()
    root = tmp_path / "root"
    body = b"weights" * 1000
    status, err = put(srv, "/v1/runs/demo/versions/0/files/w.bin", body, **{"X-Content-SHA256": "0" * 64})
    assert status == 400 and err["error"] == "digest_mismatch"
    assert not [p for p in written(root) if not p.startswith(".staging/demo/0/.files")]
    good = hashlib.sha256(body).hexdigest()
    status, rec = put(srv, "/v1/runs/demo/versions/0/files/w.bin", body, **{"X-Content-SHA256": good})
    assert status == 200 and rec["sha256"] == good
    # a commit declaring other bytes than were uploaded is refused; the version does not appear
    bad = json.dumps({"files": [{"name": "w.bin", "size": len(body), "sha256": "f" * 64}]}).encode()
    status, _, raw = raw_request(srv.url, "POST", "/v1/runs/demo/versions/0/commit", {}, bad)
    assert status == 400 and json.loads(raw)["error"] == "digest_mismatch"
    missing = json.dumps({"files": [{"name": "other.bin", "size": 1, "sha256": good}]}).encode()
    status, _, raw = raw_request(srv.url, "POST", "/v1/runs/demo/versions/0/commit", {}, missing)
    assert status == 400 and json.loads(raw)["error"] == "missing_file"
    assert raw_request(srv.url, target="/v1/runs/demo/latest")[0] == 404
    ok = json.dumps({"files": [{"name": "w.bin", "size": len(body), "sha256": good}]}).encode()
    assert raw_request(srv.url, "POST", "/v1/runs/demo/versions/0/commit", {}, ok)[0] == 201
    status, _, raw = raw_request(srv.url, "POST", "/v1/runs/demo/versions/0/commit", {}, ok)
    assert status == 409 and json.loads(raw)["error"] == "exists"
    status, err = put(srv, "/v1/runs/demo/versions/0/files/late.bin", body)
    assert status == 409  # a committed version is immutable


async def test_bad_json_and_unknown_routes_answer_json_errors(store):
    srv = store()
    status, _, raw = raw_request(srv.url, "POST", "/v1/runs/demo/versions/0/commit", {}, b"{not json")
    assert status == 400 and json.loads(raw)["error"] == "bad_json"
    status, _, raw = raw_request(srv.url, "GET", "/v1/runs/demo/versions/3/manifest")
    assert status == 404 and "no version 3" in json.loads(raw)["message"]
    status, _, raw = raw_request(srv.url, "GET", "/nowhere")
    assert status == 404 and json.loads(raw)["error"] == "not_found"
