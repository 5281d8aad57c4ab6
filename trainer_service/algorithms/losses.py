"""The decoupled PPO objective and its normalisations (docs/algorithms.md, "Objective").

All functions are pure and work on flat per-token tensors (any shape, same for every argument).
`mask` is 1.0 on tokens the policy generated and 0.0 elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

NORMALISATIONS = ("token", "sequence", "fixed")


@dataclass
class PPOTerms:
    """Per-token loss and the statistics of one evaluation (tensors, masked where it matters)."""

    loss: torch.Tensor  # per-token loss (already multiplied by the behaviour importance weight)
    ratio: torch.Tensor  # pi_theta / pi_prox
    behav_weight: torch.Tensor  # pi_prox / pi_behav after capping
    clipped: torch.Tensor  # 1.0 where the clipped branch was chosen
    capped: torch.Tensor  # 1.0 where the behaviour weight exceeded the cap


def behaviour_weight(prox_logp: torch.Tensor, behav_logp: torch.Tensor, cap: float | None,
                     mode: str = "mask") -> tuple[torch.Tensor, torch.Tensor]:
    """pi_prox / pi_behav per token, capped: `mask` zeroes tokens above the cap (AReaL), `truncate`
    clamps them to the cap (truncated importance sampling). Returns (weight, capped indicator)."""
    w = torch.exp(prox_logp - behav_logp)
    if cap is None:
        return w, torch.zeros_like(w)
    over = w > cap
    if mode == "mask":
        w = torch.where(over, torch.zeros_like(w), w)
    elif mode == "truncate":
        w = torch.clamp(w, max=cap)
    else:
        raise ValueError(f"behaviour weight mode {mode!r}: use mask or truncate")
    return w, over.to(w.dtype)


def decoupled_ppo_terms(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    behav_imp_weight_cap: float | None = None,
    cap_mode: str = "mask",
) -> PPOTerms:
    """Decoupled PPO (Fu et al. 2025, AReaL), per token:

        w     = pi_prox / pi_behav                      (no gradient; capped)
        r     = pi_theta / pi_prox
        loss  = w * max(-A r, -A clip(r, 1 - eps, 1 + eps_high))

    With prox = behav, w = 1 and this is PPO's clipped surrogate (Schulman et al. 2017).
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    w, capped = behaviour_weight(prox_logp.detach(), behav_logp.detach(), behav_imp_weight_cap, cap_mode)
    ratio = torch.exp(logp - prox_logp.detach())
    unclipped = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = (clipped_loss > unclipped).to(logp.dtype)
    return PPOTerms(loss=loss * w, ratio=ratio, behav_weight=w, clipped=clipped, capped=capped)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate k3 = exp(q - p) - (q - p) - 1 with p = log pi_theta,
    q = log pi_ref (Schulman 2020, "Approximating KL divergence"; used by GRPO). Always >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def token_coefficients(lengths: Sequence[int], mode: str = "token", norm_length: int = 0) -> list[float]:
    """Weight of each loss token of each sequence so that sum(weight * per_token_loss) is the batch loss.

    lengths: loss tokens per sequence (the whole optimizer batch, across micro-batches and ranks).
      token:    1 / sum(lengths)                     (every token counts the same; DAPO)
      sequence: 1 / (n_seq * lengths[i])             (mean per sequence, then over sequences; GRPO)
      fixed:    1 / (n_seq * norm_length)            (constant length; Dr. GRPO)
    Returns one coefficient per sequence (apply to each of its loss tokens). Sequences without loss
    tokens get 0 and are not counted in n_seq.
    """
    if not lengths:
        return []
    n = sum(1 for length in lengths if length)  # sequences without loss tokens do not count
    if mode == "token":
        total = sum(lengths)
        return [1.0 / total if total and length else 0.0 for length in lengths]
    if mode == "sequence":
        return [1.0 / (n * length) if length else 0.0 for length in lengths]
    if mode == "fixed":
        if norm_length <= 0:
            raise ValueError("trainer.algorithm.norm_length must be > 0 for fixed normalisation")
        return [1.0 / (n * norm_length) if length else 0.0 for length in lengths]
    raise ValueError(f"trainer.algorithm.normalisation: unknown mode {mode!r}; use one of {NORMALISATIONS}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim, per position."""
    logz = torch.logsumexp(logits, dim=-1)
    p = torch.softmax(logits, dim=-1)
    return logz - (p * logits).sum(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = float(mask.sum())
    return float((x * mask).sum()) / n if n else 0.0
