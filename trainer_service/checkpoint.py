"""Checkpoints with torch.distributed.checkpoint (DCP): model and optimizer (sharded, one file set per
rank), plus the LR scheduler, every rank's RNG state and the trainer's own state (version, step,
intake position, trained group ids) as `trainer_state.json`.

Layout: <checkpoint_dir>/<run>/step-<NNNNNNNN>/ {DCP files, scheduler.pt, rng-<rank>.pt, trainer_state.json,
COMPLETE}. A checkpoint counts only once COMPLETE exists (written last, by rank 0, after a barrier), so a
crash mid-save leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.json"


def run_dir(checkpoint_dir: str | Path, run: str) -> Path:
    return Path(checkpoint_dir) / run


def step_dir(checkpoint_dir: str | Path, run: str, step: int) -> Path:
    return run_dir(checkpoint_dir, run) / f"step-{step:08d}"


def complete_checkpoints(checkpoint_dir: str | Path, run: str) -> list[Path]:
    """Every complete checkpoint of `run`, oldest first."""
    root = run_dir(checkpoint_dir, run)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / COMPLETE).exists())


def step_of(path: Path) -> int:
    """The step of a checkpoint directory `step-NNNNNNNN`."""
    return int(path.name.removeprefix("step-"))


def latest_checkpoint(checkpoint_dir: str | Path, run: str, before_step: int | None = None) -> Path | None:
    """The newest complete checkpoint of `run` (with `before_step`: of a step below it), or None."""
    done = [p for p in complete_checkpoints(checkpoint_dir, run) if before_step is None or step_of(p) < before_step]
    return done[-1] if done else None


def prune(checkpoint_dir: str | Path, run: str, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (and any incomplete older ones)."""
    root = run_dir(checkpoint_dir, run)
    done = complete_checkpoints(checkpoint_dir, run)
    if not done:
        return
    newest_kept = done[-keep:]
    for p in root.glob("step-*"):
        if p not in newest_kept and p.name < newest_kept[0].name:
            shutil.rmtree(p, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    st = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def save(path: Path, state: dict[str, Any], scheduler, extra: dict, rank: int, barrier) -> None:
    """Collective: every rank calls it with its DCP `state` (model/optimizer state dicts)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    if rank == 0:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
    barrier()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process.*")
        dcp.save(state, checkpoint_id=str(path))
    torch.save(rng_state(), path / f"rng-{rank}.pt")
    if rank == 0:
        torch.save(scheduler.state_dict(), path / "scheduler.pt")
        (path / STATE_FILE).write_text(json.dumps(extra))
    barrier()
    if rank == 0:
        (path / COMPLETE).write_text("ok\n")


def load(path: Path, state: dict[str, Any], scheduler, rank: int) -> dict:
    """Collective: fills `state` in place from the checkpoint; returns the trainer state (extra)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    if not (path / COMPLETE).exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE} marker)")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(state, checkpoint_id=str(path))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng = path / f"rng-{rank}.pt"
    if rng.exists():
        set_rng_state(torch.load(rng, weights_only=False))
    return json.loads((path / STATE_FILE).read_text())
