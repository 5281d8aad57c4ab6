"""The Node.js reward service (reward_service/examples/node) passes `jetrl reward check` and answers
exactly as the Python service does on the same task, side by side on one nats-server."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from ci_gate import node_project
from reward_fixtures import ROOT, replicas, run_config, wait_for_log

from reward_service.check import run_check
from reward_service.client import RewardClient

NODE_DIR = ROOT / "reward_service" / "examples" / "node"
CASES = [
    (["hello", " hello\n", "Hello", "", "hello world"], "hello"),
    (["café ☕", "cafe"], "café ☕"),
    (["\u00a0x", "x", "\tx\v"], "x"),
    (["a", "b"], ["b", "c"]),
    (["1"], 1),
    (["x"], None),
    ([], "x"),
]


@pytest.fixture(scope="module")
def node_modules():
    return node_project(NODE_DIR, "nats")


@pytest.fixture
async def node_service(node_modules, nats_server, tmp_path):
    log = tmp_path / "node.log"
    proc = subprocess.Popen([node_modules, "server.js", "--servers", nats_server.url, "--name", "node-test"],
                            cwd=NODE_DIR, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        await wait_for_log(log, "ready:", proc, timeout=30)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def test_the_node_service_passes_the_conformance_suite(node_service, nc):
    report = await run_check(nc, "exact", requests=50)
    failed = [(c.name, c.detail) for c in report.cases if not c.ok]
    assert failed == []


async def test_node_and_python_services_give_the_same_answers(node_service, nats_config, nc):
    client = RewardClient(nc, run_config(nats_config).reward)
    node_answers = [await client.score("exact", c, r) for c, r in CASES]
    assert all(a.extra["instance"] == "node-test-exact" for a in node_answers)
    node_service.terminate()
    await asyncio.to_thread(node_service.wait, 10)
    async with replicas(run_config(nats_config), 1, "exact"):
        py_answers = [await client.score("exact", c, r) for c, r in CASES]
    assert all(a.extra["instance"] == "replica-0" for a in py_answers)
    for (comps, ref), node, py in zip(CASES, node_answers, py_answers, strict=True):
        assert node.rewards == py.rewards, (comps, ref)
        assert [e is None for e in node.errors] == [e is None for e in py.errors], (comps, ref, node.errors, py.errors)
        assert (node.error is None) == (py.error is None)
