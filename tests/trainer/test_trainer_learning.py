"""End to end through the trainer's algorithm and step code: the tiny policy learns the maxdigit task
(sample from the current policy -> score -> GRPO/decoupled PPO step), on a fixed prompt set."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from maxdigit_loop import make_prompt, reference_nll, rl_step

from shared.config import JetrlConfig, load_config
from trainer_service.backends.fsdp import FSDPBackend


@pytest.mark.slow
def test_tiny_policy_reward_goes_up_and_reference_answer_loss_goes_down():
    cfg = load_config(JetrlConfig, None, ["trainer.optim.lr=1e-2", "trainer.device=cpu"])
    torch.set_num_threads(2)
    backend = FSDPBackend(cfg)
    rng = np.random.default_rng(0)
    pairs = [make_prompt(rng) for _ in range(16)]
    prompts, refs = [p for p, _ in pairs], [r for _, r in pairs]
    gen = torch.Generator().manual_seed(0)
    nll_before = reference_nll(backend.model, backend.tokenizer, prompts, refs)
    rewards, losses = [], []
    for version in range(7):
        s = rl_step(backend, cfg, prompts, refs, version, gen)
        rewards.append(s["reward_mean"])
        losses.append(s["loss"])
    nll_after = reference_nll(backend.model, backend.tokenizer, prompts, refs)
    assert all(np.isfinite(losses))
    # A random policy almost never answers with the right digit (1 of ~90 tokens).
    assert rewards[0] < 0.05
    assert np.mean(rewards[-2:]) > rewards[0] + 0.1, rewards
    assert nll_after < nll_before - 0.5, (nll_before, nll_after)
