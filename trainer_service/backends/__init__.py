"""Training backends behind one interface (base.TrainBackend): fsdp (FSDP2) and megatron (Megatron-Core)."""

from __future__ import annotations


def make_backend(cfg):
    """The backend named by `cfg.trainer.backend`, built on this process's rank."""
    if cfg.trainer.backend == "fsdp":
        from trainer_service.backends.fsdp import FSDPBackend

        return FSDPBackend(cfg)
    if cfg.trainer.backend == "megatron":
        from trainer_service.backends.megatron import MegatronBackend

        return MegatronBackend(cfg)
    raise ValueError(f"trainer.backend: unknown backend {cfg.trainer.backend!r}; use fsdp or megatron")
