"""The policy update, the same for every backend: PPO minibatches (one optimizer step each), proximal
logprobs, packed micro-batches, the policy loss (trainer.algorithm.objective), gradient accumulation,
grad-norm clipping, LR schedule. Statistics come back summed over ranks.

A backend (backends/base.py:TrainBackend, whose `train_step` calls this module's) supplies the forward
pass, the optimizer and the collectives; this module holds the order of operations only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from shared.config import TrainerConfig
from trainer_service.algorithms.losses import kl_k3, policy_terms, token_coefficients
from trainer_service.packing import (
    PackedBatch,
    TrainItem,
    dummy_item,
    pack,
    pack_shared,
    plan_micro_batches,
    plan_shared_micro_batches,
    split_for_ranks,
)

STAT_KEYS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "capped_frac", "behav_weight", "ratio", "loss_tokens",
             "tokens", "adv_abs")


def lr_lambda(cfg: TrainerConfig, total_steps: int):
    """Multiplier of the peak LR at optimizer step s: linear warmup, then constant/linear/cosine decay."""
    o = cfg.optim
    # The schedule counts optimizer steps: ppo_epochs x ppo_minibatches of them per trained batch.
    decay = o.decay_steps or total_steps * cfg.algorithm.ppo_minibatches * cfg.algorithm.ppo_epochs or 1000

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
                           all_reduce_max, shared_prompts: bool = False) -> list[PackedBatch]:
    """This rank's packed micro-batches; every rank ends up with the same number (zero-weight fillers).
    shared_prompts: pack each prompt group's common prefix once (packing.pack_shared)."""
    shares = split_for_ranks([it.length for it in items], world)
    mine = [items[i] for i in shares[rank]]
    if shared_prompts:
        plan = plan_shared_micro_batches(mine, budget)
        batches = [pack_shared([mine[i] for i in idx]) for idx in plan]
    else:
        plan = plan_micro_batches([it.length for it in mine], budget)
        batches = [pack([mine[i] for i in idx]) for idx in plan]
    n = all_reduce_max(len(plan))
    while len(batches) < n:
        batches.append(pack([dummy_item()]))
    return batches


def assign_coefficients(items: Sequence[TrainItem], cfg: TrainerConfig, norm_length: int) -> None:
    a = cfg.algorithm
    coefs = token_coefficients([it.num_loss_tokens for it in items], a.normalisation, a.norm_length or norm_length)
    for it, c in zip(items, coefs, strict=True):
        it.coef = c


