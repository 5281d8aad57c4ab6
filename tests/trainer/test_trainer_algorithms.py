"""Advantages, the decoupled PPO objective, normalisation and staleness rules vs hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from shared.contract.messages import Sample
from trainer_service.algorithms.advantages import group_advantages, grpo, rloo
from trainer_service.algorithms.losses import (
    behaviour_weight,
    decoupled_ppo_terms,
    entropy_from_logits,
    kl_k3,
    token_coefficients,
)
from trainer_service.algorithms.staleness import is_fresh, rewards_all_equal, staleness


def test_grpo_advantage_is_centred_and_divided_by_population_std():
    # rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +-1
    assert grpo([1.0, 0.0, 0.0, 1.0], eps=0.0) == [1.0, -1.0, -1.0, 1.0]
    # rewards 3, 1 -> mean 2, std 1 -> +1, -1 (eps shifts the denominator)
    assert grpo([3.0, 1.0], eps=1.0) == [0.5, -0.5]


def test_grpo_without_std_is_reward_minus_group_mean():
    assert group_advantages([[3.0, 1.0, 2.0]], "grpo_nostd") == [[1.0, -1.0, 0.0]]


def test_rloo_subtracts_the_mean_of_the_other_samples():
    # 4 - (1+1)/2 = 3; 1 - (4+1)/2 = -1.5
    assert rloo([4.0, 1.0, 1.0]) == [3.0, -1.5, -1.5]


def test_reinforce_uses_the_batch_mean_as_baseline():
    # batch mean of [1, 0] and [1, 1, 1] = 4/5 = 0.8
    out = group_advantages([[1.0, 0.0], [1.0, 1.0, 1.0]], "reinforce")
    assert out[0] == pytest.approx([0.2, -0.8])
    assert out[1] == pytest.approx([0.2, 0.2, 0.2])


def test_single_sample_groups_get_zero_group_relative_advantage():
    for est in ("grpo", "grpo_nostd", "rloo"):
        assert group_advantages([[5.0]], est) == [[0.0]]


def test_unknown_estimator_names_the_field():
    with pytest.raises(ValueError, match="adv_estimator"):
        group_advantages([[1.0]], "ppo")


def test_decoupled_objective_equals_standard_ppo_when_proximal_is_behaviour():
    torch.manual_seed(0)
    logp = torch.randn(50) * 0.3 - 1.0
    old = logp + torch.randn(50) * 0.2
    adv = torch.randn(50)
    t = decoupled_ppo_terms(logp, old, old, adv, eps_clip=0.2, behav_imp_weight_cap=5.0)
    ratio = torch.exp(logp - old)
    ppo = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2))
    assert_close(t.loss, ppo, rtol=0, atol=1e-7)
    assert_close(t.behav_weight, torch.ones(50))


def test_clip_takes_effect_only_outside_the_trust_region_in_the_advantage_direction():
    lp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1]))  # ratios vs prox logp 0
    prox = torch.zeros(5)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    t = decoupled_ppo_terms(lp, prox, prox, adv, eps_clip=0.2)
    # A>0, r=1.5: min(1.5, 1.2) -> loss -1.2 (clipped); A<0, r=1.5: loss 1.5 (unclipped, pessimistic)
    # A>0, r=0.5: loss -0.5 (unclipped); A<0, r=0.5: max(0.5, 0.8) -> 0.8 (clipped); r=1.1 inside: -1.1
    assert_close(t.loss, torch.tensor([-1.2, 1.5, -0.5, 0.8, -1.1]))
    assert t.clipped.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_clip_high_widens_only_the_upper_bound():
    lp = torch.log(torch.tensor([1.5, 0.5]))
    prox = torch.zeros(2)
    t = decoupled_ppo_terms(lp, prox, prox, torch.tensor([1.0, -1.0]), eps_clip=0.2, eps_clip_high=0.28)
    assert_close(t.loss, torch.tensor([-1.28, 0.8]))


def test_clipped_tokens_have_zero_gradient():
    lp = torch.log(torch.tensor([1.5, 1.1])).requires_grad_()
    t = decoupled_ppo_terms(lp, torch.zeros(2), torch.zeros(2), torch.ones(2), eps_clip=0.2)
    t.loss.sum().backward()
    # d(-r)/d logp = -r for the unclipped token, 0 for the clipped one
    assert_close(lp.grad, torch.tensor([0.0, -1.1]))


def test_behaviour_weight_cap_masks_or_truncates_only_tokens_above_it():
    prox = torch.log(torch.tensor([1.0, 2.0, 6.0]))
    behav = torch.zeros(3)
    w, capped = behaviour_weight(prox, behav, cap=5.0, mode="mask")
    assert_close(w, torch.tensor([1.0, 2.0, 0.0]))
    assert capped.tolist() == [0.0, 0.0, 1.0]
    w, _ = behaviour_weight(prox, behav, cap=5.0, mode="truncate")
    assert_close(w, torch.tensor([1.0, 2.0, 5.0]))
    w, capped = behaviour_weight(prox, behav, cap=None)
    assert_close(w, torch.tensor([1.0, 2.0, 6.0]))


def test_decoupled_loss_scales_by_behaviour_weight():
    # prox/behav = 2, ratio 1, A = 1 -> loss = 2 * (-1)
    t = decoupled_ppo_terms(torch.zeros(1), torch.zeros(1), torch.log(torch.tensor([0.5])), torch.ones(1))
    assert_close(t.loss, torch.tensor([-2.0]))


def test_token_sequence_and_fixed_normalisation_coefficients():
    lengths = [2, 4]
    assert token_coefficients(lengths, "token") == pytest.approx([1 / 6, 1 / 6])
    assert token_coefficients(lengths, "sequence") == pytest.approx([1 / 4, 1 / 8])
    assert token_coefficients(lengths, "fixed", norm_length=8) == pytest.approx([1 / 16, 1 / 16])
    assert token_coefficients([0, 3], "sequence") == pytest.approx([0.0, 1 / 3])
    with pytest.raises(ValueError, match="norm_length"):
        token_coefficients(lengths, "fixed")


def test_sequence_normalisation_is_mean_of_sequence_means():
    losses = [torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0, 2.0, 6.0])]
    c = token_coefficients([2, 4], "sequence")
    total = sum(float(x.sum()) * ci for x, ci in zip(losses, c, strict=True))
    assert total == pytest.approx((2.0 + 3.0) / 2)


def test_k3_kl_is_zero_at_equal_policies_and_matches_hand_value():
    lp = torch.tensor([-1.0, -1.0])
    ref = torch.tensor([-1.0, -1.0 + math.log(2.0)])
    # d = log 2: exp(d) - d - 1 = 2 - 0.6931 - 1
    assert_close(kl_k3(lp, ref), torch.tensor([0.0, 1.0 - math.log(2.0)]))


def test_entropy_of_uniform_logits_is_log_vocab():
    assert_close(entropy_from_logits(torch.zeros(3, 8)), torch.full((3,), math.log(8)))


def _sample(versions, mask):
    n = len(versions)
    return Sample(tokens=np.zeros(n, np.int32), loss_mask=np.array(mask, np.uint8),
                  logprobs=np.zeros(n, np.float32), versions=np.array(versions, np.int32))


def test_staleness_uses_the_oldest_generated_token_version_and_the_bound_is_inclusive():
    s = _sample([-1, -1, 3, 5, 4], [0, 0, 1, 1, 1])
    assert staleness(7, s) == 4
    assert is_fresh(7, s, max_staleness=4)
    assert not is_fresh(8, s, max_staleness=4)
    assert staleness(9, _sample([-1, -1], [0, 0])) == 0


def test_dynamic_filter_detects_groups_with_equal_rewards():
    assert rewards_all_equal([1.0, 1.0, 1.0])
    assert rewards_all_equal([0.0, 1e-9])
    assert not rewards_all_equal([0.0, 1.0])


def test_urgency_order_puts_the_oldest_generation_first_ties_in_arrival_order():
    from trainer_testlib import make_sample

    from trainer_service.algorithms.staleness import urgency_order

    rng = np.random.default_rng(0)
    groups = [[make_sample(rng, 3, 1.0)], [make_sample(rng, 1, 0.0), make_sample(rng, 5, 1.0)],
              [make_sample(rng, 2, 1.0)], [make_sample(rng, 1, 1.0)]]
    # oldest generated versions: 3, 1, 2, 1 -> the two 1s in arrival order, then 2, then 3
    assert urgency_order(groups) == [1, 3, 2, 0]
