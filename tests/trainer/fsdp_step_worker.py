"""Run under torchrun by test_trainer_fsdp.py: one optimizer step of the FSDP backend on a fixed batch;
rank 0 saves the full updated state dict (and the step stats) to argv[1]."""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

from shared.config import JetrlConfig
from trainer_service.backends.base import exit_rank
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem
from trainer_service.step import train_step


def fixed_items() -> list[TrainItem]:
    rng = np.random.default_rng(7)
    items = []
    for k, n in enumerate((9, 23, 5, 14, 31, 8, 12)):
        p = min(4, n - 1)
        mask = np.array([0] * p + [1] * (n - p), np.uint8)
        items.append(TrainItem(tokens=rng.integers(4, 60, size=n).astype(np.int32), loss_mask=mask,
                               behav_logp=np.where(mask == 1, rng.uniform(-5, -3, size=n), 0.0).astype(np.float32),
                               advantage=float(rng.normal()), group_id=f"g{k}"))
    return items


def main(out: str, extra: list[str]) -> None:
    from shared.config import load_config

    # adam_eps well above gradient round-off: on the first AdamW step a ~1e-9 gradient would otherwise
    # become a full +-lr update whose sign is decided by summation order.
    cfg = load_config(JetrlConfig, None, ["trainer.optim.lr=0.01", "trainer.optim.adam_eps=1e-4", "trainer.micro_batch_tokens=32",
                                          "trainer.device=cpu", *extra])
    backend = FSDPBackend(cfg)
    # JETRL_TEST_CKPT=<dir>:save -> a step, a checkpoint, then the step below; <dir>:resume -> load that
    # checkpoint, then the step below (a resumed run must end where the uninterrupted one did)
    ckpt = os.environ.get("JETRL_TEST_CKPT", "")
    if ckpt.endswith(":save"):
        train_step(backend, fixed_items()[:3], cfg.trainer)
        backend.save_checkpoint(ckpt.removesuffix(":save"), {"step": 1})
    elif ckpt.endswith(":resume"):
        torch.manual_seed(123)  # the resumed processes' RNG differs until the checkpoint restores it
        assert backend.load_checkpoint(ckpt.removesuffix(":resume"))["step"] == 1
    stats = train_step(backend, fixed_items(), cfg.trainer)
    sd = backend.full_state_dict()
    if backend.rank == 0:
        torch.save({"state": sd, "stats": stats, "world": backend.world_size}, out)
    if backend.world_size > 1:  # leave together: a rank tearing gloo down while rank 0 still writes aborts
        torch.distributed.barrier()
    backend.close()
    if backend.world_size > 1:  # as trainer_service.main does: no interpreter shutdown under gloo
        exit_rank(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
