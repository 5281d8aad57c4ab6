"""Weight store: hostile JSON in a commit body is a 4xx, never a 500 or a
manifest holding non-standard JSON; and what each unauthenticated route shows."""

from __future__ import annotations

import hashlib
import json

import pytest
from weights_helpers import raw_request

COMMIT = "/v1/runs/r/versions/1/commit"


def upload(srv, headers: dict | None = None) -> dict:
    status, _, raw = raw_request(srv.url, "PUT", "/v1/runs/r/versions/1/files/a.bin", headers, b"abc")
    assert status == 200, raw
    return {"name": "a.bin", "size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}


def files_json(f: dict) -> str:
    return json.dumps([f])


@pytest.mark.parametrize("case", ["deep_body", "deep_metadata", "deep_33", "long_int", "long_int_step", "nan",
                                  "infinity", "neg_infinity"])
async def test_hostile_json_in_a_commit_is_a_400_and_commits_nothing(store, tmp_path, case):
    srv = store()
    files = files_json(upload(srv))
    deep = '{"a":' * 200_000 + "1" + "}" * 200_000
    body = {
        "deep_body": "[" * 200_000 + "]" * 200_000,
        "deep_metadata": '{"files": ' + files + ', "metadata": ' + deep + "}",
        "deep_33": '{"files": ' + files + ', "metadata": ' + '{"a":' * 32 + "1" + "}" * 32 + "}",
        "long_int": '{"files": ' + files + ', "metadata": {"n": ' + "7" * 5000 + "}}",
        "long_int_step": '{"files": ' + files + ', "step": ' + "1" * 5000 + "}",
        "nan": '{"files": ' + files + ', "metadata": {"x": NaN}}',
        "infinity": '{"files": ' + files + ', "metadata": {"x": Infinity}}',
        "neg_infinity": '{"files": ' + files + ', "metadata": {"x": -Infinity}}',
    }[case].encode()
    status, _, raw = raw_request(srv.url, "POST", COMMIT, {"Content-Type": "application/json"}, body)
    assert status == 400, (status, raw[:300])
    err = json.loads(raw)
    assert err["error"] == "bad_json", err
    assert not (tmp_path / "root" / "r" / "1" / "manifest.json").exists()
    # the same upload still commits with a sane body (nothing was half-done) and its manifest is standard JSON
    nest = '{"a":' * 30 + "1" + "}" * 30
    ok = '{"files": ' + files + ', "metadata": {"n": 12345678901234567890, "nest": ' + nest + "}}"
    status, _, raw = raw_request(srv.url, "POST", COMMIT, {}, ok.encode())
    assert status == 201, raw[:300]
    json.loads((tmp_path / "root" / "r" / "1" / "manifest.json").read_bytes(),
               parse_constant=lambda c: pytest.fail(f"manifest holds {c}"))


UNAUTH_OPEN = {"/healthz"}
READ_ROUTES = ["/metrics", "/v1/runs", "/v1/runs/r/versions", "/v1/runs/r/latest", "/v1/runs/r/versions/1/manifest"]
ABSENT = ["/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"]


async def test_each_route_unauthenticated_and_with_the_token(store, tmp_path):
    srv = store(token="write-tok", read_token="read-tok")
    auth = {"Authorization": "Bearer write-tok"}
    f = upload(srv, auth)
    assert raw_request(srv.url, "POST", COMMIT, auth, json.dumps({"files": [f]}).encode())[0] == 201
    # /healthz: open (liveness probes carry no token) and says only that it is up: no root path
    for headers in ({}, auth):
        status, _, raw = raw_request(srv.url, target="/healthz", headers=headers)
        assert status == 200 and json.loads(raw) == {"status": "ok"}, raw
        assert str(tmp_path).encode() not in raw
    # reads, /metrics included: 401 without a token, 403 with a wrong one, 200 with the read or write token
    for target in READ_ROUTES:
        status, hdrs, raw = raw_request(srv.url, target=target)
        assert status == 401 and json.loads(raw)["error"] == "unauthorized", (target, raw)
        assert b"jetrl_weights" not in raw and b'"r"' not in raw
        assert raw_request(srv.url, target=target, headers={"Authorization": "Bearer nope"})[0] == 403, target
        for tok in ("read-tok", "write-tok"):
            status, _, raw = raw_request(srv.url, target=target, headers={"Authorization": f"Bearer {tok}"})
            assert status == 200, (target, tok, raw[:200])
    status, _, raw = raw_request(srv.url, target="/metrics", headers={"Authorization": "Bearer read-tok"})
    assert b'jetrl_weights_versions{run="r"} 1.0' in raw
    # no schema or API browser, with or without the token
    for target in ABSENT:
        for headers in ({}, auth):
            status, _, raw = raw_request(srv.url, target=target, headers=headers)
            assert status == 404, (target, status, raw[:200])
            assert b"openapi" not in raw.lower() and b"/v1/runs" not in raw
