"""Variable-length ("varlen") attention for packed rows without flash-attention: a transformers
attention function that runs causal SDPA on each packed sequence separately, using the
`cu_seq_lens_q` boundaries the trainer passes to the model (the same kwargs flash-attention's varlen
path reads). Attention cost is sum(L_i^2) instead of T^2 with a block-diagonal mask.

Registered as attn_implementation "jetrl_varlen" (AttentionInterface + a mask function that builds
nothing, since boundaries come from cu_seq_lens_q).

Shared-prompt rows (packing.pack_shared) pass `jetrl_segments` instead: per segment a prefix of S
tokens then branches; the prefix attends causally to itself, and each branch's queries attend to
[prefix keys, own keys] with a mask that is all-true over the prefix and causal over the branch
(one SDPA call per branch, cost sum L_b (S + L_b)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "jetrl_varlen"
_registered = False


def _shared_prefix_attention(query, key, value, segments, scaling, dropout_p, gqa) -> torch.Tensor:
    outs = []
    for start, s, branches in segments:
        if s:
            p = slice(start, start + s)
            outs.append(F.scaled_dot_product_attention(query[:, :, p], key[:, :, p], value[:, :, p], is_causal=True,
                                                       scale=scaling, dropout_p=dropout_p, enable_gqa=gqa))
        a = start + s
        for n in branches:
            b = slice(a, a + n)
            if not s:
                outs.append(F.scaled_dot_product_attention(query[:, :, b], key[:, :, b], value[:, :, b],
                                                           is_causal=True, scale=scaling, dropout_p=dropout_p,
                                                           enable_gqa=gqa))
            else:
                mask = torch.ones(n, s + n, dtype=torch.bool, device=query.device)
                mask[:, s:] = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
                k = torch.cat([key[:, :, start:start + s], key[:, :, b]], dim=2)
                v = torch.cat([value[:, :, start:start + s], value[:, :, b]], dim=2)
                outs.append(F.scaled_dot_product_attention(query[:, :, b], k, v, attn_mask=mask, scale=scaling,
                                                           dropout_p=dropout_p, enable_gqa=gqa))
            a += n
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                             jetrl_segments=None, **kwargs):
    """query [1, H, T, D], key/value [1, Hkv, T, D] -> ([1, T, H, D], None)."""
    if attention_mask is not None:
        raise ValueError(f"{NAME} attention takes no padding mask: pack sequences instead")
    if query.shape[0] != 1 and (cu_seq_lens_q is not None or jetrl_segments is not None):
        raise ValueError(f"{NAME} attention expects one packed row, got batch {query.shape[0]}")
    gqa = query.shape[1] != key.shape[1]
    dropout_p = dropout if module.training else 0.0
    if jetrl_segments is not None:
        out = _shared_prefix_attention(query, key, value, jetrl_segments, scaling, dropout_p, gqa)
        return out.transpose(1, 2).contiguous(), None
    # Without boundaries: unpadded rows, plain causal attention per row.
    bounds = cu_seq_lens_q.tolist() if cu_seq_lens_q is not None else [0, query.shape[2]]
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        outs.append(F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling,
            dropout_p=dropout_p, enable_gqa=gqa))
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