def split_minibatches(n_items: int, k: int) -> list[range]:
    """Item indices of each of the k PPO minibatches: contiguous runs (a batch's items come group by
    group, so whole groups stay together when k divides the number of groups), sizes differing by at
    most one. k above the number of items gives one minibatch per item."""
    k = max(1, min(k, n_items))
    base, extra = divmod(n_items, k)
    out, start = [], 0
    for j in range(k):
        size = base + (1 if j < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


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


def train_step(backend, items: Sequence[TrainItem], cfg: TrainerConfig, norm_length: int = 64) -> dict:
    """Update the policy of `backend` (a backends.base.TrainBackend; not imported here, which imports
    this module) on the whole batch `items` (identical on every rank): `ppo_epochs` passes over it, each
    `ppo_minibatches` optimizer steps, one per minibatch (in the same order every pass). Returns stats
    (summed over ranks, then normalised) for events and metrics.

    Proximal logprobs (decoupled PPO's pi_prox) are the policy before the first optimizer step. With one
    step in all they equal the training forward's own logprobs, so they are taken from it (detached) and
    no proximal pass runs; with k > 1 steps one no-grad pass over the whole batch computes them first, and
    the clipped ratio pi_theta/pi_prox moves away from 1 from the second step on.

    `timings`: rank 0's seconds in forward (proximal, reference and training forwards), backward and
    optimizer; the rest of `step_time_s` is packing, transfers and collectives (trainer_service/timings.py).
    """
    t0 = time.perf_counter()
    clock = StageClock(backend.device)
    a = cfg.algorithm
    parts = [[items[i] for i in r] for r in split_minibatches(len(items), a.ppo_minibatches)]
    minis = []
    for part in parts:
        assign_coefficients(part, cfg, norm_length)
        minis.append([m.to(backend.device) for m in
                      micro_batches_for_rank(part, cfg.micro_batch_tokens, backend.rank, backend.world_size,
                                             backend.all_reduce_max, getattr(backend, "shared_prompts", False))])
    prox: list[list[torch.Tensor]] | None = None
    order = list(range(len(minis))) * a.ppo_epochs  # the minibatch of each optimizer step
    # `reinforce` (no correction) never reads pi_prox: no proximal pass for it.
    if a.decoupled and len(order) > 1 and a.objective != "reinforce":
        clock("forward")
        with torch.no_grad():
            prox = [[backend.forward(m, which="policy", entropy=False)[0].detach() for m in micro] for micro in minis]
        clock(None)
    sums = torch.zeros(len(order), len(STAT_KEYS), dtype=torch.float64)
    norms = []
    for s_i, j in enumerate(order):
        micro = minis[j]
        backend.zero_grad()
        for i, m in enumerate(micro):
            clock("forward")
            logp, entropy = backend.forward(m, which="policy", grad=True)
            if prox is not None:
                prox_logp = prox[j][i]
            else:  # one step: the policy has not moved yet, pi_prox = pi_theta (decoupled) or behav
                prox_logp = logp.detach() if a.decoupled else m.behav_logp
            terms = policy_terms(a.objective, logp, prox_logp, m.behav_logp, m.advantages, eps_clip=a.eps_clip,
                                 eps_clip_high=a.eps_clip_high, cap=a.behav_imp_weight_cap,
                                 mode=a.behav_imp_weight_mode, floor=a.behav_imp_weight_floor, mask=m.mask,
                                 seq_index=m.seq_index)
            tok = terms.loss
            if a.kl_coef > 0:
                with torch.no_grad():
                    ref = backend.forward(m, which="ref", entropy=False)[0].detach()
                kl = kl_k3(logp, ref)
            else:
                kl = torch.zeros_like(logp)
            tok = tok + a.kl_coef * kl - a.entropy_coef * entropy
            w = m.mask * m.coef
            loss = (tok * w).sum()
            # Backends average gradients over ranks; the loss is a sum over the whole batch, so scale back.
            clock("backward")
            backend.backward(loss * backend.world_size)
            clock(None)
            with torch.no_grad():
                mk = m.mask
                sums[s_i] += torch.tensor([
                    float(loss), float((terms.loss * w).sum()), float((kl * mk).sum()), float((entropy * mk).sum()),
                    float((terms.clipped * mk).sum()), float((terms.capped * mk).sum()),
                    float((terms.behav_weight * mk).sum()), float((terms.ratio * mk).sum()), float(mk.sum()),
                    float(m.num_tokens if m.coef.abs().sum() > 0 else 0), float((m.advantages.abs() * mk).sum()),
                ], dtype=torch.float64)
        clock("optimizer")
        norms.append(backend.clip_and_step(cfg.optim.grad_clip))
        backend.zero_grad()  # the gradients go now, not at the next backward: not held while publishing
        clock(None)
    per = backend.all_reduce_sum(sums)
    s = dict(zip(STAT_KEYS, per.sum(0).tolist(), strict=True))
    n = max(s["loss_tokens"], 1.0)
    k = len(order)
    loss_col, clip_col, tok_col = (STAT_KEYS.index(x) for x in ("loss", "clip_frac", "loss_tokens"))
    dt = time.perf_counter() - t0
    return {
        # loss / pg_loss: each minibatch's loss is normalised over its own tokens; their mean over the k steps.
        "loss": s["loss"] / k, "pg_loss": s["pg_loss"] / k, "kl": s["kl"] / n, "entropy": s["entropy"] / n,
        "clip_frac": s["clip_frac"] / n, "capped_frac": s["capped_frac"] / n,
        "behav_weight_mean": s["behav_weight"] / n, "ratio_mean": s["ratio"] / n, "adv_abs_mean": s["adv_abs"] / n,
        # the batch's tokens (each pass counts them once more), and their rate over the whole step
        "loss_tokens": int(s["loss_tokens"]) // a.ppo_epochs, "tokens": int(s["tokens"]) // a.ppo_epochs,
        "grad_norm": sum(norms) / k,
        "lr": backend.current_lr(), "micro_batches": a.ppo_epochs * sum(len(mb) for mb in minis),
        "ppo_minibatches": len(minis), "ppo_epochs": a.ppo_epochs,
        "minibatch_loss": [float(r[loss_col]) for r in per],
        "minibatch_clip_frac": [float(r[clip_col]) / max(float(r[tok_col]), 1.0) for r in per],
        "step_time_s": dt, "tokens_per_s": s["tokens"] / a.ppo_epochs / dt if dt > 0 else 0.0, "timings": clock.seconds,
    }
