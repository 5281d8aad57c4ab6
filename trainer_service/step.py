"""One optimizer step, the same for every backend: proximal pass, packed micro-batches, the policy
loss (trainer.algorithm.objective), gradient accumulation, grad-norm clipping, LR schedule. Statistics
come back summed over ranks.

A backend (backends/base.py) supplies the forward pass, the optimizer and the collectives; this module
holds the order of operations only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from shared.config import TrainerConfig
from trainer_service.algorithms.losses import kl_k3, policy_terms, token_coefficients
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


def train_step(backend: TrainBackend, items: Sequence[TrainItem], cfg: TrainerConfig, norm_length: int = 64) -> dict:
    """Run one optimizer step on the whole batch `items` (identical on every rank). Returns stats
    (summed over ranks, then normalised) for events and metrics."""
    t0 = time.perf_counter()
    a = cfg.algorithm
    assign_coefficients(items, cfg, norm_length)
    micro = [m.to(backend.device) for m in
             micro_batches_for_rank(items, cfg.micro_batch_tokens, backend.rank, backend.world_size,
                                    backend.all_reduce_max)]
    # Proximal (and reference) logprobs: the policy before this update, no gradient.
    prox, ref = [], []
    with torch.no_grad():
        for m in micro:
            # `reinforce` (no correction) never reads pi_prox: skip the pass.
            recompute = a.decoupled and a.objective != "reinforce"
            prox.append(backend.forward(m, which="policy")[0].detach() if recompute else m.behav_logp)
            if a.kl_coef > 0:
                ref.append(backend.forward(m, which="ref")[0].detach())
    backend.zero_grad()
    sums = torch.zeros(len(STAT_KEYS), dtype=torch.float64)
    for k, m in enumerate(micro):
        logp, entropy = backend.forward(m, which="policy", grad=True)
        terms = policy_terms(a.objective, logp, prox[k], m.behav_logp, m.advantages, eps_clip=a.eps_clip,
                             eps_clip_high=a.eps_clip_high, cap=a.behav_imp_weight_cap,
                             mode=a.behav_imp_weight_mode, floor=a.behav_imp_weight_floor, mask=m.mask,
                             seq_index=m.seq_index)
        tok = terms.loss
        kl = kl_k3(logp, ref[k]) if a.kl_coef > 0 else torch.zeros_like(logp)
        tok = tok + a.kl_coef * kl - a.entropy_coef * entropy
        w = m.mask * m.coef
        loss = (tok * w).sum()
        # Backends average gradients over ranks; the loss is a sum over the whole batch, so scale back.
        backend.backward(loss * backend.world_size)
        with torch.no_grad():
            mk = m.mask
            sums += torch.tensor([
                float(loss), float((terms.loss * w).sum()), float((kl * mk).sum()), float((entropy * mk).sum()),
                float((terms.clipped * mk).sum()), float((terms.capped * mk).sum()),
                float((terms.behav_weight * mk).sum()), float((terms.ratio * mk).sum()), float(mk.sum()),
                float(m.num_tokens if m.coef.abs().sum() > 0 else 0), float((m.advantages.abs() * mk).sum()),
            ], dtype=torch.float64)
    grad_norm = backend.clip_and_step(cfg.optim.grad_clip)
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
        "tokens_per_s": s["tokens"] / dt if dt > 0 else 0.0,
    }
