"""Trainer: algorithm, optimisation, backend, checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.config.base import Section


class TrainerConfig(Section):
    backend: Literal["fsdp", "megatron"] = Field("fsdp", description="Training backend.")
    nproc: int = Field(1, ge=1, description="Processes (torchrun --nproc-per-node).")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate.")
    checkpoint_dir: str = Field("jetrl-checkpoints", description="Where checkpoints are written.")
    checkpoint_every: int = Field(10, ge=1, description="Checkpoint every N optimizer steps.")
    publish_every: int = Field(1, ge=1, description="Publish weights every N optimizer steps.")
