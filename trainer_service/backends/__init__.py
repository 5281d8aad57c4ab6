"""Training backends behind one interface (base.TrainBackend): fsdp (FSDP2), megatron (Megatron-Core), and
sim (FSDP's weights with a step-cost model instead of the optimizer step, for benchmarks)."""

from __future__ import annotations


def make_backend(cfg):
    """The backend named by `cfg.trainer.backend`, built on this process's rank."""
    if cfg.trainer.backend == "fsdp":
        from trainer_service.backends.fsdp import FSDPBackend

        return FSDPBackend(cfg)
    if cfg.trainer.backend == "megatron":
        from trainer_service.backends.megatron import MegatronBackend

        return MegatronBackend(cfg)
    if cfg.trainer.backend == "sim":
        from trainer_service.backends.sim import SimBackend

        return SimBackend(cfg)
    raise ValueError(f"trainer.backend: unknown backend {cfg.trainer.backend!r}; use fsdp, megatron or sim")
