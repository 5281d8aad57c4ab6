"""A whole run through `jetrl up` (launcher.up.Launcher, every service a real process) for the tests that
train through it."""

from __future__ import annotations

from pathlib import Path

from launcher.plan import UpOptions
from launcher.up import Launcher, poll_until
from shared.config import JetrlConfig


async def run_until_trained(cfg: JetrlConfig, run_dir: Path, dataset: str | Path, timeout_s: float = 300,
                            rollouts: int = 0) -> tuple[dict, dict, dict | None]:
    """Start the run, enqueue `dataset`, wait until the trainer finished schedule.total_steps (a child that
    keeps crashing fails at once, with its log), stop everything: (the last status snapshot, the ledger, the
    rollout viewer's first page of `rollouts` groups, or None when 0)."""
    launcher = Launcher(cfg, UpOptions(run_dir=run_dir, echo_logs=False, with_eval=False))
    try:
        await launcher.start(timeout_s=240)
        await launcher.enqueue(str(dataset))

        async def done():
            snap = await launcher.poll()
            if launcher.sup.failure is not None:
                raise AssertionError(launcher.sup.failure.message())
            return launcher.trainer_done(snap) and snap

        snap = await poll_until(done, timeout_s, f"the trainer to finish {cfg.schedule.total_steps} steps")
        ledger = await launcher._check(await launcher.http.get(f"/v1/runs/{cfg.run}/ledger"))
        page = None
        if rollouts:
            page = await launcher._check(await launcher.http.get(f"/v1/runs/{cfg.run}/rollouts",
                                                                 params={"limit": rollouts}))
    finally:
        await launcher.stop()
    return snap, ledger, page
