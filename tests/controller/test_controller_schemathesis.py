"""Property-based fuzzing of the controller's REST API from its own OpenAPI spec (schemathesis): no
input gives a 500, and every answer matches the documented status codes, content types and schemas."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time

import httpx
import pytest
import yaml
from ci_gate import need_module
from controller_helpers import AUTH, TOKEN, maxdigit_rows, run_config, write_jsonl

schemathesis = need_module("schemathesis", "dev extra")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from shared.runtime.natsd import EmbeddedNats, free_port  # noqa: E402


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
            # not the default run id "demo": a generated `{}` config then creates a run the links can follow
            c.post("/v1/runs", json=run_config("seeded", 0, 2)).raise_for_status()
            c.post("/v1/runs/seeded/enqueues", json={"dataset": "1"}).raise_for_status()
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=AUTH)  # the spec needs the token
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
    spec = httpx.get(f"{api_schema.config.base_url}/openapi.json", headers=AUTH).json()
    paths = set(spec["paths"])
    for p in ("/v1/datasets", "/v1/datasets/path", "/v1/datasets/hf", "/v1/runs", "/v1/runs/{run}",
              "/v1/runs/{run}/enqueues", "/v1/runs/{run}/metrics", "/v1/runs/{run}/ledger", "/v1/health"):
        assert p in paths, p
    assert json.dumps(spec).count("bearer") >= 1


def test_every_operation_but_health_needs_the_token(api_schema):
    base = api_schema.config.base_url
    for op in (r.ok() for r in api_schema.get_all_operations()):
        if op.path == "/v1/health":
            continue
        path = op.path.replace("{run}", "seeded").replace("{dataset}", "1")
        r = httpx.request(op.method.upper(), base + path, timeout=30)
        assert r.status_code == 401, f"{op.method.upper()} {op.path}: {r.status_code}"


def test_stateful_sequences_follow_links_between_runs_datasets_and_enqueues(api_schema):
    """Schemathesis' stateful mode: created runs and datasets feed later calls through the spec's OpenAPI
    links (createRun -> getRun / enqueue / pause / ledger ..., registerDataset* -> getDataset, enqueue ->
    listEnqueues), with auth on; no sequence gives a 5xx or breaks the schema."""
    seen: list[tuple[str, str, int]] = []

    new_ids = itertools.count()

    class Authed(api_schema.as_state_machine()):
        def before_call(self, case):
            # Generated run configs name few distinct runs (without `run`, always "demo"), so after the
            # first creation they conflict (409) and the links have one created run to follow: give each
            # config body its own valid id (its other fields stay as generated; bad ids: test_controller_security).
            if (case.operation.method.upper(), case.operation.path) == ("POST", "/v1/runs") and \
                    isinstance(case.body, dict):
                case.body = {**case.body, "run": f"fuzz-{next(new_ids)}"}

        def get_call_kwargs(self, case):
            return {"headers": AUTH, "timeout": 30}

        def after_call(self, response, case):
            seen.append((case.operation.method.upper(), case.operation.path, response.status_code))

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS)

    Authed.run(settings=settings(max_examples=100, stateful_step_count=10, deadline=None, derandomize=True,
                                 database=None, suppress_health_check=list(HealthCheck)))
    created = [st for m, p, st in seen if (m, p) == ("POST", "/v1/runs") and st in (200, 201)]
    linked = {(m, p) for m, p, status in seen if status < 300 and "{run}" in p}
    print("stateful calls:", len(seen), "runs created or found:", len(created), "run-scoped successes:", sorted(linked))
    assert created and linked, sorted(set(seen))  # runs were created and later calls used their ids
