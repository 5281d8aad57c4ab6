"""Behaviour corrections (none/mask/truncate/seq_truncate/geo_mask/icepop) and the objectives
(ppo/gspo/cispo/iw_reinforce/reinforce) against hand-computed values, including the edges of the masks."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from torch.testing import assert_close

from shared.config.trainer import AlgorithmConfig
from trainer_service.algorithms.corrections import BEHAVIOUR_MODES, behaviour_weight
from trainer_service.algorithms.losses import OBJECTIVES, policy_terms


def logs(*xs: float) -> torch.Tensor:
    return torch.log(torch.tensor(xs, dtype=torch.float32))


# Two sequences: tokens 0-1 (prompt token 0 not scored) and 2-4. rho = pi_prox / pi_behav per token.
RHO = (9.0, 2.0, 4.0, 0.5, 1.0)
MASK = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0])
SEQ = torch.tensor([0, 0, 1, 1, 1])


def weight(mode: str, cap: float | None, floor: float | None = None):
    return behaviour_weight(logs(*RHO), torch.zeros(5), cap, mode, floor=floor, mask=MASK, seq_index=SEQ)


def test_none_is_one_everywhere():
    w, changed = weight("none", 5.0)
    assert_close(w, torch.ones(5))
    assert changed.sum() == 0


def test_token_mask_and_truncate_keep_the_cap_itself():
    prox, behav = logs(5.0, 5.0001, 0.1), torch.zeros(3)
    w, changed = behaviour_weight(prox, behav, 5.0, "mask")
    assert_close(w, torch.tensor([5.0, 0.0, 0.1]))  # exactly the cap passes; just above is masked
    assert changed.tolist() == [0.0, 1.0, 0.0]
    w, changed = behaviour_weight(prox, behav, 5.0, "truncate")
    assert_close(w, torch.tensor([5.0, 5.0, 0.1]))
    assert changed.tolist() == [0.0, 1.0, 0.0]


def test_sequence_truncated_is_uses_the_product_over_loss_tokens_only():
    # seq 0: only token 1 is a loss token -> 2 (the 9 of the prompt position is ignored)
    # seq 1: 4 * 0.5 * 1 = 2; with cap 1.5 both are truncated to 1.5
    w, changed = weight("seq_truncate", 10.0)
    assert_close(w, torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0]))
    assert changed.sum() == 0
    w, changed = weight("seq_truncate", 1.5)
    assert_close(w, torch.full((5,), 1.5))
    assert changed.tolist() == [1.0] * 5
    w, _ = weight("seq_truncate", None)  # no cap: the plain sequence weight
    assert_close(w, torch.full((5,), 2.0))


def test_geometric_mean_mask_rejects_whole_sequences_outside_the_band():
    # geometric means: seq 0 = 2; seq 1 = (4 * 0.5 * 1)^(1/3) = 2^(1/3) = 1.2599
    w, changed = weight("geo_mask", 1.3, floor=0.9)
    assert_close(w, torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0]))
    assert changed.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    w, _ = weight("geo_mask", 1.25, floor=0.9)  # 1.2599 > 1.25: rejected too
    assert w.sum() == 0
    w, _ = weight("geo_mask", 2.0, floor=1.26)  # below the floor: rejected; seq 0 sits exactly on the cap
    assert_close(w, torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0]))
    w, _ = weight("geo_mask", 2.0 ** (1 / 3) * 1.0001)  # floor None = 1/cap = 0.79: seq 1 in, seq 0 (2) out
    assert_close(w, torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0]))


def test_icepop_keeps_rho_inside_the_band_and_zeroes_it_outside_edges_included():
    w, changed = weight("icepop", 4.0, floor=0.5)
    # 9 > 4 masked; 2 kept; 4 == cap kept; 0.5 == floor kept; 1 kept
    assert_close(w, torch.tensor([0.0, 2.0, 4.0, 0.5, 1.0]))
    assert changed.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    w, _ = weight("icepop", 3.9, floor=0.6)
    assert_close(w, torch.tensor([0.0, 2.0, 0.0, 0.0, 1.0]))
    w, _ = weight("icepop", 4.0)  # floor None = 1/4: 0.5 kept
    assert_close(w, torch.tensor([0.0, 2.0, 4.0, 0.5, 1.0]))


def test_band_modes_need_a_cap_and_unknown_modes_name_the_field():
    with pytest.raises(ValueError, match="behav_imp_weight_cap"):
        weight("icepop", None)
    with pytest.raises(ValueError, match="behav_imp_weight_mode"):
        weight("clip", 2.0)
    assert set(BEHAVIOUR_MODES) == {"none", "mask", "truncate", "seq_truncate", "geo_mask", "icepop"}


def test_config_checks_the_band():
    with pytest.raises(ValidationError, match="behav_imp_weight_cap"):
        AlgorithmConfig(behav_imp_weight_mode="geo_mask", behav_imp_weight_cap=None)
    with pytest.raises(ValidationError, match="behav_imp_weight_floor"):
        AlgorithmConfig(behav_imp_weight_mode="icepop", behav_imp_weight_cap=2.0, behav_imp_weight_floor=3.0)
    with pytest.raises(ValidationError, match="objective"):
        AlgorithmConfig(objective="trpo")
    assert AlgorithmConfig(objective="gspo", behav_imp_weight_mode="seq_truncate").objective == "gspo"


def terms(objective: str, lp, prox, behav=None, adv=None, mask=None, seq=None, **kw):
    n = lp.shape[0]
    return policy_terms(objective, lp, prox, prox if behav is None else behav,
                        torch.ones(n) if adv is None else adv, mask=mask, seq_index=seq, **kw)


def test_gspo_clips_on_the_sequence_geometric_mean_ratio():
    # seq 0: ratios 1.5 and 1.5/1.5... use log r = (log 2, 0) -> geometric mean sqrt(2) = 1.4142
    # seq 1: log r = (log 1.1, log 1/1.1) -> geometric mean 1 (each token's own ratio is ignored)
    lp = logs(2.0, 1.0, 1.1, 1 / 1.1)
    prox = torch.zeros(4)
    seq = torch.tensor([0, 0, 1, 1])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    t = terms("gspo", lp, prox, adv=adv, seq=seq, eps_clip=0.2)
    # A>0, s=1.414 > 1.2 -> -1.2 (clipped) on both tokens; A<0, s=1 -> +1 on both
    assert_close(t.loss, torch.tensor([-1.2, -1.2, 1.0, 1.0]))
    assert t.clipped.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_gspo_gradient_is_the_sequence_ratio_times_each_token_score():
    lp = logs(1.1, 1.0, 1.0).requires_grad_()
    seq = torch.tensor([0, 0, 1])
    adv = torch.tensor([1.0, 1.0, 1.0])
    t = terms("gspo", lp, torch.zeros(3), adv=adv, seq=seq, eps_clip=0.2)
    t.loss.sum().backward()
    s0 = math.sqrt(1.1)  # geometric mean of (1.1, 1.0), inside the clip range
    assert_close(lp.grad, torch.tensor([-s0, -s0, -1.0]))


def test_gspo_with_one_token_sequences_is_ppo():
    torch.manual_seed(0)
    lp, prox, adv = torch.randn(6) * 0.3, torch.randn(6) * 0.3, torch.randn(6)
    seq = torch.arange(6)
    assert_close(terms("gspo", lp, prox, adv=adv, seq=seq).loss, terms("ppo", lp, prox, adv=adv, seq=seq).loss)


def test_cispo_keeps_a_gradient_on_clipped_tokens_with_a_clipped_weight():
    lp = logs(1.5, 1.1, 0.5).requires_grad_()
    t = terms("cispo", lp, torch.zeros(3), eps_clip=0.2, eps_clip_high=0.28)
    # loss = -sg(clip(r, 0.8, 1.28)) * A * log pi
    assert_close(t.loss, -torch.tensor([1.28, 1.1, 0.8]) * lp.detach())
    assert t.clipped.tolist() == [1.0, 0.0, 1.0]
    t.loss.sum().backward()
    assert_close(lp.grad, -torch.tensor([1.28, 1.1, 0.8]))


def test_iw_reinforce_is_the_unclipped_weighted_ratio():
    lp = logs(1.5, 0.5).requires_grad_()
    behav = logs(0.5, 1.0)  # rho = prox/behav = 2 and 1 (prox logp 0)
    t = terms("iw_reinforce", lp, torch.zeros(2), behav=behav, adv=torch.tensor([1.0, -2.0]),
              cap=5.0, mode="truncate")
    assert_close(t.loss, torch.tensor([-2.0 * 1.5, 2.0 * 0.5]))
    t.loss.sum().backward()
    assert_close(lp.grad, torch.tensor([-2.0 * 1.5, 2.0 * 0.5]))
    assert t.clipped.sum() == 0


def test_reinforce_ignores_the_behaviour_policy_entirely():
    lp = logs(0.5, 0.25).requires_grad_()
    behav = logs(0.01, 0.9)  # wildly off: no effect
    t = terms("reinforce", lp, torch.zeros(2), behav=behav, adv=torch.tensor([1.0, -1.0]), cap=2.0, mode="mask")
    assert_close(t.loss, torch.tensor([-math.log(0.5), math.log(0.25)]))
    assert_close(t.behav_weight, torch.ones(2))
    t.loss.sum().backward()
    assert_close(lp.grad, torch.tensor([-1.0, 1.0]))


def test_every_objective_multiplies_by_the_behaviour_weight_except_reinforce():
    lp, prox = torch.zeros(2), torch.zeros(2)
    behav = logs(0.5, 0.5)  # rho = 2
    for obj in OBJECTIVES:
        t = terms(obj, lp, prox, behav=behav, cap=5.0, mode="mask")
        expected = 0.0 if obj in ("cispo", "reinforce") else -2.0  # log pi = 0 for cispo / reinforce
        assert_close(t.loss, torch.full((2,), expected), msg=obj)
        assert_close(t.behav_weight, torch.full((2,), 1.0 if obj == "reinforce" else 2.0), msg=obj)


def test_unknown_objective_names_the_field():
    with pytest.raises(ValueError, match="objective"):
        terms("a2c", torch.zeros(1), torch.zeros(1))


def test_the_step_applies_sequence_corrections_per_packed_sequence():
    """Through trainer_service/step.py on the tiny policy: two sequences packed in one micro-batch, the
    first generated by a policy 3x less likely on each token (rho = 3), the second by the current one.
    geo_mask with band [0.5, 2] rejects exactly the first sequence's tokens; icepop the same tokens."""
    import numpy as np

    from shared.config import JetrlConfig, load_config
    from trainer_service.backends.fsdp import FSDPBackend
    from trainer_service.packing import TrainItem, pack
    from trainer_service.step import train_step

    torch.manual_seed(0)
    # lr tiny: the steps must not move pi_prox away from the logprobs the items were built from
    cfg = load_config(JetrlConfig, None, ["trainer.device=cpu", "trainer.optim.lr=1e-9"])
    backend = FSDPBackend(cfg)
    rng = np.random.default_rng(0)
    items = []
    for gen_len, shift in ((4, math.log(3.0)), (2, 0.0)):
        toks = rng.integers(4, 40, size=6 + gen_len).astype(np.int32)
        mask = np.array([0] * 6 + [1] * gen_len, np.uint8)
        lp, _ = backend.forward(pack([TrainItem(tokens=toks, loss_mask=mask, behav_logp=np.zeros(len(toks)),
                                                advantage=0.0)]))
        # position t of the packed row scores token t+1: behav_logp[t+1] = logp[t] - shift
        behav = np.concatenate([[0.0], lp.detach().numpy()[:-1] - shift]).astype(np.float32) * mask
        items.append(TrainItem(tokens=toks, loss_mask=mask, behav_logp=behav, advantage=1.0))
    for mode, objective in (("geo_mask", "ppo"), ("icepop", "gspo"), ("geo_mask", "cispo")):
        c = cfg.trainer.model_copy(deep=True)
        c.algorithm = AlgorithmConfig(behav_imp_weight_mode=mode, behav_imp_weight_cap=2.0,
                                      behav_imp_weight_floor=0.5, objective=objective)
        stats = train_step(backend, items, c, norm_length=4)
        assert stats["capped_frac"] == pytest.approx(4 / 6, abs=1e-6), (mode, objective)
        assert math.isfinite(stats["loss"])
    c.algorithm = AlgorithmConfig(objective="reinforce")
    assert train_step(backend, items, c, norm_length=4)["behav_weight_mean"] == pytest.approx(1.0)
