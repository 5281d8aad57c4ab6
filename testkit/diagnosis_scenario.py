"""Runs driven into each cause `jetrl why` names, shared by tests/fault/test_diagnosis.py and bench/diagnosis.py.

`DiagnosedRun` is one real `jetrl up` run (launcher.up.Launcher: embedded nats-server, SQLite, local engine,
the tiny policy on maxdigit) with short diagnosis thresholds (controller.diagnosis_alive_s /
diagnosis_stall_s, telemetry.events_interval_s 1 s), so a fault is named within seconds. `time_to(cause)`
polls GET /v1/runs/{run}/diagnosis until a finding of that cause appears and returns the seconds since the
fault and the diagnosis.

Faults (each `fault_*` injects one, waits for its diagnosis, and undoes it when it can):
- reward replica SIGSTOPped (never answers, stops reporting) -> reward_unavailable;
- weight store SIGSTOPped -> weight_store_down;
- trainer SIGSTOPped -> trainer_dead;
- the rollout worker SIGKILLed, not restarted -> no_rollout_worker (and, once the trainer starves, the
  run stalled);
- separate runs: the weight store's root on a small tmpfs -> disk_full; a scorer that always returns 0
  plus a prompt too long for the model -> no_signal and dead_letters; a run whose data ends -> complete.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from launcher.demo.run import digit_token_ids
from launcher.demo.task import write_dataset
from launcher.plan import UpOptions
from launcher.up import Launcher, poll_until  # noqa: F401 - poll_until: for the scenario's users
from shared.config import JetrlConfig, load_config

BASE = {
    "nats": {"embedded": True},
    "telemetry": {"events_interval_s": 1.0, "wait_deadline_s": 5.0},
    "controller": {"diagnosis_alive_s": 4.0, "diagnosis_stall_s": 8.0},
    "reward": {"task": "maxdigit", "timeout_s": 2.0, "retries": 1},
    "schedule": {"batch_size": 4, "max_staleness": 2, "total_steps": 0},
    # answers drawn from the ten digits (the sort demo's mask): the untrained policy scores ~0.1 with a spread
    "rollout": {"group_size": 8, "sampling": {"max_new_tokens": 1, "allowed_token_ids": digit_token_ids()}},
    "trainer": {"checkpoint_every": 1000},
}


def merged(base: dict, extra: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for k, v in extra.items():
        out[k] = merged(out.get(k, {}), v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class DiagnosedRun:
    def __init__(self, tmp: Path, run: str, settings: dict | None = None, prompts: int = 4000,
                 extra_rows: list[dict] | None = None, env: dict[str, str] | None = None, reward_replicas: int = 1):
        self.tmp, self.run = Path(tmp), run
        data = merged(BASE, settings or {})
        data["run"] = run
        cfg_file = self.tmp / f"{run}.yaml"
        cfg_file.write_text(json.dumps(data))  # YAML is a superset of JSON
        self.cfg = load_config(JetrlConfig, str(cfg_file), [])
        train, _ = write_dataset(self.tmp / f"{run}-data", train=prompts, heldout=1)
        if extra_rows:  # first in the file: released at once
            train.write_text("".join(json.dumps(r) + "\n" for r in extra_rows) + train.read_text())
        self.dataset = train
        self.launcher = Launcher(self.cfg, UpOptions(run_dir=self.tmp / run, echo_logs=False, with_eval=False,
                                                     env=env or {}, reward_replicas=reward_replicas))
        self.stopped: list[str] = []  # SIGSTOPped children, continued before the stop

    async def start(self) -> None:
        await self.launcher.start(timeout_s=240)
        await self.launcher.enqueue(str(self.dataset))

    async def close(self) -> None:
        for name in self.stopped:
            self.launcher.sup.kill(name, signal.SIGCONT)
        await self.launcher.stop()

    async def why(self) -> dict:
        r = await self.launcher.http.get(f"/v1/runs/{self.run}/diagnosis")
        r.raise_for_status()
        return r.json()

    async def steps(self) -> int:
        await self.launcher.poll()
        return len(self.launcher.steps)

    async def until_steps(self, n: int, timeout_s: float = 240) -> None:
        async def enough():
            if self.launcher.sup.failure is not None:
                raise AssertionError(self.launcher.sup.failure.message())
            return await self.steps() >= n

        await poll_until(enough, timeout_s, f"{n} trainer steps of run {self.run}")

    async def time_to(self, check, t0: float, timeout_s: float, what: str) -> tuple[float, dict]:
        """Poll the diagnosis until `check(diagnosis)`; (seconds since t0, the diagnosis)."""
        last: dict = {}

        async def seen():
            nonlocal last
            last = await self.why()
            return check(last)

        try:
            await poll_until(seen, timeout_s, what, every_s=0.5)
        except Exception as exc:
            raise AssertionError(f"{what}: last diagnosis {json.dumps(last)[:3000]}") from exc
        return time.time() - t0, last

    async def time_to_cause(self, cause: str, t0: float, timeout_s: float = 90) -> tuple[float, dict]:
        return await self.time_to(lambda d: cause in causes(d), t0, timeout_s, f"`jetrl why` to name {cause}")

    async def until_advancing(self, timeout_s: float = 120) -> dict:
        _, d = await self.time_to(lambda d: d["state"] == "advancing" and not errors(d), time.time(), timeout_s,
                                  "the run to advance again")
        return d

    def signal(self, name: str, sig: int) -> None:
        self.launcher.sup.kill(name, sig)
        if sig == signal.SIGSTOP:
            self.stopped.append(name)
        elif sig == signal.SIGCONT and name in self.stopped:
            self.stopped.remove(name)

    async def fault_stopped(self, name: str, cause: str) -> tuple[float, dict]:
        """SIGSTOP child `name` until `cause` is named, then SIGCONT it and wait for the run to advance."""
        t0 = time.time()
        self.signal(name, signal.SIGSTOP)
        try:
            return await self.time_to_cause(cause, t0)
        finally:
            self.signal(name, signal.SIGCONT)

    async def fault_rollout_killed(self) -> tuple[float, dict]:
        """SIGKILL the only rollout worker and keep it dead."""
        self.launcher.sup.children["rollout"].spec.restart = False
        t0 = time.time()
        self.signal("rollout", signal.SIGKILL)
        return await self.time_to_cause("no_rollout_worker", t0)


def causes(d: dict) -> list[str]:
    return [f["cause"] for f in d["findings"]]


def errors(d: dict) -> list[str]:
    """The causes that stop the run."""
    return [f["cause"] for f in d["findings"] if f["severity"] == "error"]


def problems(d: dict) -> list[str]:
    """Every cause but information (complete, paused): errors and warnings."""
    return [f["cause"] for f in d["findings"] if f["severity"] in ("error", "warning")]


def mount_tmpfs(path: Path, size: str) -> bool:
    """A tmpfs of `size` at `path` (root only); False when it cannot be mounted here."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)
