"""Per-token log-probabilities (and entropies) of targets, from hidden states or logits.

The trainer needs log p(target) only at loss positions (tokens the policy generated), and the entropy
only where it is optimised or logged (the same positions). `chunked_token_logprobs` projects just those
positions' hidden states through the output head, `chunk` rows at a time, so no [tokens x vocabulary]
tensor of a micro-batch exists; under autograd each chunk is recomputed in backward (activation
checkpointing of the head), so the chunk's logits are not kept either.

`loss_position_head` plugs that into a Hugging Face causal LM's own forward: hooks on its output head
take the final hidden states, hand the head an empty slice (so it computes no logits), and return the
chunked logprobs instead; the model's forward (and FSDP's hooks around it) run unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from shared.model.logits_mask import allowed_vector, mask_logits
from trainer_service.algorithms.losses import entropy_from_logits

ENTROPY_MODES = ("none", "stat", "grad")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, entropy_grad: bool = False,
                   allowed_token_ids: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) per position from logits [T, V], computed in float32. The entropy is
    differentiable only with `entropy_grad` (an entropy bonus); otherwise it is a statistic.
    `allowed_token_ids` (rollout.sampling.allowed_token_ids): the softmax runs over those ids only, with
    the engine's mask (shared/model/logits_mask.py)."""
    logits = _allowed_only(logits.float(), allowed_token_ids)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    if entropy_grad:
        return logp, entropy_from_logits(logits)
    with torch.no_grad():
        return logp, entropy_from_logits(logits.detach())


def _allowed_only(logits: torch.Tensor, allowed_token_ids: Sequence[int]) -> torch.Tensor:
    if not allowed_token_ids:
        return logits
    return mask_logits(logits, allowed_vector(allowed_token_ids, logits.shape[-1], logits.device))


def _head_chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                entropy: str, allowed_token_ids: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _allowed_only(torch.nn.functional.linear(hidden, weight, bias).float(), allowed_token_ids)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if entropy == "grad":
        ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    elif entropy == "stat":
        with torch.no_grad():
            d = logits.detach()
            ent = lse.detach() - (torch.softmax(d, dim=-1) * d).sum(-1)
    else:
        ent = torch.zeros_like(lse.detach())
    return logp, ent


def chunked_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           targets: torch.Tensor, chunk: int = 1024, entropy: str = "stat",
                           allowed_token_ids: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy) for hidden states [N, H] through the head (weight [V, H], bias [V]),
    `chunk` rows at a time, in float32. entropy: "grad" (differentiable, an entropy bonus), "stat" (no
    gradient) or "none" (zeros). Equal to `token_logprobs(hidden @ weight.T + bias, targets)`."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy mode {entropy!r}: use one of {ENTROPY_MODES}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    lps, ents = [], []
    for a in range(0, hidden.shape[0], chunk):
        h, t = hidden[a:a + chunk], targets[a:a + chunk]
        if recompute:
            lp, ent = checkpoint(_head_chunk, h, weight, bias, t, entropy, allowed_token_ids, use_reentrant=False)
        else:
            lp, ent = _head_chunk(h, weight, bias, t, entropy, allowed_token_ids)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(lps), torch.cat(ents)


def loss_positions(mask: torch.Tensor) -> torch.Tensor:
    """Indices of the positions whose target is scored (mask > 0); position 0 when there is none, so a
    zero-weight filler micro-batch still has a graph through the model (every rank runs a backward)."""
    pos = torch.nonzero(mask > 0, as_tuple=False).squeeze(-1)
    return pos if pos.numel() else torch.zeros(1, dtype=torch.long, device=mask.device)


def at_positions(values: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    """A [length] float32 tensor holding `values` at `positions` and 0 elsewhere (differentiable)."""
    out = torch.zeros(length, dtype=torch.float32, device=values.device)
    return out.scatter(0, positions, values.float())


def masked_logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                                entropy: str = "stat", allowed_token_ids: Sequence[int] = (),
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob, entropy) [T] from full logits [T, V], computed only at the loss positions (mask > 0)."""
    pos = loss_positions(mask)
    lp, ent = token_logprobs(logits[pos], targets[pos], entropy_grad=entropy == "grad",
                             allowed_token_ids=allowed_token_ids)
    if entropy == "none":
        ent = torch.zeros_like(ent)
    return at_positions(lp, pos, len(targets)), at_positions(ent, pos, len(targets))


@contextlib.contextmanager
def loss_position_head(model: torch.nn.Module, positions: torch.Tensor, targets: torch.Tensor, chunk: int,
                       entropy: str, allowed_token_ids: Sequence[int] = ()) -> Iterator[dict]:
    """While active, `model(...)`'s output head returns chunked (logprob, entropy) at `positions` of the
    packed row (targets [T]) instead of logits; they land in the yielded dict ("logp", "entropy", each
    [len(positions)]). The head must be a linear layer (weight [V, H], optional bias) whose output the
    model returns unchanged (no logit scaling or soft-capping)."""
    head = model.get_output_embeddings()
    box: dict = {}

    def pre(mod, args):
        hidden = args[0]
        box["hidden"] = hidden
        return (hidden[..., :0, :],)

    def post(mod, args, out):
        hidden = box.pop("hidden")[0]  # [T, H] of the one packed row
        box["logp"], box["entropy"] = chunked_token_logprobs(hidden[positions], mod.weight, mod.bias,
                                                             targets[positions], chunk, entropy,
                                                             allowed_token_ids)
        return out

    handles = [head.register_forward_pre_hook(pre), head.register_forward_hook(post)]
    try:
        yield box
    finally:
        for h in handles:
            h.remove()


def head_supports_chunking(model: torch.nn.Module) -> bool:
    """True when the model's logits are exactly its output head's linear map (no scaling/soft-capping)."""
    cfg = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (isinstance(head, torch.nn.Linear) and getattr(cfg, "final_logit_softcapping", None) is None
            and getattr(cfg, "logit_scale", None) in (None, 1.0) and getattr(cfg, "logits_scaling", None) in (None, 1.0))
