"""HF <-> Megatron-Core weight layouts (pure tensor code, CPU), checked against Megatron's own modules
where megatron-core runs on CPU (building GPTModel, its QKV split and its MLP)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from ci_gate import need_module
from torch.testing import assert_close

from shared.config import JetrlConfig
from shared.model.tinymodel import build_tiny_model
from shared.runtime.natsd import free_port
from trainer_service.backends.megatron_convert import (
    LayoutSpec,
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
    rope_base,
    split_qkv,
    transformer_config_kwargs,
)


def _tiny(heads=4, kv_heads=None, **kw):
    cfg = JetrlConfig().model
    cfg.tiny_heads = heads
    model, _ = build_tiny_model(cfg)
    if kv_heads:  # grouped-query attention variant of the same tiny Qwen2
        from transformers import AutoModelForCausalLM

        c = model.config
        c.num_key_value_heads = kv_heads
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(c)
    return model


def test_qkv_fusion_interleaves_query_groups_by_hand():
    # 4 query heads, 2 kv groups, head_dim 1, hidden 1: rows q0 q1 q2 q3 / k0 k1 / v0 v1
    s = LayoutSpec(num_layers=1, hidden=1, num_heads=4, num_kv_heads=2, head_dim=1)
    q = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    k = torch.tensor([[10.0], [11.0]])
    v = torch.tensor([[20.0], [21.0]])
    fused = fuse_qkv(q, k, v, s)
    assert fused.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    for a, b in zip(split_qkv(fused, s), (q, k, v), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_hf_megatron_round_trip_is_exact(kv_heads):
    hf = _tiny(kv_heads=kv_heads)
    spec = LayoutSpec.from_hf(hf.config)
    sd = hf.state_dict()
    for te in (False, True):
        s = LayoutSpec(**{**spec.__dict__, "te": te})
        back = megatron_to_hf(hf_to_megatron(sd, s), s)
        assert set(back) == set(sd)
        for k, v in sd.items():
            assert torch.equal(back[k], v), k


def test_unsupported_model_family_is_named():
    c = _tiny().config
    c.model_type = "gpt2"
    with pytest.raises(ValueError, match="gpt2"):
        LayoutSpec.from_hf(c)


@pytest.fixture(scope="module")
def megatron_cpu():
    need_module("megatron.core", "megatron-core, dev extra")
    warnings.filterwarnings("ignore")
    import torch.distributed as dist
    from megatron.core import parallel_state

    started = False
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
        started = True
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_converted_weights_load_into_megatron_gptmodel_and_match_hf_projections(megatron_cpu, kv_heads):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    hf = _tiny(kv_heads=kv_heads)
    c = hf.config
    tc = TransformerConfig(**transformer_config_kwargs(c), use_cpu_initialization=True)
    m = GPTModel(tc, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=c.vocab_size,
                 max_sequence_length=c.max_position_embeddings, position_embedding_type="rope",
                 rotary_base=int(rope_base(c)), share_embeddings_and_output_weights=False)
    spec = LayoutSpec.from_hf(c)
    missing, unexpected = m.load_state_dict(hf_to_megatron(hf.state_dict(), spec), strict=False)
    assert [k for k in missing if not k.endswith("_extra_state")] == [] and unexpected == []
    # Megatron's own QKV split of the fused weight gives HF's q, k, v projections.
    x = torch.randn(5, 1, c.hidden_size)
    layer, hl = m.decoder.layers[0], hf.model.layers[0]
    with torch.no_grad():
        q, k, v = layer.self_attention.get_query_key_value_tensors(x, None)
        assert_close(q.reshape(5, 1, -1), hl.self_attn.q_proj(x))
        assert_close(k.reshape(5, 1, -1), hl.self_attn.k_proj(x))
        assert_close(v.reshape(5, 1, -1), hl.self_attn.v_proj(x))
        out, _ = layer.mlp(x)
        assert_close(out, hl.mlp(x), rtol=1e-5, atol=1e-6)
        assert_close(layer.input_layernorm(x), hl.input_layernorm(x))
    # and back to HF exactly
    back = megatron_to_hf({k: v for k, v in m.state_dict().items() if not k.endswith("_extra_state")}, spec)
    for key, val in hf.state_dict().items():
        assert torch.equal(back[key], val), key
