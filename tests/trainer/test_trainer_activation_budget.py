"""Activation checkpointing chosen by size (trainer.activation_checkpointing: auto, the default): the
micro-batches whose estimated saved activations are over trainer.activation_memory_gb, and only those, run
checkpointed; a checkpointed micro-batch keeps no more than the bound computed from the model's shape; and
the step is the same as without checkpointing. Saved activations are counted with autograd's saved-tensor
hooks (what backward will read), not timed or sampled."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from trainer_testlib import save_tiny_llama

from shared.config import JetrlConfig
from trainer_service.activations import (
    checkpointed_bytes_per_token,
    saved_bytes_per_token,
    wants_checkpointing,
)
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem, pack
from trainer_service.step import micro_batches_for_rank, train_step


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-act"), intermediate_size=128, max_position_embeddings=1024)


def _backend(llama_dir, **trainer) -> FSDPBackend:
    return FSDPBackend(JetrlConfig.model_validate({
        "model": {"path": str(llama_dir / "model"), "tokenizer": str(llama_dir / "tokenizer"), "dtype": "float32"},
        "trainer": {"device": "cpu", "optim": {"lr": 0.01, "adam_eps": 1e-4}, **trainer}}))


def _item(n: int, prompt: int, seed: int, group: str = "") -> TrainItem:
    rng = np.random.default_rng(seed)
    mask = np.array([0] * prompt + [1] * (n - prompt), np.uint8)
    return TrainItem(tokens=rng.integers(4, 80, size=n).astype(np.int32), loss_mask=mask,
                     behav_logp=np.where(mask == 1, rng.uniform(-5, -3, size=n), 0.0).astype(np.float32),
                     advantage=float(rng.normal()), group_id=group)


def _long_batch() -> list[TrainItem]:
    """Two groups: four long samples (a long agent group, scaled down) and four short ones."""
    return ([_item(n, 20, k, "long") for k, n in enumerate((300, 260, 330, 280))]
            + [_item(n, 8, 10 + k, "short") for k, n in enumerate((30, 24, 36, 28))])


def saved_bytes(backend: FSDPBackend, m) -> int:
    """Bytes of the tensors the forward of micro-batch `m` saves for backward (parameters left out)."""
    seen: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in backend.model.parameters()}

    def keep(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        backend.forward(m.to(backend.device), grad=True)
    return sum(seen.values())


def test_the_estimate_bounds_what_a_forward_saves(llama_dir):
    """saved_bytes_per_token is an upper bound (within 25 %) of a plain forward's saved tensors per token,
    and a checkpointed forward keeps under checkpointed_bytes_per_token per token."""
    torch.set_num_threads(1)
    m = pack([_item(400, 20, 0)])
    plain = _backend(llama_dir, activation_checkpointing=False)
    hf = plain.hf_config()
    per, ckpt = saved_bytes_per_token(hf), checkpointed_bytes_per_token(hf)
    assert per == 3 * (10 * 48 + 4 * 128 + 2 * 16) * 4  # layers x (10 hidden + 4 intermediate + 2 kv) float32s
    # the head's chunked logprobs keep their inputs (hidden states at loss positions, targets) and results
    head = 400 * (48 + 4) * 4
    got = saved_bytes(plain, m)
    assert 0.75 * per * 400 <= got - head <= per * 400, (got, per * 400)
    checkpointed = saved_bytes(_backend(llama_dir, activation_checkpointing=True), m)
    assert checkpointed <= ckpt * 400 + head and checkpointed < got / 5


def test_auto_checkpoints_the_micro_batches_over_the_budget_and_the_step_is_the_same(llama_dir):
    torch.set_num_threads(1)
    per = saved_bytes_per_token(_backend(llama_dir).hf_config())
    # a budget of 320 tokens' activations; micro-batches of up to 400 tokens (first-fit decreasing, unshared):
    # 330+36+30, 300+28+24, 280, 260 -> the first two over the budget, the last two under it
    budget_tokens = 320
    trainer = {"activation_memory_gb": per * budget_tokens / 1e9, "micro_batch_tokens": 400,
               "shared_prompt_packing": False}
    auto = _backend(llama_dir, **trainer)
    assert auto.cfg.trainer.activation_checkpointing == "auto"  # the default
    micro = micro_batches_for_rank(_long_batch(), 400, 0, 1, lambda x: x)
    sizes = [m.num_tokens for m in micro]
    assert sorted(sizes) == [260, 280, 352, 396]
    over = [n for n in sizes if n > budget_tokens]
    assert [wants_checkpointing("auto", n, per, trainer["activation_memory_gb"]) for n in sizes] == \
        [n > budget_tokens for n in sizes]
    # the saved activations of each micro-batch stay within the bound from the config
    bound = max(budget_tokens * per, 400 * checkpointed_bytes_per_token(auto.hf_config())) + 400 * 52 * 4
    assert all(saved_bytes(auto, m) <= bound for m in micro)
    auto.checkpointed_micro_batches = 0
    auto.zero_grad()
    a = train_step(auto, _long_batch(), auto.cfg.trainer)
    assert auto.checkpointed_micro_batches == len(over)
    off = _backend(llama_dir, activation_checkpointing=False, **trainer)
    b = train_step(off, _long_batch(), off.cfg.trainer)
    assert off.checkpointed_micro_batches == 0 and a["micro_batches"] == b["micro_batches"] == len(sizes)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)
    sa, sb = auto.full_state_dict(), off.full_state_dict()
    for k, v in sb.items():
        assert_close(sa[k], v, rtol=1e-6, atol=1e-7, msg=f"{k} differs with checkpointing chosen by size")
