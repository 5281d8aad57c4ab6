"""Environments people already have, through `jetrl up` for real (the tiny character policy, a real
controller, reward service, rollout worker and trainer):
- MCP servers: one over stdio started afresh for every episode inside bubblewrap, one over streamable HTTP
  shared by the worker (an `instance` id drawn at
  each server's start tells them apart: in the sandbox every server is pid 2); the first turn of each episode is a forced call (rollout.tool_agent.tool_choice
  required), and every recorded tool response is what the server itself answers to that call;
- two reasoning-gym tasks: every recorded reward is reasoning-gym's own score of the recorded reply."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from rollout_doubles import MCP_SERVER, char_policy
from up_helpers import run_until_trained

from shared.config import JetrlConfig
from shared.io.jsonl import write_jsonl
from tests.ci_gate import need_module, unavailable

pytestmark = pytest.mark.slow


def base_config(run: str, tmp_path, **rollout) -> JetrlConfig:
    pol = char_policy(tmp_path)
    return JetrlConfig.model_validate({
        "run": run, "nats": {"embedded": True}, "telemetry": {"events_interval_s": 1.0},
        "schedule": {"max_staleness": 2, "batch_size": 2, "total_steps": 2},
        "model": {"path": str(pol), "tokenizer": str(pol / "tokenizer")},
        "rollout": {"group_size": 2, "max_in_flight": 2, **rollout},
    })


async def train(cfg: JetrlConfig, tmp_path, rows: list[dict]) -> list[tuple[dict, dict]]:
    """Run `cfg` on `rows` until the trainer's 2 steps; every recorded (sample, group) of the run."""
    data = write_jsonl(rows, tmp_path / "data" / "train.jsonl")
    _, ledger, page = await run_until_trained(cfg, tmp_path / "run", data, rollouts=100)
    assert ledger["trained"] >= 4 and int(ledger.get("dead_lettered", 0)) == 0, ledger
    return [(s, g) for g in page["items"] for s in g["samples"]]


async def test_mcp_servers_over_stdio_per_episode_and_http_answer_the_policys_calls(tmp_path, http_server):
    if shutil.which("bwrap") is None:
        unavailable("bubblewrap (bwrap) is not installed (apt-get install bubblewrap)")
    url, token = http_server
    cfg = base_config("mcpup", tmp_path, workflow="tool_agent", sampling={"max_new_tokens": 200},
                      tool_agent={"tool_choice": "required", "max_turns": 2, "system_prompt": "Use a tool."},
                      tools={"enabled": [], "mcp": [
                          {"name": "box", "command": [sys.executable, MCP_SERVER], "sandbox": True,
                           "cwd": str(Path(MCP_SERVER).parents[2]), "scope": "episode", "tools": ["add", "instance"]},
                          {"name": "web", "transport": "http", "url": url, "token_file": str(token),
                           "tools": ["add"]}]})
    cfg.reward.task = "exact"
    samples = await train(cfg, tmp_path, [{"prompt": f"add {i} and {i + 1}", "reference": str(2 * i + 1)}
                                          for i in range(8)])
    assert len(samples) >= 8
    seen, ids = set(), []
    for s, _ in samples:
        policy = [seg["text"] for seg in s["segments"] if seg["kind"] == "policy"]
        env = [seg["text"] for seg in s["segments"] if seg["kind"] == "tool"]
        m = re.fullmatch(r"<tool_call>\s*(.*?)\s*</tool_call>", policy[0], re.S)
        answer = re.search(r"<tool_response>\n(.*?)\n</tool_response>", env[0], re.S).group(1)
        if m is None:  # the grammar held, but max_new_tokens cut a long random number short
            assert s["finish_reason"] == "length" or "not closed" in answer, (policy[0], answer)
            continue
        call = json.loads(m.group(1))
        seen.add(call["name"])
        if call["name"] in ("box.add", "web.add"):  # what the server answers to that call
            assert answer == str(call["arguments"]["a"] + call["arguments"]["b"]), (call, answer)
        else:
            assert call["name"] == "box.instance" and re.fullmatch(r"[0-9a-f]{32}", answer)
            ids.append(answer)
        assert s["metrics"]["tool_calls"] == 1 and s["metrics"]["tool_errors"] == 0
    assert {"box.add", "web.add"} & seen
    assert len(ids) == len(set(ids))  # a fresh stdio server (a new process) for every episode


async def test_two_reasoning_gym_tasks_are_scored_by_reasoning_gym_itself(tmp_path):
    rg = need_module("reasoning_gym", "pip install 'reasoning-gym>=0.1.25'")
    from reasoning_gym.utils import extract_answer
    from rollout_doubles import char_tokenizer

    from examples.reasoning_gym import data as rg_data

    train_rows, _ = rg_data.build(["leg_counting", "basic_arithmetic"], size=4, heldout=1, seed=0)
    tok = char_tokenizer()
    cfg = base_config("rgup", tmp_path, sampling={"max_new_tokens": 3, "allowed_token_ids": tok.convert_tokens_to_ids(
        list("0123456789-"))})
    cfg.reward.task = "reasoning_gym"
    samples = await train(cfg, tmp_path, train_rows)
    tasks = set()
    for s, _ in samples:
        row = next(r for r in train_rows if r["prompt"] in s["prompt"])
        ref = row["reference"]
        (reply,) = [seg["text"] for seg in s["segments"] if seg["kind"] == "policy"]
        ds = rg.create_dataset(ref["task"], **ref["config"])
        want = ds.score_answer(extract_answer(reply) or reply.strip().rsplit("\n", 1)[-1].strip() or None, ref["entry"])
        assert s["reward"] == want, (ref["task"], reply, s["reward"], want)
        tasks.add(ref["task"])
    assert tasks == {"leg_counting", "basic_arithmetic"}
