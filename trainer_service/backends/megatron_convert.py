"""Hugging Face <-> Megatron-Core weight layouts for Llama-family decoders (Llama, Qwen2, Mistral):
pure tensor code, no Megatron import, tested on CPU (tests/trainer/test_trainer_megatron_convert.py).

Megatron GPTModel (tensor parallel 1) names and fuses differently:
  model.embed_tokens.weight                 -> embedding.word_embeddings.weight
  layers.i.input_layernorm.weight           -> decoder.layers.i.input_layernorm.weight          (local spec)
                                               decoder.layers.i.self_attention.linear_qkv.layer_norm_weight (TE)
  layers.i.self_attn.{q,k,v}_proj.{weight,bias} -> decoder.layers.i.self_attention.linear_qkv.{weight,bias}
      fused per query group g (num_key_value_heads groups): [q heads of g; k_g; v_g] stacked on dim 0
  layers.i.self_attn.o_proj.weight          -> decoder.layers.i.self_attention.linear_proj.weight
  layers.i.post_attention_layernorm.weight  -> decoder.layers.i.pre_mlp_layernorm.weight        (local spec)
                                               decoder.layers.i.mlp.linear_fc1.layer_norm_weight (TE)
  layers.i.mlp.{gate,up}_proj.weight        -> decoder.layers.i.mlp.linear_fc1.weight = [gate; up]
  layers.i.mlp.down_proj.weight             -> decoder.layers.i.mlp.linear_fc2.weight
  model.norm.weight                         -> decoder.final_layernorm.weight
  lm_head.weight                            -> output_layer.weight (absent when embeddings are tied)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayoutSpec:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool = False
    te: bool = False  # Transformer Engine spec: layernorms fused into linear_qkv / linear_fc1

    @classmethod
    def from_hf(cls, c, te: bool = False) -> LayoutSpec:
        if getattr(c, "model_type", "") not in ("llama", "qwen2", "mistral"):
            raise ValueError(f"megatron backend: model_type {getattr(c, 'model_type', '?')!r} is not supported; "
                             f"supported: llama, qwen2, mistral")
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                   c.num_key_value_heads or c.num_attention_heads, head_dim,
                   bool(getattr(c, "tie_word_embeddings", False)), te)


def _ln_names(i: int, te: bool) -> tuple[str, str]:
    p = f"decoder.layers.{i}."
    if te:
        return p + "self_attention.linear_qkv.layer_norm_weight", p + "mlp.linear_fc1.layer_norm_weight"
    return p + "input_layernorm.weight", p + "pre_mlp_layernorm.weight"


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: LayoutSpec) -> torch.Tensor:
    """[q; k; v] in HF layout (rows = heads x head_dim) -> Megatron's per-group interleaved rows."""
    g, per = s.num_kv_heads, s.num_heads // s.num_kv_heads
    rest = q.shape[1:]
    qg = q.reshape(g, per * s.head_dim, *rest)
    kg = k.reshape(g, s.head_dim, *rest)
    vg = v.reshape(g, s.head_dim, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, s: LayoutSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, per = s.num_kv_heads, s.num_heads // s.num_kv_heads
    rest = qkv.shape[1:]
    x = qkv.reshape(g, (per + 2) * s.head_dim, *rest)
    q, k, v = torch.split(x, [per * s.head_dim, s.head_dim, s.head_dim], dim=1)
    return (q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest))


def hf_to_megatron(sd: dict[str, torch.Tensor], s: LayoutSpec) -> dict[str, torch.Tensor]:
    out = {"embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": sd["model.norm.weight"]}
    if not s.tied:
        out["output_layer.weight"] = sd["lm_head.weight"]
    for i in range(s.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        ln1, ln2 = _ln_names(i, s.te)
        out[ln1] = sd[h + "input_layernorm.weight"]
        out[ln2] = sd[h + "post_attention_layernorm.weight"]
        a = h + "self_attn."
        out[m + "self_attention.linear_qkv.weight"] = fuse_qkv(sd[a + "q_proj.weight"], sd[a + "k_proj.weight"],
                                                               sd[a + "v_proj.weight"], s)
        if a + "q_proj.bias" in sd:
            out[m + "self_attention.linear_qkv.bias"] = fuse_qkv(sd[a + "q_proj.bias"], sd[a + "k_proj.bias"],
                                                                 sd[a + "v_proj.bias"], s)
        out[m + "self_attention.linear_proj.weight"] = sd[a + "o_proj.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat([sd[h + "mlp.gate_proj.weight"], sd[h + "mlp.up_proj.weight"]])
        out[m + "mlp.linear_fc2.weight"] = sd[h + "mlp.down_proj.weight"]
    return out


def megatron_to_hf(sd: dict[str, torch.Tensor], s: LayoutSpec) -> dict[str, torch.Tensor]:
    """Inverse of hf_to_megatron; ignores Megatron's `_extra_state` entries."""
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"],
           "model.norm.weight": sd["decoder.final_layernorm.weight"]}
    if not s.tied:
        out["lm_head.weight"] = sd["output_layer.weight"]
    for i in range(s.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        ln1, ln2 = _ln_names(i, s.te)
        out[h + "input_layernorm.weight"] = sd[ln1]
        out[h + "post_attention_layernorm.weight"] = sd[ln2]
        a = h + "self_attn."
        q, k, v = split_qkv(sd[m + "self_attention.linear_qkv.weight"], s)
        out[a + "q_proj.weight"], out[a + "k_proj.weight"], out[a + "v_proj.weight"] = q, k, v
        if m + "self_attention.linear_qkv.bias" in sd:
            q, k, v = split_qkv(sd[m + "self_attention.linear_qkv.bias"], s)
            out[a + "q_proj.bias"], out[a + "k_proj.bias"], out[a + "v_proj.bias"] = q, k, v
        out[a + "o_proj.weight"] = sd[m + "self_attention.linear_proj.weight"]
        gate, up = torch.chunk(sd[m + "mlp.linear_fc1.weight"], 2, dim=0)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
        out[h + "mlp.down_proj.weight"] = sd[m + "mlp.linear_fc2.weight"]
    return out


def transformer_config_kwargs(c) -> dict:
    """TransformerConfig arguments matching a Llama/Qwen2 HF config."""
    import torch.nn.functional as F

    return dict(
        num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, ffn_hidden_size=c.intermediate_size,
        num_attention_heads=c.num_attention_heads, num_query_groups=c.num_key_value_heads or c.num_attention_heads,
        kv_channels=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        normalization="RMSNorm", layernorm_epsilon=c.rms_norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=getattr(c, "model_type", "") == "qwen2" or bool(
            getattr(c, "attention_bias", False)),
        hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False,
    )


def rope_base(c) -> float:
    rp = getattr(c, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(c, "rope_theta", 10000.0)))
