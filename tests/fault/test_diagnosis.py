"""`jetrl why` on real runs driven into each cause (testkit/diagnosis_scenario.py): every service a process of
`jetrl up`, faults injected with SIGSTOP / SIGKILL, a full disk on a small tmpfs, a scorer that always
returns 0 and a prompt too long for the engine. The diagnosis names each cause, and none while the run is
healthy. Thresholds are short here (alive 4 s, stall 8 s); bench/diagnosis.py times the same faults."""

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from testkit.diagnosis_scenario import DiagnosedRun, causes, errors, mount_tmpfs, problems, umount

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent


async def _healthy(run: DiagnosedRun, polls: int = 4) -> None:
    for _ in range(polls):
        d = await run.why()
        assert d["state"] == "advancing" and problems(d) == [], d
        await asyncio.sleep(1.0)


async def test_why_names_each_stopped_or_killed_service_and_nothing_while_healthy(tmp_path):
    run = DiagnosedRun(tmp_path, "why")
    try:
        await run.start()
        await run.until_steps(3)
        await _healthy(run)
        for child, cause in (("reward", "reward_unavailable"), ("weights", "weight_store_down"),
                             ("trainer", "trainer_dead")):
            secs, d = await run.fault_stopped(child, cause)
            assert d["state"] in ("stalled", "advancing"), d
            f = next(f for f in d["findings"] if f["cause"] == cause)
            assert f["severity"] == "error" and f["action"]
            await run.until_advancing()
        secs, d = await run.fault_rollout_killed()
        assert "no rollout worker" in next(f["summary"] for f in d["findings"] if f["cause"] == "no_rollout_worker")
        # the trainer starves: once no step came for stall_s, the run is called stalled, for that reason
        _, d = await run.time_to(lambda d: d["state"] == "stalled", time.time(), 90, "the run to be called stalled")
        assert "no_rollout_worker" in errors(d) and "no rollout worker" in d["summary"]
        r = subprocess.run(["jetrl", "why", "why", "--url", run.launcher.resolved.controller.url],
                           env={**os.environ, "JETRL_TOKEN": run.launcher.resolved.controller.secret("token")},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "[no_rollout_worker]" in r.stdout and "what to do:" in r.stdout, r.stdout + r.stderr
    finally:
        await run.close()


async def test_why_names_a_full_disk(tmp_path):
    root = tmp_path / "store"
    if not mount_tmpfs(root, "3m"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        run = DiagnosedRun(tmp_path, "disk", {"weights": {"root": str(root), "keep_last": 1000}})
        try:
            await run.start()
            secs, d = await run.time_to_cause("disk_full", 0.0, timeout_s=240)
            f = next(f for f in d["findings"] if f["cause"] == "disk_full")
            assert "space" in f["summary"].lower() or "insufficient" in f["summary"].lower(), f
        finally:
            await run.close()
    finally:
        umount(root)


async def test_why_warns_of_groups_without_signal_and_of_dead_letters(tmp_path):
    long_prompt = {"prompt": "max " + "7 " * 200 + "=", "reference": "7"}
    run = DiagnosedRun(tmp_path, "nosig", {"reward": {"scorer": "zero_scorer:score"},
                                           "rollout": {"service": {"max_prompt_tokens": 64}}},
                       prompts=2000, extra_rows=[long_prompt] * 3,
                       env={"PYTHONPATH": f"{HERE}:{os.environ.get('PYTHONPATH', '')}"})
    try:
        await run.start()
        _, d = await run.time_to(lambda d: {"no_signal", "dead_letters"} <= set(causes(d)), 0.0, 240,
                                 "no_signal and dead_letters named")
        assert errors(d) == [], d  # warnings: the run advances on them
        dl = next(f for f in d["findings"] if f["cause"] == "dead_letters")
        assert "over the limit" in dl["summary"], dl
    finally:
        await run.close()

