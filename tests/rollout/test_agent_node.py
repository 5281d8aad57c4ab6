"""A Node.js agent (the official `openai` npm package, examples/agents/node) started by the rollout worker as an
external command per episode trains the tiny policy for a few steps through the real controller, reward
service and trainer (`jetrl up`), every released prompt accounted for in the ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
from ci_gate import node_project
from up_helpers import run_until_trained

from launcher.demo.task import write_dataset
from shared.config import JetrlConfig

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "examples" / "agents" / "node"


@pytest.fixture(scope="module")
def node():
    return node_project(NODE_DIR, "openai")


async def test_a_node_agent_trains_through_controller_reward_and_trainer(node, tmp_path):
    train, _ = write_dataset(tmp_path / "data", train=200, heldout=10)
    cfg = JetrlConfig.model_validate({
        "run": "nodeagent", "nats": {"embedded": True}, "telemetry": {"events_interval_s": 1.0},
        "schedule": {"max_staleness": 4, "batch_size": 4, "total_steps": 3}, "reward": {"task": "maxdigit"},
        "rollout": {"workflow": "agent", "workflow_args": {"command": [node, str(NODE_DIR / "agent.mjs")]},
                    "group_size": 4, "max_in_flight": 4, "sampling": {"max_new_tokens": 1},
                    "agent": {"timeout_s": 60}},
    })
    snap, ledger, _ = await run_until_trained(cfg, tmp_path / "run", train, timeout_s=420)
    steps = snap["steps"]
    assert len(steps) >= 3 and ledger["trained"] >= 3 * 4
    accounted = sum(int(ledger.get(k, 0)) for k in ("trained", "dropped_stale", "filtered", "dead_lettered", "in_flight"))
    assert int(ledger["released"]) == accounted and int(ledger.get("dead_lettered", 0)) == 0
    log = (tmp_path / "run" / "logs" / "rollout.log").read_text()
    assert "OpenAI-compatible endpoint on http://127.0.0.1:" in log and "workflow agent" in log
