"""One optimizer step, the same for every backend: proximal pass, packed micro-batches, decoupled PPO
loss, gradient accumulation, grad-norm clipping, LR schedule. Statistics come back summed over ranks.

A backend (backends/base.py) supplies the forward pass, the optimizer and the collectives; this module
holds the order of operations only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from shared.config import TrainerConfig
from trainer_service.algorithms.losses import decoupled_ppo_terms, kl_k3, token_coefficients
from trainer_service.backends.base import TrainBackend
from trainer_service.packing import (
    PackedBatch,
    TrainItem,
    dummy_item,
    pack,
    plan_micro_batches,
    split_for_ranks,
)

STAT_KEYS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "capped_frac", "behav_weight", "ratio", "loss_tokens",
             "tokens", "adv_abs")


def lr_lambda(cfg: TrainerConfig, total_steps: int):
    """Multiplier of the peak LR at optimizer step s: linear warmup, then constant/linear/cosine decay."""
    o = cfg.optim
    decay = o.decay_steps or total_steps or 1000

    def f(step: int) -> float:
        if o.warmup_steps and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.lr_schedule == "constant":
            return 1.0
        t = min(1.0, (step - o.warmup_steps) / max(1, decay))
        if o.lr_schedule == "linear":
            return 1.0 - (1.0 - o.min_lr_ratio) * t
        return o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    return f


def micro_batches_for_rank(items: Sequence[TrainItem], budget: int, rank: int, world: int,
                           all_reduce_max) -> list[PackedBatch]:
    """This rank's packed micro-batches; every rank ends up with the same number (zero-weight fillers)."""
    shares = split_for_ranks([it.length for it in items], world)
    mine = [items[i] for i in shares[rank]]
    plan = plan_micro_batches([it.length for it in mine], budget)
    n = all_reduce_max(len(plan))
    batches = [pack([mine[i] for i in idx]) for idx in plan]
    while len(batches) < n:
        batches.append(pack([dummy_item()]))
    return batches


def assign_coefficients(items: Sequence[TrainItem], cfg: TrainerConfig, norm_length: int) -> None:
    a = cfg.algorithm
    coefs = token_coefficients([it.num_loss_tokens for it in items], a.normalisation, a.norm_length or norm_length)
    for it, c in zip(items, coefs, strict=True):
        it.coef = c


class StageClock:
    """Seconds spent per stage (forward, backward, optimizer) of one step. On a GPU the device is
    synchronised at each boundary, so queued kernels are charged to the stage that launched them."""

    def __init__(self, device):
        self.sync = torch.cuda.synchronize if getattr(device, "type", "") == "cuda" else (lambda: None)
        self.seconds: dict[str, float] = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        self._stage, self._t = None, 0.0

    def __call__(self, stage: str | None) -> None:
        """Start `stage` (None: stop), charging the time since the last call to the running one."""
        self.sync()
        now = time.perf_counter()
        if self._stage is not None:
            self.seconds[self._stage] += now - self._t
        self._stage, self._t = stage, now


def train_step(backend: TrainBackend, items: Sequence[TrainItem], cfg: TrainerConfig, norm_length: int = 64) -> dict:
    """Run one optimizer step on the whole batch `items` (identical on every rank). Returns stats
    (summed over ranks, then normalised) for events and metrics, and `timings` (rank 0's seconds in
    forward, backward and optimizer; the rest of `step_time_s` is packing, transfers and collectives)."""
    t0 = time.perf_counter()
    clock = StageClock(backend.device)
    a = cfg.algorithm
    assign_coefficients(items, cfg, norm_length)
    micro = [m.to(backend.device) for m in
             micro_batches_for_rank(items, cfg.micro_batch_tokens, backend.rank, backend.world_size,
                                    backend.all_reduce_max)]
    # Proximal (and reference) logprobs: the policy before this update, no gradient.
    prox, ref = [], []
    clock("forward")
    with torch.no_grad():
        for m in micro:
            prox.append(backend.forward(m, which="policy")[0].detach() if a.decoupled else m.behav_logp)
            if a.kl_coef > 0:
                ref.append(backend.forward(m, which="ref")[0].detach())
    clock(None)
    backend.zero_grad()
    sums = torch.zeros(len(STAT_KEYS), dtype=torch.float64)
    for k, m in enumerate(micro):
        clock("forward")
        logp, entropy = backend.forward(m, which="policy", grad=True)
        terms = decoupled_ppo_terms(logp, prox[k], m.behav_logp, m.advantages, a.eps_clip, a.eps_clip_high,
                                    a.behav_imp_weight_cap, a.behav_imp_weight_mode)
        tok = terms.loss
        kl = kl_k3(logp, ref[k]) if a.kl_coef > 0 else torch.zeros_like(logp)
        tok = tok + a.kl_coef * kl - a.entropy_coef * entropy
        w = m.mask * m.coef
        loss = (tok * w).sum()
        # Backends average gradients over ranks; the loss is a sum over the whole batch, so scale back.
        clock("backward")
        backend.backward(loss * backend.world_size)
        clock(None)
        with torch.no_grad():
            mk = m.mask
            sums += torch.tensor([
                float(loss), float((terms.loss * w).sum()), float((kl * mk).sum()), float((entropy * mk).sum()),
                float((terms.clipped * mk).sum()), float((terms.capped * mk).sum()),
                float((terms.behav_weight * mk).sum()), float((terms.ratio * mk).sum()), float(mk.sum()),
                float(m.num_tokens if m.coef.abs().sum() > 0 else 0), float((m.advantages.abs() * mk).sum()),
            ], dtype=torch.float64)
    clock("optimizer")
    grad_norm = backend.clip_and_step(cfg.optim.grad_clip)
    clock(None)
    sums = backend.all_reduce_sum(sums)
    s = dict(zip(STAT_KEYS, sums.tolist(), strict=True))
    n = max(s["loss_tokens"], 1.0)
    dt = time.perf_counter() - t0
    return {
        "loss": s["loss"], "pg_loss": s["pg_loss"], "kl": s["kl"] / n, "entropy": s["entropy"] / n,
        "clip_frac": s["clip_frac"] / n, "capped_frac": s["capped_frac"] / n,
        "behav_weight_mean": s["behav_weight"] / n, "ratio_mean": s["ratio"] / n, "adv_abs_mean": s["adv_abs"] / n,
        "loss_tokens": int(s["loss_tokens"]), "tokens": int(s["tokens"]), "grad_norm": grad_norm,
        "lr": backend.current_lr(), "micro_batches": len(micro), "step_time_s": dt,
        "tokens_per_s": s["tokens"] / dt if dt > 0 else 0.0, "timings": clock.seconds,
    }
