"""Two LLM-judge replicas behind one subject, one SIGKILLed mid-run (issue 35): a real `jetrl up` run
(embedded nats-server, SQLite, the tiny policy on the digit task) rewarded by `jetrl reward serve --task
judge` x 2 whose judge is an OpenAI-compatible server (testkit/judge_standin.py, 0.3 s a call, a bearer key
given through the environment). The run ends by itself when its data is trained, nothing dead-lettered,
every prompt trained, and the ledger balanced."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import select

from controller import completion
from controller.db import EventRow, open_database
from launcher.up import poll_until
from testkit.diagnosis_scenario import DiagnosedRun
from testkit.judge_standin import StandIn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPTS = 64
KEY = "sk-replicas-51c2"


async def test_a_judge_replica_killed_mid_run_loses_nothing(tmp_path):
    judge = StandIn(key=KEY, delay_s=0.3)
    url = judge.start()
    settings = {"reward": {"task": "judge", "timeout_s": 3.0, "retries": 4,
                           "judge": {"backend": "openai", "base_url": url, "model": "judge-1"}},
                "schedule": {"batch_size": 4, "max_staleness": 1, "total_steps": 0},
                "rollout": {"group_size": 2}}
    run = DiagnosedRun(tmp_path, "judged", settings, prompts=PROMPTS, env={"JETRL_JUDGE_API_KEY": KEY},
                       reward_replicas=2)
    try:
        await run.start()
        await run.until_steps(2)
        calls_before = judge.calls
        run.signal("reward-0", signal.SIGKILL)
        killed_at = time.time()
        _, Session = open_database(f"sqlite:///{tmp_path / 'judged' / 'controller.db'}")

        async def complete():
            if run.launcher.sup.failure is not None:
                raise AssertionError(run.launcher.sup.failure.message())
            with Session() as s:
                return completion.progress(s, "judged")["state"] == "complete"

        await poll_until(complete, 300, "the judged run to complete")
    finally:
        await run.close()
        judge.stop()
    with Session() as s:
        prog = completion.progress(s, "judged")
        steps = [e.data for e in s.scalars(select(EventRow).where(EventRow.run_id == "judged", EventRow.kind == "step"))]
    led = prog["ledger"]
    assert led["released"] == PROMPTS and led["in_flight"] == 0 and led["balanced"], led
    assert led["dead_lettered"] == 0 and led["trained"] + led["dropped_stale"] == PROMPTS, led
    assert judge.calls > calls_before and set(judge.keys) == {KEY}
    # the judge's criterion score reaches the trainer's step events (and from there the dashboard)
    assert all("reward_criterion/overall" in e for e in steps)
    assert time.time() - killed_at < 300
