"""The memory settings examples/smollm2_gsm8k.yaml uses for a pretrained model on CPU
(activation_checkpointing on, small micro-batches) change memory only, not the update: one optimizer
step of a tiny Llama-architecture model saved as a model dir (the SmolLM2 layout: tied embeddings,
grouped-query attention) gives the same weights with and without them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from transformers import LlamaConfig, LlamaForCausalLM

from shared.config import JetrlConfig
from shared.tinymodel import build_tokenizer, save_tokenizer
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem
from trainer_service.step import train_step


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))
    model.save_pretrained(d / "model", safe_serialization=True)
    save_tokenizer(tok, d / "tokenizer")
    return d


def _items() -> list[TrainItem]:
    rng = np.random.default_rng(3)
    items = []
    for k, n in enumerate((40, 75, 22, 61, 90, 33, 57, 48)):
        p = 12
        mask = np.array([0] * p + [1] * (n - p), np.uint8)
        items.append(TrainItem(tokens=rng.integers(4, 80, size=n).astype(np.int32), loss_mask=mask,
                               behav_logp=np.where(mask == 1, rng.uniform(-5, -3, size=n), 0.0).astype(np.float32),
                               advantage=float(rng.normal()), group_id=f"g{k // 4}"))
    return items


def _step(llama_dir, checkpointing: bool, micro_tokens: int) -> tuple[dict, dict]:
    cfg = JetrlConfig.model_validate({
        "model": {"path": str(llama_dir / "model"), "tokenizer": str(llama_dir / "tokenizer"), "dtype": "float32"},
        "trainer": {"device": "cpu", "activation_checkpointing": checkpointing, "micro_batch_tokens": micro_tokens,
                    "optim": {"lr": 0.01, "adam_eps": 1e-4, "grad_clip": 1.0}},
    })
    backend = FSDPBackend(cfg)
    stats = train_step(backend, _items(), cfg.trainer)
    return backend.full_state_dict(), stats


def test_checkpointing_and_small_micro_batches_give_the_same_step(llama_dir):
    torch.set_num_threads(1)
    base_sd, base = _step(llama_dir, checkpointing=False, micro_tokens=4096)
    small_sd, small = _step(llama_dir, checkpointing=True, micro_tokens=128)
    assert base["micro_batches"] == 1 and small["micro_batches"] >= 4
    assert small["loss_tokens"] == base["loss_tokens"]
    assert small["loss"] == pytest.approx(base["loss"], abs=1e-5)
    assert small["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-4)
    init = LlamaForCausalLM.from_pretrained(llama_dir / "model").state_dict()
    for k, v in base_sd.items():
        assert_close(small_sd[k], v, rtol=1e-4, atol=2e-5, msg=f"{k} differs")
    assert not torch.allclose(base_sd["model.embed_tokens.weight"], init["model.embed_tokens.weight"])
