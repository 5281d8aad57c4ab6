"""Variable-length ("varlen") attention for packed rows without flash-attention: a transformers
attention function that runs causal SDPA on each packed sequence separately, using the
`cu_seq_lens_q` boundaries the trainer passes to the model (the same kwargs flash-attention's varlen
path reads). Attention cost is sum(L_i^2) instead of T^2 with a block-diagonal mask.

Registered as attn_implementation "jetrl_varlen" (AttentionInterface + a mask function that builds
nothing, since boundaries come from cu_seq_lens_q).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "jetrl_varlen"
_registered = False


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, cu_seq_lens_q: torch.Tensor | None = None, **kwargs):
    """query [1, H, T, D], key/value [1, Hkv, T, D] -> ([1, T, H, D], None)."""
    if attention_mask is not None:
        raise ValueError(f"{NAME} attention takes no padding mask: pack sequences instead")
    if query.shape[0] != 1 and cu_seq_lens_q is not None:
        raise ValueError(f"{NAME} attention expects one packed row, got batch {query.shape[0]}")
    # Without boundaries: unpadded rows, plain causal attention per row.
    bounds = cu_seq_lens_q.tolist() if cu_seq_lens_q is not None else [0, query.shape[2]]
    gqa = query.shape[1] != key.shape[1]
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        outs.append(F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling,
            dropout_p=dropout if module.training else 0.0, enable_gqa=gqa))
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    return None


def register() -> str:
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(NAME, varlen_attention_forward)
        AttentionMaskInterface.register(NAME, _no_mask)
        _registered = True
    return NAME
