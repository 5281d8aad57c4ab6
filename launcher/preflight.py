"""Checks `jetrl up` makes before starting anything: a config that cannot run on this host fails at once,
naming the field, instead of a child that crashes on it over and over."""

from __future__ import annotations

import os
import shutil

from shared.config import JetrlConfig


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def preflight(cfg: JetrlConfig, gpus=_gpus) -> list[str]:
    """Problems that stop `cfg` from running on this host, one line each naming the field ([] = none).
    `gpus()` counts this host's CUDA devices (asked only when the config names cuda)."""
    errors: list[str] = []
    t, r = cfg.trainer, cfg.rollout
    wants_cuda = t.device == "cuda" or t.backend == "megatron" or str(r.device).startswith("cuda")
    n = gpus() if wants_cuda else 0
    if t.device == "cuda" and n == 0:
        errors.append("trainer.device: cuda requested but torch sees no GPU on this host "
                      "(set trainer.device=cpu, or auto)")
    elif t.device == "cuda" and t.nproc > n:
        errors.append(f"trainer.nproc: {t.nproc} ranks on cuda but this host has {n} GPU(s)")
    if t.backend == "megatron" and n == 0:
        errors.append("trainer.backend: megatron needs a CUDA GPU and torch sees none (use fsdp on a CPU host)")
    if r.engine == "local" and str(r.device).startswith("cuda") and n == 0:
        errors.append(f"rollout.device: {r.device} requested but torch sees no GPU on this host (set rollout.device=cpu)")
    if r.engine == "vllm" and r.vllm.start_server:
        py = r.vllm.python
        if not (os.path.isfile(py) and os.access(py, os.X_OK)) and not shutil.which(py):
            errors.append(f"rollout.vllm.python: {py!r} is not an executable python (a python with vllm installed, "
                          "or rollout.vllm.start_server=false and rollout.vllm.url of a running server)")
    if t.nnodes > 1:
        errors.append(f"trainer.nnodes: {t.nnodes} nodes, but `jetrl up` runs one host; start `jetrl trainer` "
                      "on each node (docs/trainer.md, multi-node)")
    return errors
