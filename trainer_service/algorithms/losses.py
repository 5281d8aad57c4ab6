"""The policy objectives (decoupled PPO, GSPO, CISPO, REINFORCE) and their normalisations
(docs/algorithms.md, "Objective").

All functions are pure and work on flat per-token tensors (any shape, same for every argument).
`mask` is 1.0 on tokens the policy generated and 0.0 elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer_service.algorithms.corrections import behaviour_weight, sequence_log_ratio

NORMALISATIONS = ("token", "sequence", "fixed")
OBJECTIVES = ("ppo", "gspo", "cispo", "iw_reinforce", "reinforce")


@dataclass
class PPOTerms:
    """Per-token loss and the statistics of one evaluation (tensors, masked where it matters)."""

    loss: torch.Tensor  # per-token loss (already multiplied by the behaviour importance weight)
    ratio: torch.Tensor  # pi_theta / pi_prox
    behav_weight: torch.Tensor  # pi_prox / pi_behav after capping
    clipped: torch.Tensor  # 1.0 where the clipped branch was chosen
    capped: torch.Tensor  # 1.0 where the behaviour weight exceeded the cap


def decoupled_ppo_terms(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    behav_imp_weight_cap: float | None = None,
    cap_mode: str = "mask",
    *,
    floor: float | None = None,
    mask: torch.Tensor | None = None,
    seq_index: torch.Tensor | None = None,
) -> PPOTerms:
    """Decoupled PPO (Fu et al. 2025, AReaL), per token:

        w     = behaviour correction of pi_prox / pi_behav  (no gradient; corrections.py)
        r     = pi_theta / pi_prox
        loss  = w * max(-A r, -A clip(r, 1 - eps, 1 + eps_high))

    With prox = behav, w = 1 and this is PPO's clipped surrogate (Schulman et al. 2017).
    """
    return policy_terms("ppo", logp, prox_logp, behav_logp, advantages, eps_clip=eps_clip,
                        eps_clip_high=eps_clip_high, cap=behav_imp_weight_cap, mode=cap_mode, floor=floor,
                        mask=mask, seq_index=seq_index)


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float):
    unclipped = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, low, high)
    return torch.maximum(unclipped, clipped_loss), (clipped_loss > unclipped)


def policy_terms(
    objective: str,
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    cap: float | None = None,
    mode: str = "mask",
    floor: float | None = None,
    mask: torch.Tensor | None = None,
    seq_index: torch.Tensor | None = None,
) -> PPOTerms:
    """Per-token policy loss of `objective` (trainer.algorithm.objective), times the behaviour
    correction w (`mode`, corrections.py). r = pi_theta / pi_prox, lo/hi = 1 - eps_clip, 1 + eps_clip_high:

      ppo           w * max(-A r, -A clip(r, lo, hi))                 (PPO; decoupled PPO, AReaL)
      gspo          w * max(-A s, -A clip(s, lo, hi)),  s = sg[s_i] * pi_theta / sg[pi_theta],
                    s_i = exp(mean over sequence i's tokens of log r)   (GSPO-token, Zheng et al. 2025)
      cispo         -w * sg[clip(r, lo, hi)] * A * log pi_theta        (CISPO, MiniMax-M1 2025)
      iw_reinforce  -w * A * r                                         (importance-weighted REINFORCE)
      reinforce     -A * log pi_theta, w = 1                           (no correction at all)

    Gradients: iw_reinforce at theta = prox is -w A grad log pi_theta; cispo's clipped weight carries no
    gradient, so every token keeps a gradient (unlike PPO's clip, which zeroes it).
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    lo, hi = 1.0 - eps_clip, 1.0 + high
    prox = prox_logp.detach()
    if mask is None:
        mask = torch.ones_like(logp)
    if seq_index is None:
        seq_index = torch.zeros(logp.shape, dtype=torch.long, device=logp.device)
    if objective == "reinforce":
        w, changed = torch.ones_like(logp), torch.zeros_like(logp)
    else:
        w, changed = behaviour_weight(prox, behav_logp.detach(), cap, mode, floor=floor, mask=mask,
                                      seq_index=seq_index)
    ratio = torch.exp(logp - prox)
    no_clip = torch.zeros_like(logp)
    if objective == "ppo":
        loss, clipped = _clipped_surrogate(ratio, advantages, lo, hi)
    elif objective == "gspo":
        seq_log = sequence_log_ratio(logp - prox, mask, seq_index, mean=True)
        s = torch.exp(seq_log.detach() + logp - logp.detach())
        loss, clipped = _clipped_surrogate(s, advantages, lo, hi)
    elif objective == "cispo":
        r_hat = torch.clamp(ratio, lo, hi).detach()
        loss = -r_hat * advantages * logp
        clipped = (ratio < lo) | (ratio > hi)
    elif objective == "iw_reinforce":
        loss, clipped = -advantages * ratio, no_clip
    elif objective == "reinforce":
        loss, clipped = -advantages * logp, no_clip
    else:
        raise ValueError(f"trainer.algorithm.objective: unknown objective {objective!r}; use one of {OBJECTIVES}")
    return PPOTerms(loss=loss * w, ratio=ratio, behav_weight=w, clipped=clipped.to(logp.dtype), capped=changed)


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
