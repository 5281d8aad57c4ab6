"""The experiment-tracker sink (`jetrl track`): one more subscriber of the bus (tracking/)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.config.base import Section


class TrackingConfig(Section):
    enabled: bool = Field(False, description="`jetrl up` / `jetrl demo` start `jetrl track` with the settings below.")
    to: Literal["tensorboard", "wandb", "trackio"] = Field(
        "tensorboard", description="Tracker: tensorboard (event files in `dir`), wandb (a run in `dir`; offline unless "
        "wandb_mode is online), or trackio (a local SQLite project under `dir`).")
    dir: str = Field("", description="Where the tracker writes ('' = `<run dir>/tracking` under `jetrl up`, "
                     "./jetrl-tracking otherwise).")
    project: str = Field("jetrl", min_length=1, max_length=128, description="wandb / trackio project name.")
    name: str = Field("", max_length=128, description="Tracker run name ('' = the run id).")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline", description="wandb: offline writes the run dir only (`wandb sync` uploads it later); online needs "
        "WANDB_API_KEY and a network.")
    from_start: bool = Field(True, description="Replay the run's retained events and trajectories from the start "
                             "of the streams (False: only what arrives from now on).")
    flush_every_s: float = Field(5.0, gt=0, description="How often the tracker's buffers are flushed to disk.")
    nice: int = Field(10, ge=0, le=19, description="CPU priority the tracker gives up (Unix `nice` increment): an "
                      "observer yields to the trainer and rollout workers on a busy host and catches up when they "
                      "idle (the streams keep what it has not read yet). 0 = the default priority.")
