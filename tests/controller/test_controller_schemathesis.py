"""Property-based fuzzing of the controller's REST API from its own OpenAPI spec (schemathesis): no
input gives a 500, and every answer matches the documented status codes, content types and schemas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
import yaml
from controller_helpers import AUTH, TOKEN, maxdigit_rows, run_config, write_jsonl

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from shared.natsd import EmbeddedNats, free_port  # noqa: E402


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    nats = EmbeddedNats(tmp / "nats").start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = {"nats": {"servers": [nats.url]}, "telemetry": {"log_level": "WARNING"},
           "controller": {"db_url": f"sqlite:///{tmp / 'c.db'}", "data_dir": str(tmp / "data"), "port": port,
                          "token": TOKEN, "path_roots": [str(tmp / "allowed")], "max_upload_mb": 4}}
    (tmp / "allowed").mkdir()
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    log = open(tmp / "controller.log", "ab")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "controller", "-c", str(tmp / "c.yaml")],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "controller.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).json()["nats"] == "connected":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "controller did not start"
            time.sleep(0.2)
        # some real state, so reads of existing things are exercised too
        p = write_jsonl(tmp / "allowed" / "d.jsonl", maxdigit_rows(5))
        with httpx.Client(base_url=url, headers=AUTH) as c:
            c.post("/v1/datasets/path", json={"path": p}).raise_for_status()
            c.post("/v1/runs", json=run_config("demo", 0, 2)).raise_for_status()
            c.post("/v1/runs/demo/enqueues", json={"dataset": "1"}).raise_for_status()
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        schema.config.base_url = url
        yield schema
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        nats.close()
        server_log = (tmp / "controller.log").read_text()
        assert "internal error" not in server_log, server_log[-5000:]


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_no_input_gives_a_server_error_or_breaks_the_schema(api_schema):
    failures: list[str] = []
    ops = [r.ok() for r in api_schema.get_all_operations()]
    assert len(ops) >= 15
    for op in ops:
        @given(case=op.as_strategy())
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def fuzz(case):
            resp = case.call(headers=AUTH, timeout=30)
            case.validate_response(resp, checks=CHECKS)

        try:
            fuzz()
        except Exception as exc:  # collect every operation's first failure, then report them all
            failures.append(f"{op.method.upper()} {op.path}: {type(exc).__name__}: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)


def test_openapi_spec_lists_the_v1_routes(api_schema):
    spec = httpx.get(f"{api_schema.config.base_url}/openapi.json").json()
    paths = set(spec["paths"])
    for p in ("/v1/datasets", "/v1/datasets/path", "/v1/datasets/hf", "/v1/runs", "/v1/runs/{run}",
              "/v1/runs/{run}/enqueues", "/v1/runs/{run}/metrics", "/v1/runs/{run}/ledger", "/v1/health"):
        assert p in paths, p
    assert json.dumps(spec).count("bearer") >= 1
