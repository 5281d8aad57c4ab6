"""The FSDP backend on a CUDA GPU as it trains by default there: bf16 autocast over float32 master weights,
shared-prompt packing, activation checkpointing. Never runs in CI (no GPU there); run with
`pytest -m gpu tests` on a CUDA machine (scripts/gpu_check.sh). The float32 equalities of shared-prompt
packing run on the GPU too (test_trainer_shared_prompts.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shared.config import JetrlConfig, load_config
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem, pack_shared
from trainer_service.step import train_step

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _items(seed: int = 0) -> list[TrainItem]:
    """Two groups of four completions behind a shared prompt, rewards that differ within each group."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(2):
        prompt = rng.integers(4, 60, size=9)
        for k in range(4):
            comp = rng.integers(4, 60, size=int(rng.integers(3, 10)))
            tokens = np.concatenate([prompt, comp]).astype(np.int32)
            mask = np.array([0] * len(prompt) + [1] * len(comp), np.uint8)
            out.append(TrainItem(tokens=tokens, loss_mask=mask,
                                 behav_logp=np.where(mask == 1, -3.5, 0).astype(np.float32),
                                 advantage=float((-1) ** k), coef=1.0, group_id=f"g{g}"))
    return out


def _backend(*overrides: str) -> FSDPBackend:
    torch.manual_seed(0)
    return FSDPBackend(load_config(JetrlConfig, None, ["trainer.device=cuda", *overrides]))


def test_bf16_forward_is_close_to_float32_and_the_step_trains():
    b16, b32 = _backend(), _backend("trainer.dtype=float32")
    assert b16.autocast_dtype is torch.bfloat16 and b32.autocast_dtype is None
    assert all(p.dtype == torch.float32 for p in b16.model.parameters())  # master weights stay float32
    m = pack_shared(_items()).to("cuda")
    lp16, _ = b16.forward(m)
    lp32, _ = b32.forward(m)
    mk = m.mask > 0
    assert lp16.dtype == torch.float32 and torch.isfinite(lp16[mk]).all()
    # bf16 keeps ~3 significant digits: the logprobs agree to a few hundredths, not to float32's 1e-5
    assert (lp16[mk] - lp32[mk]).abs().max() < 0.1
    before = {k: v.detach().clone() for k, v in b16.model.state_dict().items()}
    stats = train_step(b16, _items(), b16.cfg.trainer)
    assert np.isfinite(stats["loss"]) and stats["loss_tokens"] == int(mk.sum())
    assert all(p.grad is None for p in b16.model.parameters())  # freed after the optimizer step
    changed = [k for k, v in b16.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "the bf16 step changed no weight"
    sd = b16.full_state_dict()
    assert all(t.device.type == "cpu" for t in sd.values())  # what the publisher writes


def test_activation_checkpointing_gives_the_same_gradients_on_cuda():
    def grads(*overrides):
        b = _backend("trainer.dtype=float32", *overrides)
        m = pack_shared(_items(1)).to("cuda")
        b.zero_grad()
        lp, _ = b.forward(m, grad=True)
        b.backward((lp * m.mask * m.advantages).sum())
        return {n: p.grad.detach().clone() for n, p in b.model.named_parameters() if p.grad is not None}

    plain, ckpt = grads(), grads("trainer.activation_checkpointing=true")
    assert plain.keys() == ckpt.keys() and plain
    for k in plain:
        assert_close(ckpt[k], plain[k], rtol=1e-4, atol=1e-4, msg=f"{k} gradient differs")
