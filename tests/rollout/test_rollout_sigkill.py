"""SIGKILL a rollout worker process with tasks in flight (some already published, not yet acked): another
worker completes them and exactly one trajectory group per prompt reaches the trajectories stream."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from rollout_doubles import ScriptedEngine, publish_prompts, read_groups, wait_for, worker_config

from reward_service.service import RewardService
from rollout_service.service import RolloutWorker
from shared.contract import bus, subjects
from shared.model.tinymodel import build_tokenizer

RUN = "rk"
HERE = Path(__file__).resolve().parent


@pytest.mark.slow
async def test_sigkilled_worker_tasks_are_completed_by_another_exactly_once(nats_config, nc, js):
    url = nats_config.servers[0]
    rconn = await bus.connect(nats_config, name="reward-test")
    reward = RewardService(rconn, worker_config(url, RUN), task="maxdigit")
    await reward.start()
    proc = None
    try:
        ids = await publish_prompts(js, nc, RUN, 8)
        proc = await asyncio.create_subprocess_exec(sys.executable, str(HERE / "rollout_worker_proc.py"), url, RUN,
                                                    stdout=asyncio.subprocess.PIPE, cwd=str(HERE.parents[1]))
        frozen: dict[str, list[str]] = {"published-unacked": [], "in-flight": []}
        while len(frozen["published-unacked"]) < 2 or len(frozen["in-flight"]) < 2:
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().split()
            assert line, "worker process exited early"
            frozen[line[0]].append(line[1])
        before = await read_groups(js, RUN)
        assert sorted(g.group_id for g in before) == sorted(frozen["published-unacked"])

        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()

        cfg = worker_config(url, RUN)
        cfg.rollout.service.follow_weights = False
        tok = build_tokenizer()
        rescuer = RolloutWorker(cfg, engine=ScriptedEngine(tok, lambda p, n: " 9"), tokenizer=tok, instance="rescuer")
        task = asyncio.create_task(rescuer.run())

        async def all_acked():
            return (await js.stream_info(subjects.PROMPTS_STREAM)).state.messages == 0

        await wait_for(all_acked, timeout=120, what="every prompt acked after the kill")
        rescuer.stop()
        await asyncio.wait_for(task, 60)
        groups = await read_groups(js, RUN)
        assert sorted(g.group_id for g in groups) == sorted(ids)  # exactly one group per prompt
        # The rescuer redid the killed worker's four tasks: two of its publishes were deduplicated.
        assert rescuer.published == 8
        by_id = {g.group_id: g.worker for g in groups}
        assert all(by_id[i] == "victim" for i in frozen["published-unacked"])
        assert all(by_id[i] == "rescuer" for i in frozen["in-flight"])
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reward.stop(drain_s=1)
        await rconn.close()
