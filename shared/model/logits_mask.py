"""The allowed-token logits mask (`rollout.sampling.allowed_token_ids`), shared by the local engine
and the trainer so that a behaviour logprob and the trainer's logprob of the same token come from the
same distribution: softmax over the allowed tokens only.

Disallowed logits are set to MASKED (a large finite negative, not -inf): exp underflows to exactly 0
in float32, so the allowed tokens' logprobs equal those of a -inf mask, while entropies and products
such as p * logit stay finite (0 * -inf would be NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MASKED = -1.0e9


def allowed_vector(allowed_token_ids: Sequence[int], vocab_size: int,
                   device: torch.device | str = "cpu") -> torch.Tensor | None:
    """A [V] bool vector, True for the allowed ids; None when no restriction is set. Ids outside the
    vocabulary are an error naming the option."""
    if not allowed_token_ids:
        return None
    bad = [t for t in allowed_token_ids if not 0 <= int(t) < vocab_size]
    if bad:
        raise ValueError(f"rollout.sampling.allowed_token_ids: {bad[:5]} outside the vocabulary [0, {vocab_size})")
    out = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    out[torch.tensor([int(t) for t in allowed_token_ids], dtype=torch.long, device=device)] = True
    return out


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor | None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """`logits` [N, V] with disallowed ids set to MASKED. `allowed` is a [V] or [N, V] bool tensor (None
    = unchanged). `rows` ([N] bool) limits the mask to those rows (the trainer masks only positions
    whose target the policy generated)."""
    if allowed is None:
        return logits
    keep = allowed if allowed.dim() == 2 else allowed[None, :]
    if rows is not None:
        keep = keep | ~rows.bool()[:, None]
    return logits.masked_fill(~keep, MASKED)
