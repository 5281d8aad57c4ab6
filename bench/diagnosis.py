"""How fast `jetrl why` names a fault, and what asking costs a healthy run.

    python -m bench.diagnosis [--dir DIR] [--measure-s 60]

1. Time to diagnosis: one real `jetrl up` run (testkit/diagnosis_scenario.py: tiny policy on maxdigit, every
   service a process) with the controller's default thresholds (diagnosis_alive_s 15 s, diagnosis_stall_s
   30 s) and the demo's event interval (2 s). Each fault in turn -- the reward replica, the weight store
   and the trainer SIGSTOPped, then the rollout worker SIGKILLed for good -- and the seconds from the signal
   until GET /v1/runs/{run}/diagnosis names the cause. Target: within max(2 x the trainer's median step
   time, 30 s).
2. Overhead: the same healthy run's trainer steps/s over `--measure-s` with nobody asking, then with GET
   /v1/runs/{run}/diagnosis polled every second (what a dashboard or `watch jetrl why` does), in the order
   quiet, polled, polled, quiet (a drift over the run cancels out). Last line `diagnosis_overhead_ratio: X` (steps/s polled / steps/s not polled; target >= 0.97).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from testkit.diagnosis_scenario import DiagnosedRun

DEFAULTS = {"telemetry": {"events_interval_s": 2.0, "wait_deadline_s": 120.0},
            "controller": {"diagnosis_alive_s": 15.0, "diagnosis_stall_s": 30.0}}
FAULTS = [("reward", "reward_unavailable"), ("weights", "weight_store_down"), ("trainer", "trainer_dead")]


async def steps_per_s(run: DiagnosedRun, seconds: float, poll: bool) -> tuple[float, int]:
    """Trainer steps per second over `seconds`, with the diagnosis polled every second or not; (rate, polls)."""
    stop = asyncio.Event()
    polls = 0

    async def poller() -> None:
        nonlocal polls
        while not stop.is_set():
            await run.why()
            polls += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    task = asyncio.create_task(poller()) if poll else None
    n0, t0 = await run.steps(), time.monotonic()
    await asyncio.sleep(seconds)
    n1, t1 = await run.steps(), time.monotonic()
    stop.set()
    if task is not None:
        await task
    return (n1 - n0) / (t1 - t0), polls


async def main(work: Path, measure_s: float) -> None:
    run = DiagnosedRun(work, "bench", DEFAULTS, prompts=60_000)  # more than the measurements train
    try:
        await run.start()
        await run.until_steps(5)
        rates = {False: [], True: []}
        for poll in (False, True, True, False):  # ABBA: a drift over the run cancels out
            rate, polls = await steps_per_s(run, measure_s, poll)
            rates[poll].append(rate)
            print(f"  {'polled' if poll else 'quiet '}: {rate:.3f} steps/s ({polls} diagnoses)", flush=True)
        walls = [s.get("wall_s") for s in run.launcher.steps if isinstance(s.get("wall_s"), (int, float))]
        median = statistics.median(walls) if walls else 0.0
        target = max(2 * median, 30.0)
        print("| fault | named | seconds to diagnosis | target | summary |")
        print("| --- | --- | --- | --- | --- |")
        for child, cause in FAULTS:
            secs, d = await run.fault_stopped(child, cause)
            f = next(f for f in d["findings"] if f["cause"] == cause)
            print(f"| {child} SIGSTOP | {cause} | {secs:.1f} | {target:.0f} | {f['summary'][:120]} |", flush=True)
            await run.until_advancing(timeout_s=180)
        secs, d = await run.fault_rollout_killed()
        f = next(f for f in d["findings"] if f["cause"] == "no_rollout_worker")
        print(f"| rollout SIGKILL | no_rollout_worker | {secs:.1f} | {target:.0f} | {f['summary'][:120]} |")
        print(f"median trainer step: {median:.2f} s")
    finally:
        await run.close()
    quiet, polled = statistics.mean(rates[False]), statistics.mean(rates[True])
    print(f"steps/s quiet {quiet:.3f}, polled every second {polled:.3f}")
    print(f"diagnosis_overhead_ratio: {polled / quiet:.3f}")


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="Work dir (default: a temp dir, removed after).")
    ap.add_argument("--measure-s", type=float, default=60.0, help="Seconds per overhead measurement (4 of them).")
    a = ap.parse_args()
    work = a.dir or Path(tempfile.mkdtemp(prefix="jetrl-bench-diagnosis-"))
    try:
        asyncio.run(main(work, a.measure_s))
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    cli()
