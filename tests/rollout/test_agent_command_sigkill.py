"""A command agent (its own session, so a time-out can kill its group) must not outlive a
SIGKILLed rollout worker by reparenting to pid 1. A real `jetrl rollout` process (sim engine, agent workflow)
against a real nats-server; the agent is a shell that starts a child of its own, and both must go."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import yaml

from shared.config import JetrlConfig
from shared.contract import bus, subjects
from shared.contract.messages import PromptTask

RUN = "agentkill"


def alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet counts as gone: it holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_sigkilled_worker_takes_its_command_agents_and_their_children_along(nats_server, js, nc, tmp_path):
    pids = tmp_path / "pids"
    agent = f"echo $$ >> {pids}; sleep 300 & echo $! >> {pids}; wait"
    cfg = {"run": RUN, "nats": {"servers": [nats_server.url]}, "telemetry": {"metrics_port": -1, "log_level": "WARNING"},
           "rollout": {"engine": "sim", "sim": {"time_scale": 0}, "workflow": "agent", "group_size": 1,
                       "workflow_args": {"command": ["sh", "-c", agent]},
                       "service": {"follow_weights": False}}}
    JetrlConfig.model_validate(cfg)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "launcher.cli", "rollout", "-c", str(tmp_path / "c.yaml"),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    found: list[int] = []
    try:
        t = PromptTask(run=RUN, prompt_id="p0", epoch=0, payload={"prompt": "hi"}, group_size=1)
        await bus.publish(js, nc, subjects.prompts(RUN), t, msg_id=t.group_id)
        deadline = time.monotonic() + 120
        while len(found) < 2:
            assert time.monotonic() < deadline, "the agent command never started"
            assert proc.returncode is None, (await proc.stderr.read()).decode()[-3000:]
            await asyncio.sleep(0.1)
            found = [int(x) for x in pids.read_text().split()] if pids.exists() else []
        assert all(alive(p) for p in found)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        deadline = time.monotonic() + 5
        while any(alive(p) for p in found):
            assert time.monotonic() < deadline, f"still running after the worker died: {[p for p in found if alive(p)]}"
            await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for p in found:  # never leave them behind, whatever the result
            if alive(p):
                os.kill(p, signal.SIGKILL)
